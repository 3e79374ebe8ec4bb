"""`TrajectoryCapture`: NeMo Gym 0.7.0's `ng_trajectory` capture record of one rollout, written by the agent.

With `ng_collect_rollouts +observability_enabled=true` (0.7.0's run-wide key), each rollout row carries
`ng_trajectory`, the record 0.7.0's rollout health checks (`gym eval health-check`), its `ng_perf` summary and its
strict ATIF export read (0.7.0's `rollout_observability.TrajectoryRecord`, `schema_version` "1.0"):

- `invocations`: one, `root`: its `status` (`completed`; `incomplete` when the episode ended on a limit: steps,
  output tokens, context; `failed`, with the failure class as `error_type`, when a call it made failed the rollout:
  that record goes into the failures file, `TrajectoryCapture.failed_record`), the references of its model calls
  and its `conversation` (the input items, then every output item and tool output; a message without `type` typed
  `message`, as 0.7.0's models write it);
- `turns`: one per answered model call: `question` (the input items sent), `answer` (the output items but
  reasoning), `reasoning_content` (the reasoning items, or null), `step_count` (the tool calls made so far in the
  invocation, the turn's included), `resolved` on the last turn (the verify answer's `resolved`, when it has one);
- `model_calls`: every model call, answered or not: the `request` body and `response`, wall-clock `started_at` and
  `completed_at` (Unix seconds), `duration_ms`, `response_metadata` (`model_ref`, `response_id`, `model`,
  `status_code`, `response_status`, `finish_reason`, `error_category`) and `token_stats` from the answer's `usage`;
- `tool_calls`: every tool call: `tool_call_id` (the function call's `call_id`), `tool_name`, timings,
  `status` (`completed` or `failed`), `error_type`, `output` (the text the model saw);
- `gaps`: what was not observed (`resolution_unavailable`: the verify answer has no boolean `resolved`).

0.7.0 builds the record from two sources: the agent's turns (referencing model calls by model server and response
id) and the model server's own capture files, joined by the collector. Here the agent sees both sides of each call,
so a model call and its references carry one `model_call_id` (a fresh UUID) and nothing needs joining.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from nemo_gym.env.trajectory import with_message_types

__all__ = ["SCHEMA_VERSION", "TrajectoryCapture", "clock", "token_stats"]

SCHEMA_VERSION = "1.0"  # 0.7.0's TrajectoryRecord.schema_version
MODEL_SERVER_TYPE = "responses_api_models"


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def token_stats(usage: Any) -> dict[str, int | None]:
    """A Responses (or Chat Completions) `usage` object as 0.7.0's `TrajectoryTokenStats`: prompt, completion,
    reasoning, total and cached tokens, None for a count the answer does not give (never 0 for unknown)."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = usage.get("input_tokens", usage.get("prompt_tokens"))
    completion = usage.get("output_tokens", usage.get("completion_tokens"))
    output_details = usage.get("output_tokens_details") or usage.get("completion_tokens_details") or {}
    input_details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    return {
        "prompt_tokens": _count(prompt),
        "completion_tokens": _count(completion),
        "reasoning_tokens": _count(output_details.get("reasoning_tokens"))
        if isinstance(output_details, dict)
        else None,
        "total_tokens": _count(usage.get("total_tokens")),
        "cached_tokens": _count(input_details.get("cached_tokens")) if isinstance(input_details, dict) else None,
    }


def _finish_reason(response: dict[str, Any]) -> str | None:
    """As 0.7.0's capture reads it: the answer's `stop_reason`, a first choice's `finish_reason`, else why it is
    incomplete (`max_output_tokens`); None for a Responses answer that completed."""
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    incomplete = response.get("incomplete_details")
    for value in (
        response.get("stop_reason"),
        first.get("finish_reason"),
        incomplete.get("reason") if isinstance(incomplete, dict) else None,
    ):
        if isinstance(value, str):
            return value
    return None


class TrajectoryCapture:
    """The capture record of one rollout's root invocation, filled in as the agent runs (module docstring).

    `model_server`: the policy's instance name; `task_id` and `rollout_id`: the rollout's identity (0.7.0: the row's
    `task_id`, else `_ng_task_index`; `<task index>-<rollout index>`)."""

    invocation_id = "root"

    def __init__(self, model_server: str, *, task_id: str, rollout_id: str):
        self.model_ref = {"type": MODEL_SERVER_TYPE, "name": model_server}
        self.task_id, self.rollout_id = task_id, rollout_id
        self.turns: list[dict[str, Any]] = []
        self.model_calls: list[dict[str, Any]] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.gaps: list[dict[str, Any]] = []
        self._tools_before_last_call = 0  # tool calls recorded before the last model call

    @classmethod
    def of_row(cls, model_server: str, row: dict[str, Any], rollout_id: str) -> TrajectoryCapture:
        """The capture of rollout `rollout_id` of dataset row `row`; its task id as 0.7.0's agents take it: the row's
        `task_id`, `problem_id`, `instance_id`, else `_ng_task_index` (`unknown` without any)."""
        keys = ("task_id", "problem_id", "instance_id", "_ng_task_index")
        task_id = next((str(row[key]) for key in keys if row.get(key) is not None), "unknown")
        return cls(model_server, task_id=task_id, rollout_id=rollout_id)

    def model_call(
        self,
        request: dict[str, Any],
        response: dict[str, Any] | None,
        started_at: float,
        duration_s: float,
        *,
        status_code: int | None = 200,
        error_category: str | None = None,
    ) -> None:
        """Record one model call that took `duration_s` seconds from `started_at` (Unix seconds): answered
        (`response`, and a turn), or refused (`response` None, `status_code` and `error_category`: no turn; no
        `status_code` when no answer came: the server was unreachable or slow)."""
        self._tools_before_last_call = len(self.tool_calls)
        model_call_id = uuid.uuid4().hex
        answer = response or {}
        metadata = {
            "response_id": answer.get("id") if isinstance(answer.get("id"), str) else None,
            "model_ref": self.model_ref,
            "model": answer.get("model") or request.get("model"),
            "dialect": "responses",
            "status_code": status_code,
            "response_status": answer.get("status") if isinstance(answer.get("status"), str) else None,
            "finish_reason": _finish_reason(answer),
            "error_category": error_category,
        }
        self.model_calls.append(
            {
                "model_call_id": model_call_id,
                "started_at": started_at,
                "completed_at": started_at + duration_s,
                "duration_ms": duration_s * 1000,
                "request": request,
                "response": response,
                "response_metadata": metadata,
                "token_stats": token_stats(answer.get("usage")),
            }
        )
        if response is None:
            return
        output = response.get("output") or []
        reasoning = [item for item in output if isinstance(item, dict) and item.get("type") == "reasoning"]
        self.turns.append(
            {
                "invocation_id": self.invocation_id,
                "task_id": self.task_id,
                "rollout_id": self.rollout_id,
                "turn_no": len(self.turns) + 1,
                "timestamp": started_at,
                "question": with_message_types(request.get("input") or []),
                "answer": [item for item in output if not (isinstance(item, dict) and item.get("type") == "reasoning")],
                "reasoning_content": reasoning or None,
                "resolved": None,
                "step_count": len(self.tool_calls),
                "model_calls": [self._reference(self.model_calls[-1])],
            }
        )

    def tool_call(
        self,
        call_id: str,
        name: str | None,
        started_at: float,
        duration_s: float,
        output: str,
        error_type: str | None = None,
    ) -> None:
        """Record one tool call (`error_type` None: it completed, else it failed so, e.g. `http_404`)."""
        self.tool_calls.append(
            {
                "kind": "tool_call",
                "invocation_id": self.invocation_id,
                "tool_call_id": call_id,
                "tool_name": name,
                "started_at": started_at,
                "completed_at": started_at + duration_s,
                "duration_ms": duration_s * 1000,
                "timing_source": "executor",
                "status": "failed" if error_type else "completed",
                "error_type": error_type,
                "output": output,
            }
        )
        if self.turns:
            self.turns[-1]["step_count"] = len(self.tool_calls)

    def _reference(self, call: dict[str, Any]) -> dict[str, Any]:
        return {
            "model_call_id": call["model_call_id"],
            "model_ref": self.model_ref,
            "response_id": call["response_metadata"]["response_id"],
        }

    def record(
        self, conversation: list[Any], *, completed: bool, resolved: Any = None, error_type: str | None = None
    ) -> dict[str, Any]:
        """The `ng_trajectory` value: the invocation's whole `conversation` (input items, then output items and
        tool outputs), whether it `completed` (else it ended on a limit: `incomplete`; with `error_type`, it
        `failed` so), and the verify answer's `resolved` (a boolean goes on the last turn; otherwise a
        `resolution_unavailable` gap)."""
        gaps = list(self.gaps)
        if isinstance(resolved, bool) and self.turns:
            self.turns[-1]["resolved"] = resolved
        else:
            gaps.append({"code": "resolution_unavailable", "invocation_id": self.invocation_id, "detail": None})
        answered = [call for call in self.model_calls if call["response"] is not None]
        invocation = {
            "kind": "agent_invocation",
            "invocation_id": self.invocation_id,
            "status": "failed" if error_type else "completed" if completed else "incomplete",
            "error_type": error_type,
            "model_calls": [self._reference(call) for call in answered],
            "conversation": with_message_types(conversation),
        }
        return {
            "schema_version": SCHEMA_VERSION,
            "task_id": self.task_id,
            "rollout_id": self.rollout_id,
            "invocations": [invocation],
            "turns": self.turns,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "gaps": gaps,
        }

    def failed_record(self, error_type: str) -> dict[str, Any]:
        """The record of an episode that failed with the failure class `error_type` (a call it made failed before
        its verify answer): the conversation as far as its last model call (that call's input, its answer when it
        answered) and the tool outputs recorded after it."""
        conversation: list[Any] = []
        if self.model_calls:
            last = self.model_calls[-1]
            conversation = [*(last["request"].get("input") or []), *((last["response"] or {}).get("output") or [])]
            conversation += [
                {"type": "function_call_output", "call_id": tool["tool_call_id"], "output": tool["output"]}
                for tool in self.tool_calls[self._tools_before_last_call :]
            ]
        return self.record(conversation, completed=False, error_type=error_type)


def clock() -> tuple[float, float]:
    """(Unix seconds, monotonic seconds) at this moment: a call's `started_at` and the clock for its duration."""
    return time.time(), time.monotonic()
