"""Two indexed rollout files compared (`ng_viewer +baseline_jsonl_fpath=`), without Gradio.

Each file's rows are summed per task with numpy (`np.bincount` over the index's task codes, so a file with a
million rows is one pass over arrays), turned into `nemo_gym.eval.comparison.TaskTally`s and paired by task key with
`nemo_gym.eval.comparison.pair_tasks`: the summary, the per-task deltas and the paired mean reward difference with its
bootstrap interval are the ones `ng_eval +baseline_rollouts=` reports. Rows without a finite reward are left out
(and counted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nemo_gym.eval.comparison import (
    PairedDifference,
    SideSummary,
    TaskKey,
    TaskPair,
    TaskTally,
    pair_tasks,
    paired_reward_difference,
    summarize,
)
from nemo_gym.viewer.index import RolloutIndex

__all__ = ["ComparedFiles", "TASK_COLUMNS", "STATUS_CHOICES", "side_tallies"]

SIDES = ("baseline", "candidate")
TASK_COLUMNS = [
    "task",
    "environment",
    "status",
    "baseline_n",
    "candidate_n",
    "baseline_reward",
    "candidate_reward",
    "reward_delta",
    "baseline_pass_rate",
    "candidate_pass_rate",
    "baseline_tool_calls",
    "candidate_tool_calls",
    "baseline_turns",
    "candidate_turns",
    "same_prompt",
]
STATUS_CHOICES = ["all", "in both", "baseline only", "candidate only", "improved", "worsened", "unchanged"]
_SUMMARY_METRICS = [
    ("tasks", "num_tasks"),
    ("rollouts", "num_rollouts"),
    ("mean reward", "mean_reward"),
    ("pass rate", "pass_rate"),
    ("tool calls per rollout", "tool_calls_per_rollout"),
    ("turns per rollout", "turns_per_rollout"),
]


def side_tallies(index: RolloutIndex, pass_threshold: float) -> tuple[dict[TaskKey, TaskTally], int]:
    """Per task key, the sums of its rated rows (reward finite); and the number of rows left out (no reward)."""
    rewards = index.rewards
    rated = np.isfinite(rewards)
    codes = index.column("task_key")[rated]
    n_codes = len(index.task_key_labels)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(codes, weights=values[rated].astype(float), minlength=n_codes)

    counts = np.bincount(codes, minlength=n_codes)
    sums, passed = total(rewards), total((rewards >= pass_threshold).astype(float))
    tool_calls, turns = total(index.column("tool_calls")), total(index.column("turns"))
    rated_ids = np.flatnonzero(rated)
    first_row = np.full(n_codes, -1, dtype=np.int64)
    present, first = np.unique(codes, return_index=True)
    first_row[present] = rated_ids[first]  # each task's first rated row
    prompts = index.column("prompt")
    tallies = {}
    for code in np.flatnonzero(counts):
        row = int(first_row[code])
        tallies[index.task_key_labels[code]] = TaskTally(
            environment=index.environment_of(row),
            prompt_digest=index.prompt_labels[prompts[row]],
            num_rollouts=int(counts[code]),
            reward_sum=float(sums[code]),
            num_passed=int(passed[code]),
            tool_calls=int(tool_calls[code]),
            turns=int(turns[code]),
            first_line=index.line_number(row),
        )
    return tallies, int((~rated).sum())


def _shown(value: float | int | None) -> float | int | None:
    """A number as the page shows it: 4 decimals for a float (0.4, not 0.3999999999999999)."""
    return round(value, 4) if isinstance(value, float) else value


def _tally_columns(tally: TaskTally | None) -> list[float | int | None]:
    if tally is None:
        return [0, None, None, None, None]
    n = tally.num_rollouts
    return [n, tally.mean_reward, tally.pass_rate, tally.tool_calls / n, tally.turns / n]


def _task_row(pair: TaskPair) -> list[object]:
    base, cand = _tally_columns(pair.baseline), _tally_columns(pair.candidate)
    interleaved = [value for both in zip(base, cand) for value in both]  # baseline_x, candidate_x for each x
    return [
        str(pair.key),
        pair.environment,
        pair.status,
        *interleaved[:4],
        pair.reward_delta,
        *interleaved[4:],
        pair.same_prompt,
    ]


@dataclass
class ComparedFiles:
    """A baseline and a candidate file, compared once when built (`ComparedFiles.build`)."""

    baseline: RolloutIndex
    candidate: RolloutIndex
    pass_threshold: float
    summaries: dict[str, SideSummary]
    difference: PairedDifference
    tasks: pd.DataFrame  # TASK_COLUMNS, one row per task of either file, sorted by key
    unrated_rows: dict[str, int]

    @classmethod
    def build(cls, baseline: RolloutIndex, candidate: RolloutIndex, pass_threshold: float = 1.0) -> ComparedFiles:
        (base, base_unrated), (cand, cand_unrated) = (
            side_tallies(baseline, pass_threshold),
            side_tallies(candidate, pass_threshold),
        )
        pairs = pair_tasks(base, cand)
        tasks = pd.DataFrame([_task_row(p) for p in pairs], columns=TASK_COLUMNS)
        return cls(
            baseline,
            candidate,
            pass_threshold,
            summaries={"baseline": summarize(base.values()), "candidate": summarize(cand.values())},
            difference=paired_reward_difference(pairs),
            tasks=tasks,
            unrated_rows={"baseline": base_unrated, "candidate": cand_unrated},
        )

    def index(self, side: str) -> RolloutIndex:
        return self.baseline if side == "baseline" else self.candidate

    def summary_table(self) -> pd.DataFrame:
        """Rows: tasks, rollouts, mean reward, pass rate, tool calls and turns per rollout; columns baseline,
        candidate and difference (candidate - baseline). Means are over each file's rollouts."""
        rows = []
        for label, name in _SUMMARY_METRICS:
            base, cand = (getattr(self.summaries[side], name) for side in SIDES)
            diff = None if base is None or cand is None else cand - base
            rows.append([label, *(_shown(v) for v in (base, cand, diff))])
        return pd.DataFrame(
            rows, columns=["metric", "baseline", "candidate", "difference"], dtype=object
        )  # counts stay integers

    def headline(self) -> str:
        """The paired difference and the tasks in one file only, as Markdown."""
        diff = self.difference
        counts = self.tasks["status"].value_counts()
        if diff.mean_difference is None:
            text = "No task is in both files: nothing to pair."
        else:
            low, high = diff.ci95 or (float("nan"), float("nan"))
            text = (
                f"Mean reward difference (candidate − baseline), paired by task over **{diff.num_tasks}** tasks in both"
                f" files: **{diff.mean_difference:+.4f}**, 95 % bootstrap interval [{low:+.4f}, {high:+.4f}]; improved"
                f" {diff.improved}, worsened {diff.worsened}, unchanged {diff.unchanged}."
            )
        text += (
            f" Tasks only in baseline: {counts.get('baseline only', 0)}; only in candidate:"
            f" {counts.get('candidate only', 0)}."
        )
        if diff.prompt_mismatches:
            text += f" **{len(diff.prompt_mismatches)} paired tasks have different prompts** (column same_prompt)."
        unrated = {side: n for side, n in self.unrated_rows.items() if n}
        if unrated:
            text += " Rows without a reward, left out: " + ", ".join(f"{side} {n}" for side, n in unrated.items()) + "."
        return text

    def filter_tasks(self, status: str) -> pd.DataFrame:
        """The per-task rows of one `STATUS_CHOICES` entry."""
        tasks, delta = self.tasks, self.tasks["reward_delta"].astype(float)
        masks = {
            "in both": tasks["status"] == "both",
            "baseline only": tasks["status"] == "baseline only",
            "candidate only": tasks["status"] == "candidate only",
            "improved": delta > 0,
            "worsened": delta < 0,
            "unchanged": delta == 0,
        }
        return tasks[masks[status]] if status in masks else tasks
