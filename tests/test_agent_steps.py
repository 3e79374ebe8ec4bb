"""nemo_gym.env.episode: the agents' model-call step (classification of the answer, summed usage) and StopReason."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nemo_gym.common.errors import ServerHTTPError
from nemo_gym.env.episode import ModelCalls, StopReason, initial_input

OVERFLOW = ServerHTTPError(
    "400", status_code=400, body='{"error": "This model\'s maximum context length is 2048 tokens"}'
)


class FakeClient:
    """Answers each `post` with the next of `answers` (an exception is raised), recording the calls."""

    def __init__(self, *answers: Any):
        self.answers, self.calls = list(answers), []

    async def post(self, server: str, path: str, body: dict[str, Any], **options: Any) -> Any:
        self.calls.append((server, path, body, options))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def answer(text: str, *, status: str = "completed", output_tokens: int = 1) -> dict[str, Any]:
    return {
        "id": "r",
        "status": status,
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
        "usage": {"input_tokens": 10, "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0}},
    }


def test_a_step_classifies_the_answer_and_the_final_response_sums_usage() -> None:
    client = FakeClient(answer("one", output_tokens=2), answer("two", status="incomplete", output_tokens=5), OVERFLOW)
    calls = ModelCalls(client, "policy_model", "s1", timeout_s=7.0)  # type: ignore[arg-type]
    first, stop = asyncio.run(calls.step({"model": "m", "input": "ignored"}, [{"role": "user", "content": "hi"}]))
    assert stop is None and first[0]["content"][0]["text"] == "one"
    assert client.calls[0] == (
        "policy_model",
        "/v1/responses",
        {"model": "m", "input": [{"role": "user", "content": "hi"}]},
        {"session_id": "s1", "timeout_s": 7.0},
    )
    second, stop = asyncio.run(calls.step({}, []))
    assert stop is StopReason.max_tokens and second[0]["content"][0]["text"] == "two"  # the incomplete output is kept
    assert asyncio.run(calls.step({}, [])) == ([], StopReason.context_overflow)
    final = calls.final_response(["whole trajectory"])  # type: ignore[list-item]
    # the last answer (the overflow gave none) with usage summed: input 10 + 10, output 2 + 5; non-integers as last
    # given
    assert final["status"] == "incomplete" and final["output"] == ["whole trajectory"]
    assert final["usage"] == {"input_tokens": 20, "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}}


def test_an_overflow_that_does_not_end_the_episode_and_other_errors_are_raised() -> None:
    calls = ModelCalls(
        FakeClient(OVERFLOW, ServerHTTPError("500", status_code=500, body="context")), "m", "s", timeout_s=1.0
    )  # type: ignore[arg-type]
    with pytest.raises(ServerHTTPError):
        asyncio.run(calls.step({}, [], overflow_ends=False))
    with pytest.raises(ServerHTTPError):  # a 500 is no context overflow, whatever it says
        asyncio.run(calls.step({}, []))
    assert calls.final_response([]) == {"output": []}  # no answer: no usage


def test_stop_reason_values_are_the_wire_values() -> None:
    assert [r.value for r in StopReason] == [
        "completed",
        "max_steps",
        "max_tokens",
        "context_overflow",
        "tool_error",
        "parse_error",
        "timeout",
    ]
    assert StopReason.max_tokens == "max_tokens"  # a str enum: JSON-encodes as its value
    assert initial_input({"input": "hi"}) == [{"role": "user", "content": "hi"}] and initial_input({}) == []
