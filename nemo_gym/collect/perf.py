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

An invocation owns a model call its reference resolves to: by `model_call_id` (and the reference's `model_ref` and
`response_id` when it gives them), else by (`model_ref`, `response_id`); a reference that resolves to no call or to
several owns none, and a call is owned once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["ng_perf"]

_TOKEN_SUMS = (
    ("prompt_tokens", "prompt_tokens"),
    ("cached_prompt_tokens", "cached_tokens"),
    ("completion_tokens", "completion_tokens"),
    ("reasoning_tokens", "reasoning_tokens"),
)


def _model_key(ref: Any) -> tuple[Any, Any] | None:
    return (ref.get("type"), ref.get("name")) if isinstance(ref, dict) else None


def _owned_calls(trajectory: dict[str, Any]) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The model calls the invocations' references resolve to (each once), and how many each invocation owns."""
    calls = [call for call in trajectory.get("model_calls") or [] if isinstance(call, dict)]

    def matches(ref: dict[str, Any]) -> list[int]:
        found = []
        for index, call in enumerate(calls):
            metadata = call.get("response_metadata") or {}
            if ref.get("model_call_id"):
                same = call.get("model_call_id") == ref["model_call_id"]
                same = same and (ref.get("model_ref") is None or ref["model_ref"] == metadata.get("model_ref"))
                same = same and (ref.get("response_id") is None or ref["response_id"] == metadata.get("response_id"))
            else:
                same = (
                    bool(ref.get("response_id"))
                    and _model_key(ref.get("model_ref")) is not None
                    and _model_key(ref.get("model_ref")) == _model_key(metadata.get("model_ref"))
                    and ref["response_id"] == metadata.get("response_id")
                )
            if same:
                found.append(index)
        return found

    owned: list[dict[str, Any]] = []
    seen: set[int] = set()
    per_invocation: Counter[str] = Counter()
    for invocation in trajectory.get("invocations") or []:
        for ref in invocation.get("model_calls") or []:
            found = matches(ref) if isinstance(ref, dict) else []
            if len(found) != 1 or found[0] in seen:
                continue
            seen.add(found[0])
            owned.append(calls[found[0]])
            per_invocation[invocation.get("invocation_id")] += 1
    return owned, per_invocation


def ng_perf(trajectory: Any, rollout_latency_ms: float | None = None) -> dict[str, Any] | None:
    """The `ng_perf` of a capture record (module docstring); None when it is not one or has no invocation."""
    if not isinstance(trajectory, dict) or not trajectory.get("invocations"):
        return None
    invocations = [i for i in trajectory["invocations"] if isinstance(i, dict)]
    owned, owned_per_invocation = _owned_calls(trajectory)
    ids = [invocation.get("invocation_id") for invocation in invocations]
    turns = Counter(turn.get("invocation_id") for turn in trajectory.get("turns") or [] if isinstance(turn, dict))
    tools = Counter(tool.get("invocation_id") for tool in trajectory.get("tool_calls") or [] if isinstance(tool, dict))
    num_turns = sum(turns.get(i, 0) or owned_per_invocation.get(i, 0) or 1 for i in ids)
    perf: dict[str, Any] = {
        "num_turns": num_turns,
        "num_tool_calls": sum(tools.get(i, 0) for i in ids),
        "token_observability_coverage": min(1.0, len(owned) / num_turns),
    }
    for perf_key, stats_key in _TOKEN_SUMS:
        values = [(call.get("token_stats") or {}).get(stats_key) for call in owned]
        counted = [value for value in values if isinstance(value, int)]
        if counted:
            perf[perf_key] = sum(counted)
    if isinstance(rollout_latency_ms, (int, float)):
        perf["total_latency_ms"] = rollout_latency_ms
    return perf
