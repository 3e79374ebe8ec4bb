"""The bad model output a verifier must survive (the conformance check `bad-answers`, `nemo_gym.env.conformance`):
an empty answer and copies of it with content or output of the wrong JSON types, and huge answers that stall
quadratic extractors.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["EMPTY_ANSWER", "HUGE_ANSWER_CHARS", "answer_with", "huge_answers", "wrong_type_answers"]

EMPTY_ANSWER: dict[str, Any] = {
    "id": "resp_conformance",
    "created_at": 0,
    "model": "conformance",
    "object": "response",
    "output": [
        {
            "id": "msg_conformance",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        }
    ],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}
HUGE_ANSWER_CHARS = 1_000_000  # far above every answer cap (2k-20k characters), far below the body cap (64 MiB)


def answer_with(content: Any = None, *, output: Any = None) -> dict[str, Any]:
    """EMPTY_ANSWER with its message's `content`, or its whole `output`, replaced."""
    answer = copy.deepcopy(EMPTY_ANSWER)
    if output is not None:
        answer["output"] = output
    else:
        answer["output"][0]["content"] = content
    return answer


def huge_answers(huge_chars: int) -> dict[str, Any]:
    """Answers of about `huge_chars` characters a verifier must score without stalling."""

    def huge(unit: str) -> dict[str, Any]:
        return answer_with([{"type": "output_text", "text": unit * (huge_chars // len(unit)), "annotations": []}])

    return {
        "huge prose": huge("Let me think step by step. "),
        # A model stuck in a loop: quadratic extractors (a lazy `<think>.*?</think>`, a box scanned from every
        # `\boxed{`) take hours on this.
        "huge unclosed markup": huge("<think> <answer> \\boxed{ The answer is: "),
        # Regexes whose `\s+`/`\s*` are tried from every space of a run (math_verify's phrase end, reasoning_gym's
        # "answer is") are quadratic or worse here.
        "huge whitespace": answer_with(
            [{"type": "output_text", "text": "The answer is 4" + " " * huge_chars + ".", "annotations": []}]
        ),
    }


def wrong_type_answers() -> dict[str, Any]:
    """Responses with content of the wrong JSON types (the last two are not even objects: schema errors)."""
    return {
        "content a number": answer_with(42),
        "content an object": answer_with({"type": "output_text", "text": "stand"}),
        "parts not objects": answer_with([1, None, "x", [2]]),
        "text not a string": answer_with([{"type": "output_text", "text": 42}, {"type": "output_text", "text": None}]),
        "output a string": answer_with(output="stand"),
        "output a number": answer_with(output=5),
        "output items of no shape": answer_with(
            output=[None, 3, "x", [], {"type": 5}, {"type": "message", "role": 7, "content": "x"}]
        ),
        "tool call with unparsable arguments": answer_with(
            output=[{"type": "function_call", "name": "f", "arguments": "{not json", "call_id": "c"}]
        ),
        "tool call of wrong types": answer_with(
            output=[{"type": "function_call", "name": None, "arguments": {"a": 1}, "call_id": 5}]
        ),
        "no output": {},
        "response a string": "stand",
        "response a list": [EMPTY_ANSWER],
    }
