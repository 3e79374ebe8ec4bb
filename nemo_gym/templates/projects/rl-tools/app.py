"""Questions about made-up planets, answered with tools: multi-turn RL, reward on the final answer.

The facts (`data/planets.json`) are invented, so the policy cannot know them: it has to call `lookup` for each
planet it needs and may call `calculator` to combine the numbers, then answer. The reward reads only the final
answer; the tool calls are the policy's way there.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path
from typing import Any

from nemo_gym.env.answers import last_assistant_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving.server import Session

PLANETS: dict[str, dict[str, float]] = json.loads((Path(__file__).parent / "data" / "planets.json").read_text())
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e15  # larger intermediate results are refused (no exponentiation, so no huge numbers otherwise)


class PlanetTask(VerifyRequest):
    """A dataset row as /verify receives it: the prompt, the model's `response`, the numeric answer."""

    expected_answer: float
    tolerance: float = 1e-6  # absolute


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression: numbers, + - * /, unary minus, parentheses (no names, no calls).

    Raises:
        ValueError: anything else, a division by zero, or a result beyond MAX_MAGNITUDE.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            result = float(node.value)
        elif isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            result = OPERATORS[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            result = OPERATORS[type(node.op)](value(node.operand))
        else:
            raise ValueError(f"unsupported element {type(node).__name__}: use numbers, + - * / and parentheses")
        if abs(result) > MAX_MAGNITUDE:
            raise ValueError(f"a value beyond {MAX_MAGNITUDE:g}")
        return result

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return value(tree.body)


class PlanetServer(ResourcesServer):
    """Made-up planet facts through tools. Reward range: [0.0, 1.0], binary."""

    verify_request_type = PlanetTask

    @tool
    async def lookup(self, planet: str) -> dict[str, Any]:
        """Look up the facts of a planet by name: moons, diameter_km, day_hours, distance_au."""
        facts = PLANETS.get(planet.strip().title())
        if facts is None:
            return {"error": f"unknown planet {planet!r}", "known_planets": sorted(PLANETS)}
        return {"planet": planet.strip().title(), **facts}

    @tool
    async def calculator(self, expression: str) -> dict[str, Any]:
        """Evaluate an arithmetic expression with numbers, + - * / and parentheses, e.g. "(12 + 7) * 2"."""
        try:
            return {"result": evaluate(expression)}
        except ValueError as exc:
            return {"error": str(exc)}

    async def verify(self, request: PlanetTask, session: Session) -> VerifyResult:
        """1.0 when the last number of the final answer is within `tolerance` of `expected_answer`, else 0.0."""
        numbers = NUMBER.findall(strip_thinking(last_assistant_text(request.response)).replace(",", ""))
        answer = float(numbers[-1]) if numbers else None
        correct = answer is not None and abs(answer - request.expected_answer) <= request.tolerance
        return VerifyResult(reward=float(correct), extracted_answer=answer)
