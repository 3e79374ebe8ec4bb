"""What a rollout's `ng_trajectory` capture record adds to its ATIF trajectory (`ng_export_atif` on rollouts of
`ng_collect_rollouts +observability_enabled=true`), as NeMo Gym 0.7.0's exporter reads the record
(`atif_export._apply_turns`, `_tool_record_extra`, `gym_rollout_to_atif`):

- each agent step the model wrote gets the turn that produced it, in order (the root invocation's turns by
  `turn_no`), and through the turn's model call reference its model call: the step's `timestamp` (the turn's, ISO
  8601 UTC), `model_name` (the call's `model`), `llm_call_count` 1, `metrics` from the call's `token_stats`
  (`prompt_tokens`, `completion_tokens`, `cached_tokens`; `reasoning_tokens` and `total_tokens` in the metrics'
  `extra`), and in `extra.nemo_gym` the `turn` (`turn_no`, `step_count`, `resolved`) and the whole `model_call`;
- each tool result gets its tool call record's `sandbox_id`, `started_at`, `completed_at`, `duration_ms` and
  `timing_source` in `extra.nemo_gym` (and its `status` and `error_type` when it did not complete);
- the trajectory's `extra.nemo_gym.source` names the record (`format` "ng_trajectory", `schema_version`, `task_id`,
  `rollout_id`, the root `invocation_id`, its `invocation_status` and `invocation_duration_ms`); model calls no turn
  took are kept as `surplus_model_calls`, the record's `gaps` as `gaps`.

0.7.0 refuses a rollout whose record has gaps, a failed or incomplete invocation, tool call or model call, a turn
that is not one model call or turns that do not match the agent steps one to one. Here such a rollout is still
exported: what lines up is applied, and what does not is said in `extra.nemo_gym.conversion` (`status` "partial" and
its `issues`, one line each) instead of being lost. The step's token ids and log-probs, when the rollout's items
carry them, stay in its metrics (0.7.0 refuses them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from atif import Metrics, Step
from pydantic import ValidationError

from nemo_gym.collect.health_evidence import flat_calls, resolve
from nemo_gym.env.capture_record import AgentInvocation, TrajectoryModelCall, TrajectoryRecord, TrajectoryTurn

__all__ = ["CONVERSION_PROFILE", "apply_capture_record"]

CONVERSION_PROFILE = "ng-trajectory-to-atif-v1"  # 0.7.0's extra.nemo_gym.conversion.profile
_TOOL_TIMING = ("sandbox_id", "started_at", "completed_at", "duration_ms", "timing_source")


def _iso(timestamp: float) -> str | None:
    """Unix seconds as ISO 8601 UTC with a `Z` (0.7.0's form); None when it is no representable time."""
    try:
        return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


def _metrics(step: Step, call: TrajectoryModelCall) -> Metrics | None:
    """The step's metrics from the call's token counts (the step's own counts where the call gives none); the
    token ids and log-probs the rollout's items carried are kept."""
    stats, own = call.token_stats, step.metrics
    counts = {
        "prompt_tokens": stats.prompt_tokens if stats.prompt_tokens is not None else own and own.prompt_tokens,
        "completion_tokens": (
            stats.completion_tokens if stats.completion_tokens is not None else own and own.completion_tokens
        ),
        "cached_tokens": stats.cached_tokens,
    }
    extra = {key: value for key in ("reasoning_tokens", "total_tokens") if (value := getattr(stats, key)) is not None}
    kept = {key: getattr(own, key) for key in ("prompt_token_ids", "completion_token_ids", "logprobs")} if own else {}
    if all(value is None for value in (*counts.values(), *kept.values())) and not extra:
        return own
    return Metrics(**counts, **kept, extra=extra or None)


def _with_nemo_gym(extra: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """`extra` with `fields` added under its `nemo_gym` key."""
    extra = dict(extra or {})
    extra["nemo_gym"] = {**fields, **(extra.get("nemo_gym") or {})}
    return extra


class _Applying:
    """One record applied to one trajectory's steps; `issues` says what could not be."""

    def __init__(self, raw: dict[str, Any], record: TrajectoryRecord):
        self.record = record
        self.flat = flat_calls(raw)
        self.used: set[int] = set()
        self.issues: list[str] = []

    def call_of(self, turn: TrajectoryTurn, where: str) -> int | None:
        """The index of the one model call the turn references; None (an issue said) otherwise."""
        if len(turn.model_calls) != 1:
            self.issues.append(f"{where}: references {len(turn.model_calls)} model calls, not one")
            return None
        found = resolve(turn.model_calls[0].model_dump(mode="json"), self.flat)
        if len(found) != 1:
            self.issues.append(f"{where}: its model call reference resolves to {len(found)} captured calls, not one")
            return None
        index = found[0]["call_index"]
        if index in self.used:
            self.issues.append(f"{where}: its model call is another turn's too")
            return None
        self.used.add(index)
        return index

    def turn(self, step: Step, turn: TrajectoryTurn, where: str) -> None:
        index = self.call_of(turn, where)
        if index is None:
            return
        call = self.record.model_calls[index]
        step.timestamp = _iso(turn.timestamp)
        step.model_name = call.response_metadata.model or step.model_name
        step.llm_call_count = 1
        step.metrics = _metrics(step, call)
        resolved = {"resolved": turn.resolved} if turn.resolved is not None else {}
        step.extra = _with_nemo_gym(
            step.extra,
            turn={"turn_no": turn.turn_no, "step_count": turn.step_count, **resolved},
            model_call=call.model_dump(mode="json", exclude_none=True),
        )

    def tools(self, steps: list[Step]) -> None:
        records = {tool.tool_call_id: tool for tool in self.record.tool_calls}
        for step in steps:
            for result in step.observation.results if step.observation else []:
                tool = records.get(result.source_call_id) if result.source_call_id else None
                if tool is None:
                    continue
                kept = tool.model_dump(mode="json", include=set(_TOOL_TIMING), exclude_none=True)
                if tool.status != "completed":
                    kept |= {"status": tool.status, "error_type": tool.error_type}
                result.extra = _with_nemo_gym(result.extra, **kept)


def _root(record: TrajectoryRecord) -> AgentInvocation | None:
    roots = [invocation for invocation in record.invocations if invocation.parent_invocation_id is None]
    return roots[0] if len(roots) == 1 else None


def apply_capture_record(raw: Any, steps: list[Step], identity: dict[str, int]) -> dict[str, Any]:
    """Apply the capture record `raw` (a row's `ng_trajectory`) to the trajectory's `steps` in place (module
    docstring); returns what the trajectory's `extra.nemo_gym` gets: `source` (with the row's `identity`, its
    `task_index` and `rollout_index`), `conversion`, and when there are any, `surplus_model_calls` and `gaps`. A
    record our schema (`nemo_gym.env.capture_record`) refuses, or one without a single root invocation, changes no
    step: its `source` is the rollout's (`format` "responses_rollout") and `conversion` says why."""
    try:
        record = TrajectoryRecord.model_validate(raw)
        root = _root(record)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
        record, root, issue = None, None, f"ng_trajectory{where}: {error['msg']}"
    if root is None:
        if record is not None:
            issue = f"ng_trajectory.invocations: {len(record.invocations)} invocations, not one root"
        not_applied = {"profile": CONVERSION_PROFILE, "status": "not_applied", "issues": [issue]}
        return {"source": {"format": "responses_rollout", **identity}, "conversion": not_applied}
    source = {"format": "ng_trajectory", "schema_version": record.schema_version, "task_id": record.task_id}
    source |= {"rollout_id": record.rollout_id, **identity}
    source |= {"invocation_id": root.invocation_id, "invocation_status": root.status}
    if root.duration_ms is not None:
        source["invocation_duration_ms"] = root.duration_ms
    applying = _Applying(raw, record)
    turns = sorted((turn for turn in record.turns if turn.invocation_id == root.invocation_id), key=lambda t: t.turn_no)
    written = [step for step in steps if step.source == "agent" and not step.is_copied_context]
    if len(turns) == len(written):
        for step, turn in zip(written, turns, strict=True):
            applying.turn(step, turn, f"ng_trajectory turn {turn.turn_no} (agent step {step.step_id})")
    else:
        applying.issues.append(
            f"ng_trajectory.turns: {len(turns)} turns for {len(written)} agent steps the model wrote; "
            "no step took a turn's model call"
        )
    applying.tools(steps)
    extra: dict[str, Any] = {"source": source}
    status = "partial" if applying.issues else "complete"
    extra["conversion"] = {"profile": CONVERSION_PROFILE, "status": status}
    if applying.issues:
        extra["conversion"]["issues"] = applying.issues
    surplus = [
        call.model_dump(mode="json", exclude_none=True)
        for index, call in enumerate(record.model_calls)
        if index not in applying.used
    ]
    if surplus:
        extra["surplus_model_calls"] = surplus
    if record.gaps:
        extra["gaps"] = [gap.model_dump(mode="json", exclude_none=True) for gap in record.gaps]
    return extra
