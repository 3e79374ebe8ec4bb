"""Arithmetic questions with a boxed final answer: single-turn RL with partial credit.

Reward (range [0.0, 1.0]): 1.0 for the right number in the last `\\boxed{...}`; 0.5 for the right number as
the last number of an answer without a box (right, but not in the asked format); 0.0 otherwise. The two parts
are reported as `reward_components` (`correct`, `boxed`), and the number read as `extracted_answer`.
"""

from __future__ import annotations

import re

from nemo_gym.env.answers import last_assistant_text, last_boxed, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import Session

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
UNBOXED_CREDIT = 0.5  # the right number without the asked \boxed{} format


class ArithmeticTask(VerifyRequest):
    """A dataset row as /verify receives it: the prompt, the model's `response`, the exact integer answer."""

    expected_answer: int


def read_number(text: str) -> float | None:
    """The last number of `text` (thousands separators dropped), or None."""
    numbers = NUMBER.findall(text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


class ArithmeticServer(ResourcesServer):
    """Integer arithmetic. Reward range: [0.0, 1.0]: 1.0 boxed and right, 0.5 right but not boxed, else 0.0."""

    verify_request_type = ArithmeticTask

    async def verify(self, request: ArithmeticTask, session: Session) -> VerifyResult:
        """Score the final answer: the last box if there is one, else the last number of the text."""
        text = strip_thinking(last_assistant_text(request.response))
        boxed = last_boxed(text)
        number = read_number(boxed if boxed is not None else text)
        correct = number is not None and number == request.expected_answer
        reward = (1.0 if boxed is not None else UNBOXED_CREDIT) if correct else 0.0
        return VerifyResult(
            reward=reward,
            reward_components={"correct": float(correct), "boxed": float(boxed is not None)},
            extracted_answer=number,
        )
