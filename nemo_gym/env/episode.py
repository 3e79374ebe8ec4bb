"""The steps every agent server shares: how an episode ended (`StopReason`) and the call of the policy model.

An agent's `/run` loops over model calls; each is `await calls.step(params, input_items)`: the policy model's
`POST /v1/responses` on the episode so far, its output items, and, when the episode must end because of the
model, why (`max_tokens`: the answer is incomplete, `context_overflow`: the prompt was refused as too long).
`calls.final_response(trajectory)` is the episode's `Response`: the last answer with the whole trajectory as
`output` and the usage summed over the calls.

    calls = ModelCalls(self.client, self.config.model_server.name, session_id, self.config.model_timeout_s)
    for _ in range(max_steps):
        output, stop = await calls.step(params, [*initial_input(params), *trajectory])
        trajectory.extend(output)
        if stop:
            break
        ...
    return calls.final_response(trajectory), stop_reason
"""

from __future__ import annotations

from collections import Counter
from enum import Enum
from typing import Any, NamedTuple

from fastapi.responses import JSONResponse

from nemo_gym.common.errors import ServerError, ServerHTTPError, typed_failure
from nemo_gym.common.jsonl import NG_TRAJECTORY_KEY
from nemo_gym.env.capture import TrajectoryCapture, clock
from nemo_gym.serving.client import ServerClient

__all__ = [
    "EndedEpisode",
    "ModelCalls",
    "StopReason",
    "episode_record",
    "failed_run_answer",
    "initial_input",
    "is_context_overflow",
    "run_answer",
]


class StopReason(str, Enum):
    """How an episode ended: the `stop_reason` of a rollout row (its value), counted in `stop_reasons` metrics."""

    # the episode ended by itself: the model answered without a tool call, or the environment said terminated
    completed = "completed"
    max_steps = (  # the agent's step limit (max_steps / max_turns model calls), or the environment said truncated
        "max_steps"
    )
    max_tokens = "max_tokens"  # the model ran out of output tokens (its response's status is incomplete)
    context_overflow = "context_overflow"  # the model server refused the prompt as too long
    tool_error = "tool_error"  # the last tool call failed (its error went back to the model)
    parse_error = "parse_error"  # the last tool call's arguments were not valid JSON
    timeout = "timeout"  # the episode ran out of time (for agents with a time limit; the bundled agents have none)


def initial_input(params: dict[str, Any]) -> list[Any]:
    """The input items of a Responses create body `params` (a string `input` is one user message)."""
    initial = params.get("input", [])
    return [{"role": "user", "content": initial}] if isinstance(initial, str) else initial


def episode_record(
    capture: TrajectoryCapture,
    row: dict[str, Any],
    response: dict[str, Any],
    stop_reason: StopReason,
    resolved: Any = None,
) -> dict[str, Any]:
    """The `ng_trajectory` record of an episode that ran to its end: the conversation (the row's input items, then
    `response`'s output), `completed` when it ended by itself (else it ended on a limit), the verify answer's
    `resolved` when there is one."""
    conversation = [*initial_input(row["responses_create_params"]), *response["output"]]
    return capture.record(conversation, completed=stop_reason is StopReason.completed, resolved=resolved)


class EndedEpisode(NamedTuple):
    """An episode that ran to its end: its dataset `row`, its final `response` (a Responses API object), and how it
    ended."""

    row: dict[str, Any]
    response: dict[str, Any]
    stop_reason: StopReason


def run_answer(verified: dict[str, Any], ended: EndedEpisode, capture: TrajectoryCapture | None) -> dict[str, Any]:
    """An agent's `/run` answer: the verify answer of the `ended` episode with its `stop_reason`, and, when the
    episode was captured, its `ng_trajectory` record (`episode_record`)."""
    answer = {**verified, "stop_reason": ended.stop_reason.value}
    if capture is not None:
        answer[NG_TRAJECTORY_KEY] = episode_record(capture, *ended, verified.get("resolved"))
    return answer


def failed_run_answer(
    exc: ServerError, capture: TrajectoryCapture | None, ended: EndedEpisode | None = None
) -> JSONResponse:
    """The `/run` answer of a rollout that failed on `exc`, a call it made: the typed failure answer every server
    gives for a failure further down (`{"error": {type, server, message}}`, 424 after a 4xx, else 502; the failed
    server's own class and message when its answer was typed). With the `ended` episode (it ran to its end and its
    /verify failed), `error.response` is the trajectory the verifier failed on. When the rollout was captured,
    `error.ng_trajectory` is its record: the ended episode's (`episode_record`), else one whose invocation failed
    with the failure class (`TrajectoryCapture.failed_record`)."""
    failure = typed_failure(exc)
    extra: dict[str, Any] = {}
    if ended is not None:
        extra["response"] = ended.response
    if capture is not None and ended is not None:
        extra[NG_TRAJECTORY_KEY] = episode_record(capture, *ended)
    elif capture is not None:
        extra[NG_TRAJECTORY_KEY] = capture.failed_record(failure.failure_class)
    return JSONResponse(failure.answer(**extra), status_code=failure.relay_status)


def is_context_overflow(exc: ServerHTTPError) -> bool:
    """Whether a model server's HTTP error refuses the prompt as too long (a 400 that speaks of the context)."""
    return exc.status_code == 400 and "context" in exc.body.lower()


class ModelCalls:
    """The policy-model calls of one episode: each `step` calls `/v1/responses` and says whether the episode must
    end; the last answer and the usage summed over the calls make the episode's final `Response`."""

    def __init__(
        self,
        client: ServerClient,
        model_server: str,
        session_id: str,
        timeout_s: float,
        capture: TrajectoryCapture | None = None,
        path: str = "/v1/responses",
    ):
        self.client, self.model_server, self.session_id, self.timeout_s = client, model_server, session_id, timeout_s
        self.path = path  # the model server's route: under the training token capture prefix when captured
        self.capture = capture  # each call is recorded in it, answered or refused (None: not captured)
        self.last_response: dict[str, Any] = {}  # the last answer of the model ({} before the first)
        self.usage: Counter[str] = Counter()  # the integer usage fields, summed over the answers

    async def step(
        self, params: dict[str, Any], input_items: list[dict[str, Any]], *, overflow_ends: bool = True
    ) -> tuple[list[dict[str, Any]], StopReason | None]:
        """Call the model with the create body `params` on `input_items`; returns its output items and
        `max_tokens` (the answer is incomplete: its output is returned too), `context_overflow` (no answer: the
        prompt was refused as too long; `[]`) or None (the episode may go on).

        Raises:
            nemo_gym.common.errors.ServerError: the call failed otherwise, or with a context overflow when
                `overflow_ends` is false (e.g. the task's own prompt is too long: a failure, not an episode's end).
        """
        request = {**params, "input": input_items}
        started_at, started = clock()
        try:
            response = await self.client.post(
                self.model_server, self.path, request, session_id=self.session_id, timeout_s=self.timeout_s
            )
        except ServerHTTPError as exc:
            overflow = is_context_overflow(exc)
            if self.capture is not None:
                category = "context_overflow" if overflow else "http_error"
                self.capture.model_call(
                    request,
                    None,
                    started_at,
                    clock()[1] - started,
                    status_code=exc.status_code,
                    error_category=category,
                )
            if overflow_ends and overflow:
                return [], StopReason.context_overflow
            raise
        except ServerError as exc:  # no answer: the model server was unreachable or slow
            if self.capture is not None:
                duration_s = clock()[1] - started
                self.capture.model_call(
                    request, None, started_at, duration_s, status_code=None, error_category=exc.failure_class
                )
            raise
        if self.capture is not None:
            self.capture.model_call(request, response, started_at, clock()[1] - started)
        self.last_response = response
        self.usage.update(
            {key: value for key, value in (response.get("usage") or {}).items() if isinstance(value, int)}
        )
        output = response.get("output") or []
        return output, StopReason.max_tokens if response.get("status") == "incomplete" else None

    def final_response(self, trajectory: list[dict[str, Any]]) -> dict[str, Any]:
        """The episode's `Response`: the last answer with `output` = `trajectory` and the usage summed over the
        calls."""
        final = {**self.last_response, "output": trajectory}
        if self.usage:
            final["usage"] = {**(self.last_response.get("usage") or {}), **self.usage}
        return final
