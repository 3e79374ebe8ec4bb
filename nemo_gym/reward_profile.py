"""`ng_reward_profile`: NeMo Gym 0.4.0's reward-profile command (its `ng_reward_profile`, `gym eval profile`), with
its parameters and its output files, computed with `nemo_gym.profile.describe` (the statistics of `ng_profile`).

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

from nemo_gym.errors import DataError
from nemo_gym.jsonl import iter_jsonl, replace_atomically, write_jsonl
from nemo_gym.profile import ROLLOUT_INDEX_KEY, STATS, TASK_INDEX_KEY, describe

__all__ = ["RewardProfileConfig", "RewardProfile", "reward_profile", "reward_profile_main", "profile_groups", "nemo_gym_aggregate_metrics", "numeric_fields", "output_paths"]

Pair = tuple[int, int]  # (task index, rollout index)
MAX_LISTED = 10


class RewardProfileConfig(BaseModel):
    """Parameters of `ng_reward_profile` (NeMo Gym 0.4.0's names)."""

    model_config = ConfigDict(extra="forbid")
    materialized_inputs_jsonl_fpath: str = Field(
        description="the collector's <out>_materialized_inputs.jsonl (one row per rollout, with _ng_task_index, _ng_rollout_index, agent_ref)"
    )
    rollouts_jsonl_fpath: str = Field(
        description="the rollouts (<out>.jsonl); outputs <stem>_reward_profiling.jsonl and <stem>_agent_metrics.json go next to it"
    )
    allow_partial_rollouts: bool = Field(
        False, description="profile the completed rollouts when some materialized rows have none (they are counted in missing_num_rollouts)"
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
                f"Reward profile completion: {self.completed_rollouts}/{self.expected_rollouts} rollout rows ({pct:.2f}%)",
                f"Input rows: {self.tasks} total; {self.tasks_complete} complete; {self.tasks_partial} partial; "
                f"{self.tasks_without_rollouts} without rollouts dropped from output.",
                f"Reward profiling outputs: {self.profiling_fpath}",
                f"Agent-level metrics: {self.agent_metrics_fpath}",
            ]
        )


def output_paths(rollouts_jsonl_fpath: str | Path) -> tuple[Path, Path]:
    """`<stem>_reward_profiling.jsonl` and `<stem>_agent_metrics.json` next to the rollouts file."""
    path = Path(rollouts_jsonl_fpath)
    return path.with_name(f"{path.stem}_reward_profiling.jsonl"), path.with_name(f"{path.stem}_agent_metrics.json")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # booleans included: they count as 0/1


def _usage(rollout: dict[str, Any]) -> dict[str, Any]:
    response = rollout.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else {}


def numeric_fields(rollout: dict[str, Any]) -> dict[str, int | float]:
    """The fields profiled for one rollout: top-level numbers and booleans (as 0/1) with `response.usage`'s numbers
    merged over them, without `_ng_task_index` and `_ng_rollout_index`."""
    merged = {**rollout, **_usage(rollout)}
    return {k: int(v) if isinstance(v, bool) else v for k, v in merged.items() if _is_number(v) and k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)}


def _rollout_info(pair: Pair, rollout: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"rollout_id": f"{pair[0]}:{pair[1]}", TASK_INDEX_KEY: pair[0], ROLLOUT_INDEX_KEY: pair[1]}
    if "reward" in rollout:
        info["reward"] = rollout["reward"]
    skip = {TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, "reward", "response"}
    for k, v in [*_usage(rollout).items(), *((k, v) for k, v in rollout.items() if k not in skip)]:
        if _is_number(v):
            info[k] = int(v) if isinstance(v, bool) else v
    return info


def _group_stats(rollouts: list[dict[str, int | float]], field_order: list[str]) -> dict[str, float]:
    """`<stat>/<field>` over one group's rollouts (their `numeric_fields`); see the module docstring for std."""
    values: dict[str, list[float]] = defaultdict(list)
    for fields in rollouts:
        for k, v in fields.items():
            values[k].append(v)
    described = {k: describe(v) for k, v in values.items()}
    for k, v in values.items():
        if len(v) == 1 and len(rollouts) > 1:  # one value among several rollouts: no std (pandas: NaN, dropped)
            del described[k]["std"]
    return {f"{stat}/{k}": described[k][stat] for stat in STATS for k in field_order if stat in described.get(k, {})}


def _index(path: str, what: str, hint: str) -> dict[Pair, tuple[int, dict[str, Any]]]:
    """(task index, rollout index) → (line number, row)."""
    rows: dict[Pair, tuple[int, dict[str, Any]]] = {}
    for line_no, row in iter_jsonl(path):
        task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in (task, rollout)):
            raise DataError(f"{path}:{line_no}: {what} has no integer {TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY} (got {task!r}, {rollout!r}); {hint}")
        if (task, rollout) in rows:
            raise DataError(f"{path}:{line_no}: a second {what} with key ({task}, {rollout}) (the first is line {rows[task, rollout][0]})")
        rows[task, rollout] = (line_no, row)
    return rows


def _load(cfg: RewardProfileConfig) -> tuple[dict[Pair, dict[str, Any]], dict[Pair, dict[str, Any]]]:
    """Materialized rows and the rollouts matched with them, both keyed by (task, rollout), checked."""
    inputs = _index(cfg.materialized_inputs_jsonl_fpath, "materialized input row", "pass the collector's <out>_materialized_inputs.jsonl")
    rollouts = _index(cfg.rollouts_jsonl_fpath, "rollout", "was it written by ng_collect_rollouts?")
    extra = sorted(rollouts.keys() - inputs.keys())
    if extra:
        line_no = rollouts[extra[0]][0]
        raise DataError(
            f"{cfg.rollouts_jsonl_fpath}:{line_no}: {len(extra)} rollouts have no row in {cfg.materialized_inputs_jsonl_fpath} "
            f"(first keys: {extra[:MAX_LISTED]}); are they the materialized inputs of this collection?"
        )
    missing = sorted(inputs.keys() - rollouts.keys())
    if missing and not cfg.allow_partial_rollouts:
        raise DataError(
            f"{cfg.rollouts_jsonl_fpath}: {len(missing)} of {len(inputs)} materialized input rows have no rollout (first keys: {missing[:MAX_LISTED]}; "
            "failed rollouts are in <out>_failures.jsonl, and rerunning the collection retries them); "
            "+allow_partial_rollouts=true profiles the completed rollouts"
        )
    for line_no, rollout in rollouts.values():
        reward = rollout.get("reward")
        if not _is_number(reward) or isinstance(reward, bool):
            raise DataError(f"{cfg.rollouts_jsonl_fpath}:{line_no}: rollout has no numeric reward (got {reward!r})")
    for pair, (line_no, row) in inputs.items():
        agent_ref = row.get("agent_ref")
        if pair in rollouts and not (isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str)):
            raise DataError(f"{cfg.materialized_inputs_jsonl_fpath}:{line_no}: materialized input row has no agent_ref {{name: ...}} (got {agent_ref!r})")
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


def profile_groups(inputs: dict[Pair, dict[str, Any]], rollouts: dict[Pair, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of `<stem>_reward_profiling.jsonl` (one per task with rollouts) and of `<stem>_agent_metrics.json`
    (one per agent name) for materialized rows and their rollouts, both keyed by (task, rollout); see the module
    docstring for the fields. `rollouts` must be sorted by key; every rollout's pair is in `inputs`."""
    fields = {pair: numeric_fields(rollout) for pair, rollout in rollouts.items()}
    field_order = list(dict.fromkeys(k for f in fields.values() for k in f))
    expected: dict[int, int] = defaultdict(int)
    for task, _ in inputs:
        expected[task] += 1
    by_task: dict[int, list[Pair]] = defaultdict(list)
    by_agent: dict[str, list[Pair]] = defaultdict(list)
    for pair in rollouts:  # sorted by (task, rollout)
        by_task[pair[0]].append(pair)
        by_agent[inputs[pair]["agent_ref"]["name"]].append(pair)

    task_rows = []
    for task in sorted(by_task):
        pairs = by_task[task]
        sample = {k: v for k, v in inputs[pairs[0]].items() if k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)}
        task_rows.append(
            {
                TASK_INDEX_KEY: task,
                **_group_stats([fields[p] for p in pairs], field_order),
                "sample": sample,
                "num_rollouts": len(pairs),
                "expected_num_rollouts": expected[task],
                "missing_num_rollouts": expected[task] - len(pairs),
                "reward_profile_completion_pct": 100.0 * len(pairs) / expected[task],
                "rollout_infos": [_rollout_info(p, rollouts[p]) for p in pairs],
            }
        )
    agent_rows = [{**_group_stats([fields[p] for p in by_agent[name]], field_order), "agent_ref": {"name": name}} for name in sorted(by_agent)]
    return task_rows, agent_rows


def nemo_gym_aggregate_metrics(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """NeMo Gym 0.4.0's `/aggregate_metrics` answer (`AggregateMetrics`) for verify answers: `group_level_metrics`
    (one `profile_groups` task row per `_ng_task_index`), `agent_metrics` (the statistics over all of them) and
    `key_metrics` (its `mean/*` entries, NeMo Gym's default headline). Answers without indices count as task 0,
    numbered in order, as NeMo Gym does; `{}`-valued keys for no answers."""
    if not verify_responses:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    inputs: dict[Pair, dict[str, Any]] = {}
    rollouts: dict[Pair, dict[str, Any]] = {}
    for answer in verify_responses:
        task, rollout = answer.get(TASK_INDEX_KEY, 0), answer.get(ROLLOUT_INDEX_KEY, 0)
        while (task, rollout) in rollouts:  # repeated or missing indices: the next free rollout number
            rollout += 1
        inputs[task, rollout] = {TASK_INDEX_KEY: task, ROLLOUT_INDEX_KEY: rollout, "agent_ref": {"name": "agent"}}
        rollouts[task, rollout] = answer
    task_rows, agent_rows = profile_groups(inputs, dict(sorted(rollouts.items())))
    agent_metrics = {k: v for k, v in agent_rows[0].items() if k != "agent_ref"}
    return {"group_level_metrics": task_rows, "agent_metrics": agent_metrics, "key_metrics": {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}}


def reward_profile_main(cfg: RewardProfileConfig) -> int:
    """`ng_reward_profile`: write the profile and print where it went. Returns 0 (errors raise `NemoGymError`)."""
    print(reward_profile(cfg).format())
    return 0
