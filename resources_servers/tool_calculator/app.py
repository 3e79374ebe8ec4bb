"""tool_calculator: integer `multiply` and `add` tools; the task is a product (and sum) too large to do in one's head.

A task asks "What is 347 * 29?" (one call: `multiply`) or "What is 347 * 29 + 518?" (two calls, the second on
the first's result: `multiply`, then `add`). The reward is the final answer, checked exactly: the last integer
of the last assistant message must equal `expected_answer`. The row's `expected_calls` are the calls an expert
makes (kept for the verifier fields and for a scripted expert, `tasks.expert_script`); the reward does not
require them. No per-rollout state: the tools are pure functions of their arguments.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from nemo_gym.server import ResourcesServer, Session, VerifyRequest, VerifyResult, tool

_INTEGER = re.compile(r"-?\d[\d,]*")


class Call(BaseModel):
    name: str
    arguments: dict[str, int]


class CalculatorVerifyRequest(VerifyRequest):
    expected_answer: int
    expected_calls: list[Call] = []


def final_answer(response: dict[str, Any]) -> int | None:
    """The last integer (thousands commas allowed) of the trajectory's last assistant message; None without one."""
    output = response.get("output")
    messages = [item for item in output if isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") == "assistant"] if isinstance(output, list) else []
    if not messages:
        return None
    content = messages[-1].get("content")
    parts = content if isinstance(content, list) else []
    text = content if isinstance(content, str) else "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    found = _INTEGER.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def made_calls(response: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, parsed arguments or None when they are not a JSON object) of every function call, in order."""
    output = response.get("output")
    calls = []
    for item in output if isinstance(output, list) else []:
        if isinstance(item, dict) and item.get("type") == "function_call":
            try:
                arguments = json.loads(item.get("arguments") or "{}")
            except (TypeError, ValueError):  # not a JSON string (malformed input is scored, never a 500)
                arguments = None
            calls.append((str(item.get("name")), arguments if isinstance(arguments, dict) else None))
    return calls


class ToolCalculatorServer(ResourcesServer):
    """Calculator tools. Reward range: [0.0, 1.0], binary: 1.0 when the final answer is exactly `expected_answer`."""

    verify_request_type = CalculatorVerifyRequest

    @tool
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def verify(self, request: CalculatorVerifyRequest, session: Session) -> VerifyResult:
        """1.0 iff the final answer equals `expected_answer`; components: the answer and the share of the expected
        calls made (same name and arguments, any order)."""
        answer = final_answer(request.response)
        calls = made_calls(request.response)
        expected = [(c.name, c.arguments) for c in request.expected_calls]
        matched = sum(1 for call in expected if call in calls)
        correct = answer == request.expected_answer
        failure = None if correct else ("no_tool_call" if not calls else "no_answer" if answer is None else "wrong_answer")
        return VerifyResult(
            reward=float(correct), reward_components={"answer": float(correct), "calls": matched / len(expected) if expected else 0.0},
            extracted_answer=answer, num_tool_calls=len(calls), failure_reason=failure,
        )  # fmt: skip
