"""`ng_aggregate_rollouts` (NeMo Gym 0.7.0's `gym eval aggregate`): rollout shards (files matching a glob, or
several comma-separated globs) merged into one rollouts file, sorted by `(_ng_task_index, _ng_rollout_index)`, and its
`<stem>_aggregate_metrics.json` written over all of them (`nemo_gym.collect.aggregate_metrics`).

As 0.7.0: the globs are expanded in order, each sorted, duplicates and the shards' own side files
(`*_failures.jsonl`, `*_materialized_inputs.jsonl`) left out; the merged file holds the rows byte for byte as 0.7.0
writes them (compact JSON, one a line). Departures:
- the metrics file has our shape (`{"agents": [...], "collection": {...}}`, see `write_aggregate_metrics`), not
  0.7.0's list per environment server; each agent's `/aggregate_metrics` is asked through the running `ng_run`
  (`+head_server_url`, `$NEMO_GYM_HEAD_URL` or the only live run), and with no run at all the metrics are our local
  reward statistics (`"source": "local"`), where 0.7.0 fails without its head server;
- 0.7.0's `merge_shards=false`, `count_failure_classes_as_zero`, `count_missing_rollouts_as_zero` and its rollout
  health checks are not offered: unknown parameters, rejected by name. The shards' failures files are counted
  (`collection.failures_by_class`), never scored as zeros (a failure is a failure, not a reward).
"""

from __future__ import annotations

import asyncio
import glob
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.aggregate_metrics import write_aggregate_metrics
from nemo_gym.collect.files import OutputPaths
from nemo_gym.common.errors import ConfigError, DataError, ServerHTTPError
from nemo_gym.common.jsonl import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl, write_jsonl
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import discover_head_url

__all__ = ["AggregateRolloutsOptions", "aggregate_rollouts_main", "expand_input_glob", "merged_rows"]


class AggregateRolloutsOptions(BaseModel):
    """Parameters of `ng_aggregate_rollouts`."""

    model_config = ConfigDict(extra="forbid")
    input_glob: str = Field(
        description="glob, or comma-separated globs, of the rollout shards (e.g. 'results/rollouts-*.jsonl')"
    )
    output_jsonl_fpath: str = Field(
        description="merged rollouts file; <stem>_aggregate_metrics.json is written next to it"
    )
    head_server_url: str | None = Field(
        None,
        description=(
            "head server of the run whose agents compute the metrics; default $NEMO_GYM_HEAD_URL or the only running"
            " ng_run, else local reward statistics"
        ),
    )


def expand_input_glob(input_glob: str) -> list[Path]:
    """The shard files of `input_glob`, in 0.7.0's order (pattern by pattern, each sorted), without duplicates or
    side files."""
    seen: dict[str, None] = {}
    for pattern in (p.strip() for p in input_glob.split(",")):
        for path in sorted(glob.glob(pattern)) if pattern else []:
            if not Path(path).stem.endswith(("_failures", "_materialized_inputs")):
                seen.setdefault(path, None)
    return [Path(p) for p in seen]


def _order(row: dict[str, Any]) -> tuple[int, int]:
    return (row.get(TASK_INDEX_KEY, -1), row.get(ROLLOUT_INDEX_KEY, -1))


def merged_rows(shards: list[Path]) -> list[dict[str, Any]]:
    """Every row of `shards`, sorted by task then rollout index (a stable sort: shard order breaks ties).

    Raises:
        DataError: a line is not a JSON object, or a row names no agent (`agent_ref.name`).
    """
    rows = []
    for shard in shards:
        for line_no, row in iter_jsonl(shard):
            if not isinstance(row.get("agent_ref"), dict) or "name" not in row["agent_ref"]:
                raise DataError(f"{shard}:{line_no}: a rollout row without agent_ref.name (whose metrics would it be?)")
            rows.append(row)
    return sorted(rows, key=_order)


def _failures_by_class(shards: list[Path]) -> dict[str, int]:
    failures = [OutputPaths.for_output(shard).failures for shard in shards]
    return dict(
        Counter(str(row.get("failure_class")) for path in failures if path.is_file() for _, row in iter_jsonl(path))
    )


class _NoRun:
    """The client when no `ng_run` is live: every agent 'has no /aggregate_metrics route', so each gets our local
    reward statistics (`"source": "local"`)."""

    async def post(self, name: str, path: str, body: Any) -> Any:
        raise ServerHTTPError(f"{name}: no running ng_run", status_code=404, server=name, path=path)


async def _write_metrics(options: AggregateRolloutsOptions, paths: OutputPaths, collection: dict[str, Any]) -> None:
    try:
        head_url = discover_head_url(options.head_server_url)
    except ConfigError as exc:
        if options.head_server_url:
            raise
        print(f"ng_aggregate_rollouts: {exc}; writing local reward statistics instead")
        await write_aggregate_metrics(_NoRun(), paths.output, paths.aggregate_metrics, collection)  # type: ignore[arg-type]
        return
    async with ServerClient(head_url) as client:
        await write_aggregate_metrics(client, paths.output, paths.aggregate_metrics, collection)


def aggregate_rollouts_main(options: AggregateRolloutsOptions) -> int:
    """`ng_aggregate_rollouts`. Returns 0.

    Raises:
        ConfigError: no file matches `input_glob`.
        DataError: a shard line is not a JSON object.
        ServerError: the named head server cannot be reached.
    """
    shards = expand_input_glob(options.input_glob)
    if not shards:
        raise ConfigError(f"no shards matched input_glob={options.input_glob!r}")
    print(f"Aggregating {len(shards)} shard(s):")
    for shard in shards:
        print(f"  - {shard}")
    rows = merged_rows(shards)
    paths = OutputPaths.for_output(options.output_jsonl_fpath)
    print(f"Loaded {len(rows)} rollout record(s) from {len(shards)} shard(s)\nMerging shards into {paths.output}")
    write_jsonl(paths.output, rows)
    collection = {
        "shards": [str(s) for s in shards],
        "rollouts_done": len(rows),
        "failures_by_class": _failures_by_class(shards),
    }
    asyncio.run(_write_metrics(options, paths, collection))
    print(
        f"Finished rollout aggregation! View results at:\nMerged rollouts: {paths.output}\n"
        f"Aggregate metrics: {paths.aggregate_metrics}"
    )
    return 0
