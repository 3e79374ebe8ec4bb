"""`ng_perf`: a rollout's turn, tool-call and token counts, summed from its `ng_trajectory` capture record.

`ng_collect_rollouts +observability_enabled=true` puts it on each rollout row whose agent answered a capture record
(`nemo_gym.env.capture`), as NeMo Gym 0.7.0's collector does (its `rollout_collection._build_ng_perf`):

- `num_turns`: per invocation, its turns, else the model calls it owns, else 1; summed;
- `num_tool_calls`: the tool calls of the invocations;
- `token_observability_coverage`: the owned model calls over `num_turns` (at most 1.0): below 1.0, some turns' tokens
  are missing from the sums;
- `prompt_tokens`, `cached_prompt_tokens`, `completion_tokens`, `reasoning_tokens`: summed over the owned model calls
  (a sum is absent when no call gives that count);
- `total_latency_ms`: the rollout's wall time as the collector saw it (its `/run` call), milliseconds.

A record that does not validate (`nemo_gym.env.capture_record.TrajectoryRecord`) gets none, as in 0.7.0. An invocation
owns a model call its reference resolves to (`nemo_gym.collect.health_evidence.resolve`: by `model_call_id`, and the
reference's `model_ref` and `response_id` when it gives them, else by (`model_ref`, `response_id`)); a reference that
resolves to no call or to several owns none, and a call is owned once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import ValidationError

from nemo_gym.collect.health_evidence import flat_calls, resolve
from nemo_gym.env.capture_record import TrajectoryRecord

__all__ = ["ng_perf"]

_TOKEN_SUMS = (
    ("prompt_tokens", "prompt_tokens"),
    ("cached_prompt_tokens", "cached_tokens"),
    ("completion_tokens", "completion_tokens"),
    ("reasoning_tokens", "reasoning_tokens"),
)


def _owned_calls(trajectory: dict[str, Any]) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The model calls (the record's own entries) the invocations' references resolve to, each once, and how many
    each invocation owns."""
    calls = flat_calls(trajectory)
    owned: list[dict[str, Any]] = []
    seen: set[int] = set()
    per_invocation: Counter[str] = Counter()
    for invocation in trajectory["invocations"]:
        for ref in invocation["model_calls"]:
            found = resolve(ref, calls)
            if len(found) != 1 or found[0]["call_index"] in seen:
                continue
            seen.add(found[0]["call_index"])
            owned.append(trajectory["model_calls"][found[0]["call_index"]])
            per_invocation[invocation["invocation_id"]] += 1
    return owned, per_invocation


def ng_perf(trajectory: Any, rollout_latency_ms: float | None = None) -> dict[str, Any] | None:
    """The `ng_perf` of capture record `trajectory` (module docstring); None when it is not one (it does not
    validate) or has no invocation. `rollout_latency_ms`: the rollout's wall time, milliseconds."""
    if not isinstance(trajectory, dict):
        return None
    try:
        trajectory = TrajectoryRecord.model_validate(trajectory).model_dump(mode="json")
    except ValidationError:
        return None
    invocations = trajectory["invocations"]
    if not invocations:
        return None
    owned, owned_per_invocation = _owned_calls(trajectory)
    ids = [invocation["invocation_id"] for invocation in invocations]
    turns = Counter(turn["invocation_id"] for turn in trajectory["turns"])
    tools = Counter(tool["invocation_id"] for tool in trajectory["tool_calls"])
    num_turns = sum(turns.get(i, 0) or owned_per_invocation.get(i, 0) or 1 for i in ids)
    perf: dict[str, Any] = {
        "num_turns": num_turns,
        "num_tool_calls": sum(tools.get(i, 0) for i in ids),
        "token_observability_coverage": min(1.0, len(owned) / num_turns),
    }
    for perf_key, stats_key in _TOKEN_SUMS:
        counted = [call["token_stats"][stats_key] for call in owned if call["token_stats"][stats_key] is not None]
        if counted:
            perf[perf_key] = sum(counted)
    if isinstance(rollout_latency_ms, (int, float)):
        perf["total_latency_ms"] = rollout_latency_ms
    return perf
