"""The files of a rollout collection (`nemo_gym.collect.command`) and its resume: the output and its side files
(`OutputPaths`), the state file that fingerprints the input, the pairs already done and the failures recorded by
an earlier run, and `+resume=false`'s move aside."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import (
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    iter_jsonl,
    repair_truncated_tail,
    write_json,
    write_jsonl,
)
from nemo_gym.serving.responses_params import metadata_object

__all__ = [
    "OutputPaths",
    "Pair",
    "check_same_input",
    "compact_failures",
    "count_lines",
    "move_aside",
    "now",
    "read_done",
    "read_failures",
    "rollout_input",
    "seed_problem",
    "write_rescored",
    "write_state",
]

STATE_FORMAT = 1
Pair = tuple[int, int]  # (task index, rollout index)


def seed_problem(task: dict[str, Any]) -> str | None:
    """Why `rollout_input(..., add_seed=True)` cannot seed this task row (its `responses_create_params.metadata` is not
    an object, or its `metadata.extra_body` is not a JSON object in a string), else None."""
    metadata = task["responses_create_params"].get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return f"responses_create_params.metadata must be an object to take a seed, got {metadata!r:.100}"
    raw = (metadata or {}).get("extra_body")
    if not isinstance(raw, str | None):
        return f"responses_create_params.metadata.extra_body must be a JSON object in a string, got {raw!r:.100}"
    try:
        metadata_object(metadata, "extra_body")
    except ValueError as exc:
        return f"responses_create_params.{exc}"
    return None


def rollout_input(
    task: dict[str, Any], task_index: int, rollout_index: int, *, add_seed: bool = False
) -> dict[str, Any]:
    """Rollout (`task_index`, `rollout_index`)'s row, as it is sent to its agent and written to the materialized
    inputs: the task row with `_ng_task_index` and `_ng_rollout_index`. With `add_seed` (NeMo Gym's
    `num_repeats_add_seed`, in its form), `responses_create_params.metadata.extra_body`, a JSON object in a string,
    also gets `"seed": rollout_index` (its other keys kept), which vllm_model passes to vLLM: each repeat samples
    differently, and the same repeat the same way again. The task must pass `seed_problem`."""
    row = {**task, TASK_INDEX_KEY: task_index, ROLLOUT_INDEX_KEY: rollout_index}
    if add_seed:
        params = dict(task["responses_create_params"])
        metadata = dict(params.get("metadata") or {})
        metadata["extra_body"] = json.dumps({**metadata_object(metadata, "extra_body"), "seed": rollout_index})
        params["metadata"] = metadata
        row["responses_create_params"] = params
    return row


@dataclass(frozen=True)
class OutputPaths:
    """The output file and its side files (`<stem>_<what>` next to it)."""

    output: Path
    materialized_inputs: Path
    failures: Path
    aggregate_metrics: Path
    state: Path

    @classmethod
    def for_output(cls, output: str | Path) -> OutputPaths:
        output = Path(output)

        def side(what: str, suffix: str) -> Path:
            return output.with_name(f"{output.stem}_{what}{suffix}")

        return cls(
            output,
            side("materialized_inputs", ".jsonl"),
            side("failures", ".jsonl"),
            side("aggregate_metrics", ".json"),
            side("state", ".json"),
        )

    def all(self) -> list[Path]:
        return [self.output, self.materialized_inputs, self.failures, self.aggregate_metrics, self.state]


def move_aside(paths: OutputPaths) -> None:
    """`+resume=false`: rename existing files to `<name>.bak` (replacing an older .bak)."""
    for path in paths.all():
        if path.exists():
            os.replace(path, path.with_name(path.name + ".bak"))


def check_same_input(
    paths: OutputPaths, fingerprint: str, input_jsonl_fpath: str, num_repeats: int | list[int], num_tasks: int
) -> None:
    """Raise ConfigError when the existing output was made from a different input (saying what differs)."""
    has_rows = paths.output.is_file() and paths.output.stat().st_size > 0
    fix = "pass a new +output_jsonl_fpath, or +resume=false to start over (the old files are moved aside as .bak)"
    if not paths.state.is_file():
        if has_rows:
            raise ConfigError(
                f"{paths.output} already has rollouts but no {paths.state.name}, so it cannot be resumed safely: {fix}"
            )
        return
    try:
        state = orjson.loads(paths.state.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{paths.state}: unreadable ({exc}): {fix}") from None
    if state.get("fingerprint") == fingerprint:
        return
    differences = []
    if state.get("num_repeats") != num_repeats:
        differences.append(f"num_repeats was {state.get('num_repeats')}, now {num_repeats}")
    if state.get("num_tasks") != num_tasks:
        differences.append(f"it had {state.get('num_tasks')} tasks, this input (after limit) has {num_tasks}")
    if not differences:
        differences.append("the task rows differ (their content, +responses_create_params or the agent)")
    raise ConfigError(
        f"{paths.output} was collected from a different input ({state.get('input_jsonl_fpath')}) than this command's "
        f"({input_jsonl_fpath}): {'; '.join(differences)}. To keep both, {fix}"
    )


def read_done(paths: OutputPaths, rollouts_per_task: Sequence[int]) -> dict[Pair, float]:
    """Rewards of the pairs already in the output (after cutting off an incomplete last line); `rollouts_per_task`
    [num_tasks]: how many rollouts each task of this input runs.

    Raises:
        DataError: (`file:line: ...`) a row whose pair is not one of this input's.
    """
    dropped = repair_truncated_tail(paths.output)
    if dropped:
        print(
            f"Dropped an incomplete last line ({dropped} bytes) of {paths.output}; that rollout runs again.",
            file=sys.stderr,
        )
    done: dict[Pair, float] = {}
    if not paths.output.is_file():
        return done
    for line_no, row in iter_jsonl(paths.output):
        pair = (row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY))
        valid = all(isinstance(i, int) for i in pair) and 0 <= pair[0] < len(rollouts_per_task)
        if not valid or not 0 <= pair[1] < rollouts_per_task[pair[0]]:
            raise DataError(
                f"{paths.output}:{line_no}: no valid ({TASK_INDEX_KEY}, {ROLLOUT_INDEX_KEY}) for this input: {pair};"
                " pass +resume=false to start over"
            )
        done.setdefault(pair, float(row.get("reward", math.nan)))
    return done


def read_failures(path: Path) -> dict[Pair, dict[str, Any]]:
    """The last failure record of each pair in an earlier failures file."""
    repair_truncated_tail(path)
    if not path.is_file():
        return {}
    return {
        (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]): row
        for _, row in iter_jsonl(path)
        if TASK_INDEX_KEY in row and ROLLOUT_INDEX_KEY in row
    }


def write_state(
    paths: OutputPaths,
    fingerprint: str,
    input_jsonl_fpath: str,
    num_repeats: int | list[int],
    num_tasks: int,
    **extra: Any,
) -> None:
    """Write `<out>_state.json` atomically; `num_repeats`: the rollouts of every task, or of each ([num_tasks], with
    NeMo Gym 0.7.0's `fan_out` or `num_repeats` dict); `extra` fields (e.g. the last watchdog stall) are added."""
    state = {
        "format": STATE_FORMAT,
        "fingerprint": fingerprint,
        "input_jsonl_fpath": input_jsonl_fpath,
        "num_tasks": num_tasks,
        "num_repeats": num_repeats,
        "updated_at": now(),
        **extra,
    }
    write_json(paths.state, state)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def compact_failures(path: Path, failures: dict[Pair, dict[str, Any]]) -> None:
    """Rewrite the failures file with the last record of each pair that still has no row (none: no file)."""
    if failures:
        write_jsonl(path, (failures[pair] for pair in sorted(failures)))
    else:
        path.unlink(missing_ok=True)


def write_rescored(output: Path, rows: Iterable[dict[str, Any]], failures: Sequence[dict[str, Any]]) -> Path:
    """The output of a command that scores rollouts again (`ng_group_verify`, `ng_reverify`): `rows` in `output` and
    the `failures` in its failures file (`OutputPaths`; an earlier one removed when there are none). Returns the
    failures file's path."""
    output.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(output, rows)
    path = OutputPaths.for_output(output).failures
    if failures:
        write_jsonl(path, failures)
    else:
        path.unlink(missing_ok=True)
    return path


def count_lines(path: Path) -> int:
    """The non-blank lines of a file (0 when there is none)."""
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())
