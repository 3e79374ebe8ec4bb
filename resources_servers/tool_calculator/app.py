"""tool_calculator: integer `multiply` and `add` tools; the task is a product (and sum) too large to do in one's head.

A task asks "What is 347 * 29?" (one call: `multiply`) or "What is 347 * 29 + 518?" (two calls, the second on
the first's result: `multiply`, then `add`). The reward is the final answer, checked exactly: the last integer
of the last assistant message with text (`Trajectory.final_text`) must equal `expected_answer`. The row's
`expected_calls` are the calls an expert
makes (kept for the verifier fields and for a scripted expert, `tasks.expert_script`); the reward does not
require them. No per-rollout state: the tools are pure functions of their arguments.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import Session

_INTEGER = re.compile(r"-?\d[\d,]*")


class Call(BaseModel):
    """A tool call: the tool's name and its arguments."""

    name: str
    arguments: dict[str, int]


class CalculatorVerifyRequest(VerifyRequest):
    """A `/verify` body: the row's task fields plus the rollout's `response`."""

    expected_answer: int = Field(description="the exact integer the final answer must be")
    expected_calls: list[Call] = Field(
        [], description="the calls an expert makes, in order (not required for the reward)"
    )


class CalculatorResult(VerifyResult):
    extracted_answer: int | None = Field(
        description="the last integer of the final assistant message; None without one"
    )
    num_tool_calls: int = Field(description="function calls in the trajectory")
    failure_reason: str | None = Field(description="None when correct, else no_tool_call, no_answer or wrong_answer")


def final_answer(trajectory: Trajectory) -> int | None:
    """The last integer (thousands commas allowed) of the trajectory's final assistant text; None without one."""
    found = _INTEGER.findall(trajectory.final_text)
    return int(found[-1].replace(",", "")) if found else None


def made_calls(trajectory: Trajectory) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, parsed arguments or None when they are not a JSON object) of every function call, in order."""
    return [(call.name, call.arguments) for call in trajectory.function_calls]


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

    async def verify(self, request: CalculatorVerifyRequest, session: Session) -> CalculatorResult:
        """1.0 iff the final answer equals `expected_answer`; components: the answer and the share of the expected
        calls made (same name and arguments, any order)."""
        trajectory = Trajectory.of(request.response)
        answer, calls = final_answer(trajectory), made_calls(trajectory)
        expected = [(c.name, c.arguments) for c in request.expected_calls]
        matched = sum(1 for call in expected if call in calls)
        correct = answer == request.expected_answer
        failure = (
            None if correct else ("no_tool_call" if not calls else "no_answer" if answer is None else "wrong_answer")
        )
        return CalculatorResult(
            reward=float(correct),
            reward_components={"answer": float(correct), "calls": matched / len(expected) if expected else 0.0},
            extracted_answer=answer,
            num_tool_calls=len(calls),
            failure_reason=failure,
        )
