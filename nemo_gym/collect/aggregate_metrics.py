"""`<out>_aggregate_metrics.json` of a rollout collection (`nemo_gym.collect.command`): each agent's
`/aggregate_metrics`
over every row of the output (or local reward statistics when it has none), and the collection's own counts.
The statistics an environment computes over its verify answers are `nemo_gym.env.metrics`."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from nemo_gym.common.errors import ServerError, ServerHTTPError
from nemo_gym.common.jsonl import AGENT_REF_KEY, NG_TRAJECTORY_KEY, iter_jsonl, write_json
from nemo_gym.serving.client import ServerClient

__all__ = ["is_reward", "metrics_entry", "write_aggregate_metrics"]


def is_reward(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _local_metrics(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """mean/min/max reward and the count (the keys of `ResourcesServer.aggregate_metrics`), plus `stop_reasons`
    (how episodes ended → count) when the rows carry a `stop_reason`."""
    rewards = [float(r["reward"]) for r in verify_responses if is_reward(r.get("reward"))]
    if not rewards:
        return {"num_rollouts": 0}
    metrics: dict[str, Any] = {
        "num_rollouts": len(rewards),
        "mean_reward": sum(rewards) / len(rewards),
        "min_reward": min(rewards),
        "max_reward": max(rewards),
    }
    stop_reasons = Counter(str(r["stop_reason"]) for r in verify_responses if r.get("stop_reason") is not None)
    if stop_reasons:
        metrics["stop_reasons"] = dict(stop_reasons)
    return metrics


def metrics_entry(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout row as `/aggregate_metrics` gets it, without its heavy fields, as NeMo Gym 0.7.0's collector sends
    them: no `responses_create_params` and no `ng_trajectory` capture record; `response` keeps only its `usage` and
    `incomplete_details`."""
    entry = {k: v for k, v in row.items() if k not in ("response", "responses_create_params", NG_TRAJECTORY_KEY)}
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    kept = {key: response[key] for key in ("usage", "incomplete_details") if response.get(key) is not None}
    if kept:
        entry["response"] = kept
    return entry


async def _agent_metrics(client: ServerClient, name: str, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent's `/aggregate_metrics` answer, or local metrics when it has no such route (404/405) or fails."""
    entry: dict[str, Any] = {AGENT_REF_KEY: {"name": name}}
    try:
        metrics = await client.post(name, "/aggregate_metrics", {"verify_responses": verify_responses})
    except ServerHTTPError as exc:
        if exc.status_code not in (404, 405):
            entry["agent_metrics_error"] = str(exc)[:2000]
        metrics = None
    except ServerError as exc:
        entry["agent_metrics_error"] = str(exc)[:2000]
        metrics = None
    if isinstance(metrics, dict):
        return {**entry, "agent_metrics": metrics, "source": "agent"}
    return {**entry, "agent_metrics": _local_metrics(verify_responses), "source": "local"}


async def write_aggregate_metrics(
    client: ServerClient, output: Path, metrics_path: Path, collection: dict[str, Any]
) -> dict[str, Any]:
    """Write `<out>_aggregate_metrics.json` (`metrics_path`) over every row of `output` (this run's and earlier ones),
    with `collection` (`CollectSummary.as_metrics()`).

    Shape: `{"agents": [{"agent_ref": {"name"}, "agent_metrics": {...}, "source": "agent" | "local"}],
    "collection": {rollouts_expected, rollouts_done, rollouts_this_run, rollouts_resumed, rollouts_failed,
    failures_by_class, mean_reward, wall_s, rollouts_per_s, retries, watchdog: {watchdog_s, stalls: [{at, idle_s,
    in_flight_count, in_flight: [{task_index, rollout_index, agent, running_s}]}]}}}`. Returns what it wrote.
    """
    by_agent: dict[str, list[dict[str, Any]]] = {}
    if output.is_file():
        for _, row in iter_jsonl(output):
            by_agent.setdefault(row[AGENT_REF_KEY]["name"], []).append(metrics_entry(row))
    agents = [await _agent_metrics(client, name, rows) for name, rows in sorted(by_agent.items())]
    metrics = {"agents": agents, "collection": collection}
    write_json(metrics_path, metrics)
    return metrics
