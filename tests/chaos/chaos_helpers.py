"""Shared helpers of the chaos tests: JSONL reading and the exactly-once check of a collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
from ng_process import BIN

Pair = tuple[int, int]  # (task index, rollout index)


def read_rows(path: Path) -> list[dict]:
    """Every complete line of a JSONL file (a torn last line, if any, is ignored); [] when missing."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_bytes().splitlines(keepends=True):
        if line.endswith(b"\n") and line.strip():
            rows.append(orjson.loads(line))
    return rows


def pair_of(row: dict) -> Pair:
    return row["_ng_task_index"], row["_ng_rollout_index"]


def side_file(output: Path, what: str) -> Path:
    return output.with_name(f"{output.stem}_{what}")


def assert_exactly_once(
    output: Path, pairs: set[Pair], *, allow_failures: bool = True, allow_missing: bool = False
) -> tuple[dict[Pair, dict], dict[Pair, dict]]:
    """Every pair has exactly one row in `output` or one terminal record in its failures file, never both,
    nothing else (`allow_missing`: or neither, as a collection that stopped because its servers were gone leaves
    the pairs it did not finish); returns (rows by pair, failure records by pair)."""
    rows = read_rows(output)
    failures = read_rows(side_file(output, "failures.jsonl"))
    row_counts, failure_counts = Counter(map(pair_of, rows)), Counter(map(pair_of, failures))
    duplicated = {p: n for p, n in row_counts.items() if n > 1}
    assert not duplicated, f"duplicated rollouts: {duplicated}"
    assert max(failure_counts.values(), default=0) <= 1, f"several failure records for a pair: {failure_counts}"
    assert not set(row_counts) & set(failure_counts), (
        f"pairs both in the output and the failures file: {set(row_counts) & set(failure_counts)}"
    )
    lost, unknown = pairs - set(row_counts) - set(failure_counts), (set(row_counts) | set(failure_counts)) - pairs
    assert not unknown and (allow_missing or not lost), f"lost: {lost}, unknown: {unknown}"
    if not allow_failures:
        assert not failures, f"failure records left: {failures[:3]}"
    return {pair_of(r): r for r in rows}, {pair_of(f): f for f in failures}


def collect_command(out: Path, head_url: str, *extra: str, rows: Path, repeats: int, concurrency: int) -> list[str]:
    """`ng_collect_rollouts` of `repeats` x the rows of `rows` through weather_agent into `out`, `concurrency` in
    flight."""
    return [
        str(BIN / "ng_collect_rollouts"),
        "+agent_name=weather_agent",
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={out}",
        f"+num_repeats={repeats}",
        f"+num_samples_in_parallel={concurrency}",
        "+progress=false",
        f"+head_server_url={head_url}",
        *extra,
    ]
