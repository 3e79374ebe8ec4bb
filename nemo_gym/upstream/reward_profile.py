"""`ng_reward_profile`: NeMo Gym 0.4.0's reward-profile command (its `ng_reward_profile`, `gym eval profile`), with
its parameters and its output files, computed with `nemo_gym.env.metrics.describe` (the statistics of `ng_profile`).

Parameters (NeMo Gym 0.4.0's `RewardProfileConfig`):
    materialized_inputs_jsonl_fpath  the collector's `<out>_materialized_inputs.jsonl`: one row per rollout as
                                     dispatched, with `_ng_task_index`, `_ng_rollout_index` and `agent_ref`
    rollouts_jsonl_fpath             the collector's output `<out>.jsonl`
    allow_partial_rollouts           profile the rollouts there are when some materialized rows have none
                                     (failed rollouts, an interrupted collection); else that is an error

Input rows and rollouts are matched on (`_ng_task_index`, `_ng_rollout_index`). A rollout's numeric fields are
its top-level numbers and booleans (as 0/1) with the numbers of `response.usage` merged over them, except the
two indices. Outputs, next to the rollouts file `<dir>/<stem>.jsonl`:

    <stem>_reward_profiling.jsonl  one row per task with rollouts, by task index:
        _ng_task_index
        <stat>/<field>                 for stat in mean, max, min, median, std and each numeric field
                                       (`mean/reward`, `std/reward`, `max/input_tokens`, ...)
        sample                         the task's first materialized row, without the two indices
        num_rollouts, expected_num_rollouts, missing_num_rollouts
        reward_profile_completion_pct  100 * num_rollouts / expected_num_rollouts
        rollout_infos                  per rollout, by index: rollout_id "<task>:<rollout>", the indices,
                                       reward, the usage numbers, then the rollout's numeric fields
    <stem>_agent_metrics.json      a list, one object per agent name (sorted): <stat>/<field> over all of
                                   the agent's rollouts, and agent_ref {name}

Statistics over the values a field has in the group (fields a rollout lacks are skipped, as pandas skips NaN):
`std` is the sample standard deviation (divides by n - 1); a group of one rollout has std 0.0 for each of its
fields, and a field with one value among several rollouts has no std key (NeMo Gym: `DataFrame.std`, ddof=1,
whose NaNs it replaces by 0 only when the whole group has no std). Numbers are floats (NeMo Gym writes
`max/input_tokens` 244 as 244.0); means are exact sums, so they may differ from pandas's in the last bits
(tests/test_reward_profile_parity.py compares with a relative tolerance of 1e-12).

Differences from NeMo Gym 0.4.0: a bad row is a `DataError` naming `file:line` (a missing index or `agent_ref`,
a duplicate rollout key, a rollout without a numeric reward; NeMo Gym raises KeyError or counts a missing
reward out); no W&B histograms (NeMo Gym drops them before writing too).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.env.metrics import Pair, is_number, profile_groups
from nemo_gym.errors import DataError
from nemo_gym.jsonl import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl, replace_atomically, write_jsonl

__all__ = ["RewardProfileConfig", "RewardProfile", "reward_profile", "reward_profile_main", "output_paths"]

MAX_LISTED = 10


class RewardProfileConfig(BaseModel):
    """Parameters of `ng_reward_profile` (NeMo Gym 0.4.0's names)."""

    model_config = ConfigDict(extra="forbid")
    materialized_inputs_jsonl_fpath: str = Field(
        description=(
            "the collector's <out>_materialized_inputs.jsonl (one row per rollout, with _ng_task_index,"
            " _ng_rollout_index, agent_ref)"
        )
    )
    rollouts_jsonl_fpath: str = Field(
        description=(
            "the rollouts (<out>.jsonl); outputs <stem>_reward_profiling.jsonl and <stem>_agent_metrics.json go next"
            " to it"
        )
    )
    allow_partial_rollouts: bool = Field(
        False,
        description=(
            "profile the completed rollouts when some materialized rows have none (they are counted in"
            " missing_num_rollouts)"
        ),
    )


@dataclass(frozen=True)
class RewardProfile:
    """What `reward_profile` wrote, and the completion counts it prints."""

    profiling_fpath: Path
    agent_metrics_fpath: Path
    expected_rollouts: int
    completed_rollouts: int
    tasks: int
    tasks_complete: int
    tasks_partial: int
    tasks_without_rollouts: int

    def format(self) -> str:
        pct = 100.0 * self.completed_rollouts / self.expected_rollouts if self.expected_rollouts else 100.0
        return "\n".join(
            [
                (
                    f"Reward profile completion: {self.completed_rollouts}/{self.expected_rollouts} rollout rows"
                    f" ({pct:.2f}%)"
                ),
                (
                    f"Input rows: {self.tasks} total; {self.tasks_complete} complete; {self.tasks_partial} partial; "
                    f"{self.tasks_without_rollouts} without rollouts dropped from output."
                ),
                f"Reward profiling outputs: {self.profiling_fpath}",
                f"Agent-level metrics: {self.agent_metrics_fpath}",
            ]
        )


def output_paths(rollouts_jsonl_fpath: str | Path) -> tuple[Path, Path]:
    """`<stem>_reward_profiling.jsonl` and `<stem>_agent_metrics.json` next to the rollouts file."""
    path = Path(rollouts_jsonl_fpath)
    return path.with_name(f"{path.stem}_reward_profiling.jsonl"), path.with_name(f"{path.stem}_agent_metrics.json")


def _index(path: str, what: str, hint: str) -> dict[Pair, tuple[int, dict[str, Any]]]:
    """(task index, rollout index) → (line number, row)."""
    rows: dict[Pair, tuple[int, dict[str, Any]]] = {}
    for line_no, row in iter_jsonl(path):
        task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in (task, rollout)):
            raise DataError(
                f"{path}:{line_no}: {what} has no integer {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY} (got {task!r},"
                f" {rollout!r}); {hint}"
            )
        if (task, rollout) in rows:
            raise DataError(
                f"{path}:{line_no}: a second {what} with key ({task}, {rollout}) (the first is line"
                f" {rows[task, rollout][0]})"
            )
        rows[task, rollout] = (line_no, row)
    return rows


def _load(cfg: RewardProfileConfig) -> tuple[dict[Pair, dict[str, Any]], dict[Pair, dict[str, Any]]]:
    """Materialized rows and the rollouts matched with them, both keyed by (task, rollout), checked."""
    inputs = _index(
        cfg.materialized_inputs_jsonl_fpath,
        "materialized input row",
        "pass the collector's <out>_materialized_inputs.jsonl",
    )
    rollouts = _index(cfg.rollouts_jsonl_fpath, "rollout", "was it written by ng_collect_rollouts?")
    extra = sorted(rollouts.keys() - inputs.keys())
    if extra:
        line_no = rollouts[extra[0]][0]
        raise DataError(
            f"{cfg.rollouts_jsonl_fpath}:{line_no}: {len(extra)} rollouts have no row in"
            f" {cfg.materialized_inputs_jsonl_fpath} (first keys: {extra[:MAX_LISTED]}); are they the materialized"
            " inputs of this collection?"
        )
    missing = sorted(inputs.keys() - rollouts.keys())
    if missing and not cfg.allow_partial_rollouts:
        raise DataError(
            f"{cfg.rollouts_jsonl_fpath}: {len(missing)} of {len(inputs)} materialized input rows have no rollout"
            f" (first keys: {missing[:MAX_LISTED]}; failed rollouts are in <out>_failures.jsonl, and rerunning the"
            " collection retries them); +allow_partial_rollouts=true profiles the completed rollouts"
        )
    for line_no, rollout in rollouts.values():
        reward = rollout.get("reward")
        if not is_number(reward) or isinstance(reward, bool):
            raise DataError(f"{cfg.rollouts_jsonl_fpath}:{line_no}: rollout has no numeric reward (got {reward!r})")
    for pair, (line_no, row) in inputs.items():
        agent_ref = row.get("agent_ref")
        if pair in rollouts and not (isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str)):
            raise DataError(
                f"{cfg.materialized_inputs_jsonl_fpath}:{line_no}: materialized input row has no agent_ref {{name:"
                f" ...}} (got {agent_ref!r})"
            )
    return {p: row for p, (_, row) in inputs.items()}, {p: row for p, (_, row) in sorted(rollouts.items())}


def reward_profile(cfg: RewardProfileConfig) -> RewardProfile:
    """Write `<stem>_reward_profiling.jsonl` and `<stem>_agent_metrics.json` (module docstring) and return the counts.

    Raises:
        DataError: a bad line in either file (`file:line:`), rollouts without a materialized row, or (without
            `allow_partial_rollouts`) materialized rows without a rollout.
    """
    inputs, rollouts = _load(cfg)
    task_rows, agent_rows = profile_groups(inputs, rollouts)
    profiling_fpath, agent_metrics_fpath = output_paths(cfg.rollouts_jsonl_fpath)
    write_jsonl(profiling_fpath, task_rows)
    replace_atomically(agent_metrics_fpath, orjson.dumps(agent_rows))  # one line, as NeMo Gym writes it
    expected: dict[int, int] = defaultdict(int)
    for task, _ in inputs:
        expected[task] += 1
    completed: dict[int, int] = defaultdict(int)
    for task, _ in rollouts:
        completed[task] += 1
    return RewardProfile(
        profiling_fpath=profiling_fpath,
        agent_metrics_fpath=agent_metrics_fpath,
        expected_rollouts=len(inputs),
        completed_rollouts=len(rollouts),
        tasks=len(expected),
        tasks_complete=sum(1 for t, n in expected.items() if completed.get(t) == n),
        tasks_partial=sum(1 for t, n in expected.items() if 0 < completed.get(t, 0) < n),
        tasks_without_rollouts=sum(1 for t in expected if t not in completed),
    )


def reward_profile_main(cfg: RewardProfileConfig) -> int:
    """`ng_reward_profile`: write the profile and print where it went. Returns 0 (errors raise `NemoGymError`)."""
    print(reward_profile(cfg).format())
    return 0
