"""`ng_reward_profile`: NeMo Gym's reward-profile command (its `ng_reward_profile`, `gym eval profile`), with its
parameters and its output files, as NeMo Gym 0.7.0 writes them (`+nemo_gym_version=0.4.0`: as 0.4.0 writes them),
computed with `nemo_gym.env.metrics.describe` (the statistics of `ng_profile`).

Parameters (NeMo Gym's `RewardProfileConfig`):
    materialized_inputs_jsonl_fpath  the collector's `<out>_materialized_inputs.jsonl`: one row per rollout as
                                     dispatched, with `_ng_task_index`, `_ng_rollout_index` and `agent_ref`
    rollouts_jsonl_fpath             the collector's output `<out>.jsonl`
    allow_partial_rollouts           profile the rollouts there are when some materialized rows have none
                                     (failed rollouts, an interrupted collection); else that is an error
    nemo_gym_version                 0.7.0 (default) or 0.4.0: whose output files to write

Input rows and rollouts are matched on (`_ng_task_index`, `_ng_rollout_index`). A rollout's numeric fields are
its top-level numbers and booleans (as 0/1) with the numbers of `response.usage` merged over them, except the
two indices (0.7.0: except every `_`-prefixed key). Outputs, next to the rollouts file `<dir>/<stem>.jsonl`:

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
                                   the agent's rollouts, and agent_ref {name}; 0.7.0 adds the across-repeats
                                   and coverage keys of `nemo_gym.upstream.repeat_metrics`
    <stem>_repeat_level_metrics.json  (0.7.0) per agent and rollout index, statistics over the tasks
                                   (`nemo_gym.upstream.repeat_metrics`)

NeMo Gym 0.7.0's masked rollouts (`mask_sample: true`, e.g. a judge that failed) are left out of every statistic
and counted (`coverage/*` of their agent; "Masked from quality metrics" printed); completion counts still include
them. Agents are named by NeMo Gym 0.7.0's run labels: the agent's name, or its environment server's
(`_ng_environment_server`) when several front it.

Statistics over the values a field has in the group (fields a rollout lacks are skipped, as pandas skips NaN):
`std` is the sample standard deviation (divides by n - 1); a group of one rollout has std 0.0 for each of its
fields, and a field with one value among several rollouts has no std key (NeMo Gym: `DataFrame.std`, ddof=1,
whose NaNs it replaces by 0 only when the whole group has no std). Numbers are floats (NeMo Gym writes
`max/input_tokens` 244 as 244.0); means are exact sums, so they may differ from pandas's in the last bits
(tests/test_reward_profile_parity.py and tests/test_nemo_gym07.py compare with a relative tolerance of 1e-12).

Differences from NeMo Gym: a bad row is a `DataError` naming `file:line` (a missing index or `agent_ref`,
a duplicate rollout key, a rollout without a numeric reward; NeMo Gym raises KeyError or counts a missing
reward out); no W&B histograms (NeMo Gym drops them before writing too). A task sent to several agents (0.7.0's
`fan_out`) is profiled per (task, agent) with 0.7.0's output, one task row per pair with its `agent_ref`; 0.4.0's
output profiles per task.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import (
    ENVIRONMENT_SERVER_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    iter_jsonl,
    replace_atomically,
    write_jsonl,
)
from nemo_gym.env.metrics import MASK_SAMPLE_KEY, Pair, is_number, numeric_fields, profile_groups
from nemo_gym.upstream.repeat_metrics import across_repeats, coverage_metrics, repeat_level_metrics

__all__ = [
    "RewardProfileConfig",
    "RewardProfile",
    "reward_profile",
    "reward_profile_main",
    "output_paths",
    "repeat_level_metrics_path",
]

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
    nemo_gym_version: Literal["0.7.0", "0.4.0"] = Field(
        "0.7.0",
        description=(
            "whose output to write: 0.7.0 (masked rollouts left out and counted, repeat-level metrics,"
            " across-repeats and coverage keys) or 0.4.0 (its two files, every rollout profiled)"
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
    repeat_level_metrics_fpath: Path | None = None  # NeMo Gym 0.7.0's output only
    masked_rollouts: int | None = None  # NeMo Gym 0.7.0's output only

    def format(self) -> str:
        pct = 100.0 * self.completed_rollouts / self.expected_rollouts if self.expected_rollouts else 100.0
        lines = [
            f"Reward profile completion: {self.completed_rollouts}/{self.expected_rollouts} rollout rows ({pct:.2f}%)",
            (
                f"Input rows: {self.tasks} total; {self.tasks_complete} complete; {self.tasks_partial} partial; "
                f"{self.tasks_without_rollouts} without rollouts dropped from output."
            ),
        ]
        if self.masked_rollouts is not None:
            lines.append(
                f"Masked from quality metrics: {self.masked_rollouts} rollout rows (kept in completion accounting"
                " above)."
            )
        lines += [
            f"Reward profiling outputs: {self.profiling_fpath}",
            f"Agent-level metrics: {self.agent_metrics_fpath}",
        ]
        if self.repeat_level_metrics_fpath is not None:
            lines.append(f"Repeat-level metrics: {self.repeat_level_metrics_fpath}")
        return "\n".join(lines)


def output_paths(rollouts_jsonl_fpath: str | Path) -> tuple[Path, Path]:
    """`<stem>_reward_profiling.jsonl` and `<stem>_agent_metrics.json` next to the rollouts file."""
    path = Path(rollouts_jsonl_fpath)
    return path.with_name(f"{path.stem}_reward_profiling.jsonl"), path.with_name(f"{path.stem}_agent_metrics.json")


def repeat_level_metrics_path(rollouts_jsonl_fpath: str | Path) -> Path:
    """`<stem>_repeat_level_metrics.json` next to the rollouts file (NeMo Gym 0.7.0's third output)."""
    path = Path(rollouts_jsonl_fpath)
    return path.with_name(f"{path.stem}_repeat_level_metrics.json")


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


def _run_labels(inputs: dict[Pair, dict[str, Any]]) -> dict[Pair, str]:
    """Per rollout, the name its rows are grouped under: its agent's name, or (NeMo Gym 0.7.0's `label_runs`) the
    environment server (`_ng_environment_server`) that ran it when several environment servers front that agent or
    a name would repeat."""
    run_of = {pair: row.get(ENVIRONMENT_SERVER_KEY) or row["agent_ref"]["name"] for pair, row in inputs.items()}
    agent_of_run = {run_of[pair]: row["agent_ref"]["name"] for pair, row in inputs.items()}
    runs_of_agent: dict[str, set[str]] = defaultdict(set)
    for run, agent in agent_of_run.items():
        runs_of_agent[agent].add(run)
    labels = {run: agent if len(runs_of_agent[agent]) == 1 else run for run, agent in agent_of_run.items()}
    while clashing := [r for r, label in labels.items() if label != r and list(labels.values()).count(label) > 1]:
        labels.update({run: run for run in clashing})
    return {pair: labels[run] for pair, run in run_of.items()}


def _fanned_out(labels: dict[Pair, str]) -> bool:
    """Whether some task ran through several agents (NeMo Gym 0.7.0's `fan_out`): then it is profiled per (task,
    agent), as 0.7.0 profiles it."""
    return len({(task, label) for (task, _), label in labels.items()}) > len({task for task, _ in labels})


def _profile_07(
    cfg: RewardProfileConfig, inputs: dict[Pair, dict[str, Any]], rollouts: dict[Pair, dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], set[Pair]]:
    """NeMo Gym 0.7.0's profile: task rows, agent rows (with across-repeats and coverage keys), repeat rows, and the
    masked rollouts (`mask_sample`, left out of every statistic; 0.7.0's `select_measured`)."""
    labels = _run_labels(inputs)
    per_agent = _fanned_out(labels)
    masked = {pair for pair, rollout in rollouts.items() if rollout.get(MASK_SAMPLE_KEY)}
    measured = {p: {k: v for k, v in r.items() if k != MASK_SAMPLE_KEY} for p, r in rollouts.items() if p not in masked}
    measured_inputs = {pair: row for pair, row in inputs.items() if pair not in masked}
    for pair, label in labels.items():  # agent rows are named by label (0.7.0: agent_name from rollout_run_labels)
        if pair in measured_inputs:
            measured_inputs[pair] = {**measured_inputs[pair], "agent_ref": {"name": label}}
    task_rows, agent_rows = profile_groups(measured_inputs, measured, private_keys=False, per_agent=per_agent)
    first_of_group: dict[tuple[int, str | None], Pair] = {}
    for pair in measured:  # sorted: a group's first measured rollout
        first_of_group.setdefault((pair[0], labels[pair] if per_agent else None), pair)
    for row in task_rows:  # the sample keeps its own row's agent_ref
        pair = first_of_group[row[TASK_INDEX_KEY], row["agent_ref"]["name"] if per_agent else None]
        row["sample"] = {k: v for k, v in inputs[pair].items() if k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)}
    fields = {pair: numeric_fields(rollout, private_keys=False) for pair, rollout in measured.items()}
    repeat_rows = repeat_level_metrics(fields, {pair: labels[pair] for pair in measured})
    extra = across_repeats(repeat_rows)
    for row in agent_rows:
        row |= extra.get(row["agent_ref"]["name"], {})
    pairs_of_agent: dict[str, list[Pair]] = defaultdict(list)
    for pair in rollouts:
        pairs_of_agent[inputs[pair]["agent_ref"]["name"]].append(pair)
    coverage = {name: c for name, pairs in pairs_of_agent.items() if (c := coverage_metrics(pairs, masked))}
    for row in agent_rows:
        row |= coverage.pop(row["agent_ref"]["name"], {})
    agent_rows += [{"agent_ref": {"name": name}, **c} for name, c in coverage.items()]
    return task_rows, agent_rows, repeat_rows, masked


def reward_profile(cfg: RewardProfileConfig) -> RewardProfile:
    """Write `<stem>_reward_profiling.jsonl`, `<stem>_agent_metrics.json` and (NeMo Gym 0.7.0's output)
    `<stem>_repeat_level_metrics.json` (module docstring) and return the counts.

    Raises:
        DataError: a bad line in either file (`file:line:`), rollouts without a materialized row, (without
            `allow_partial_rollouts`) materialized rows without a rollout.
    """
    inputs, rollouts = _load(cfg)
    profiling_fpath, agent_metrics_fpath = output_paths(cfg.rollouts_jsonl_fpath)
    extra: dict[str, Any] = {}
    if cfg.nemo_gym_version == "0.4.0":
        task_rows, agent_rows = profile_groups(inputs, rollouts)
    else:
        task_rows, agent_rows, repeat_rows, masked = _profile_07(cfg, inputs, rollouts)
        extra = {"repeat_level_metrics_fpath": repeat_level_metrics_path(cfg.rollouts_jsonl_fpath)}
        extra["masked_rollouts"] = len(masked)
        replace_atomically(extra["repeat_level_metrics_fpath"], orjson.dumps(repeat_rows))
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
        **extra,
    )


def reward_profile_main(cfg: RewardProfileConfig) -> int:
    """`ng_reward_profile`: write the profile and print where it went. Returns 0 (errors raise `NemoGymError`)."""
    print(reward_profile(cfg).format())
    return 0
