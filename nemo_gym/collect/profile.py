"""Reward profiling (`ng_profile`): per-task reward statistics from collected rollouts.

For each task of the input JSONL that has rollouts (matched by `_ng_task_index`), the output has one row: the
task row plus

    avg_reward     mean reward of the task's rollouts
    std_reward     SAMPLE standard deviation: sqrt(sum((r - mean)^2) / (n - 1)); 0.0 for one rollout
    min_reward, max_reward, median_reward
    total_samples  number of rollouts (measured ones: masked rollouts are left out)
    masked_samples number of masked rollouts (only when the task has some)
and with `pass_threshold`:
    pass_rate         passed / total (a rollout passes when reward >= pass_threshold)
    pass_rate_total   total rollouts
    pass_rate_passed  rollouts that passed
    pass_threshold    the threshold used

Source of the numbers: NeMo Gym 0.4.0's `ng_reward_profile` (`nemo_gym.upstream.reward_profile` here writes its output
shape): avg/std/min/max/median_reward equal its per-task `mean/reward`, `std/reward`, `min/reward`,
`max/reward`, `median/reward` (pandas `DataFrame.std`, ddof=1, with 0 for a task of one rollout) and
`total_samples` its `num_rollouts`; tests/test_reward_profile_parity.py runs both on the same files. The field
names and the pass-rate fields come from the per-task profile of NeMo Gym's collector before 0.4.0
(`ng_collect_rollouts +output_profiled_jsonl_fpath=... +pass_threshold=...`, `>=` threshold), which divided
by n (population std: [1, 0] gave 0.5 where the sample std is 0.7071); 0.4.0 dropped it, and we follow
0.4.0's definition, the same one the GRPO advantages use (`nemo_gym.rl.advantages`). Other differences: a
rollout without a numeric reward is an error here (the old collector counted it as 0.0); `_ng_*` keys are
dropped from the task row and the old `task_name: null` is not added; tasks without rollouts are omitted from
the output and listed in the summary.

Masked rollouts (NeMo Gym 0.7.0's `mask_sample: true` in the verify answer: the environment failed, e.g. a judge that
did not answer, so the reward is not a measurement; `nemo_gym.env.metrics.mask_reason`) are left out of every
statistic, as 0.7.0's `reward_profile.select_measured` leaves them out, and counted: per task (`masked_samples`), in
the summary by `failure_kind`, and the tasks whose rollouts were all masked are omitted and listed (0.7.0's
`coverage/masked_rollouts` and `coverage/fully_masked_tasks`).

A task whose rollouts ran through several agents (`+fan_out`) has one row per agent, its `agent_ref` that agent's
(each agent's rollouts are a group of their own, as 0.7.0's `ng_reward_profile` profiles per task and agent; an agent
whose rollouts of the task were all masked has no row, and its masked rollouts are counted in the summary only); a
task of one agent has one row, as before.

The input is either the collector's input (task index = position among non-blank rows) or its
`_materialized_inputs.jsonl` (rows carry `_ng_task_index`; the first row of each index is the task).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import TASK_INDEX_KEY, iter_jsonl, write_jsonl
from nemo_gym.env.metrics import describe, mask_reason

__all__ = ["ProfileConfig", "ProfileSummary", "profile_rollouts", "profile_main", "reward_stats"]

MAX_LISTED = 20


class ProfileConfig(BaseModel):
    """Parameters of `ng_profile`."""

    model_config = ConfigDict(extra="forbid")
    input_jsonl_fpath: str = Field(
        description="the tasks: the collector's input JSONL (or its _materialized_inputs.jsonl)"
    )
    rollouts_jsonl_fpath: str = Field(
        description="the rollouts written by ng_collect_rollouts (rows carry _ng_task_index and reward)"
    )
    output_jsonl_fpath: str = Field(
        description=(
            "output JSONL: one row per task with avg_reward, std_reward, min_reward, max_reward, total_samples (and"
            " pass_rate...)"
        )
    )
    pass_threshold: float | None = Field(
        None,
        description=(
            "a rollout passes when reward >= pass_threshold; adds pass_rate, pass_rate_total, pass_rate_passed,"
            " pass_threshold"
        ),
    )


def reward_stats(rewards: list[float], pass_threshold: float | None = None) -> dict[str, Any]:
    """Statistics of one task's rewards (non-empty list); see the module docstring for the fields."""
    d = describe(rewards)
    stats: dict[str, Any] = {
        "avg_reward": d["mean"],
        "std_reward": d["std"],
        "min_reward": d["min"],
        "max_reward": d["max"],
        "median_reward": d["median"],
        "total_samples": len(rewards),
    }
    if pass_threshold is not None:
        passed = sum(1 for r in rewards if r >= pass_threshold)
        stats |= {
            "pass_rate": passed / len(rewards),
            "pass_rate_total": len(rewards),
            "pass_rate_passed": passed,
            "pass_threshold": pass_threshold,
        }
    return stats


@dataclass
class ProfileSummary:
    """Totals of a profile. `group_mean_reward` maps `agent:<name>` / `dataset:<name>` to the mean reward."""

    tasks: int
    tasks_profiled: int
    tasks_without_rollouts: list[int]
    samples: int
    mean_reward: float | None
    pass_threshold: float | None
    pass_rate: float | None
    tasks_all_same_reward: int
    group_mean_reward: dict[str, float] = field(default_factory=dict)
    output_jsonl_fpath: str = ""
    masked_samples: int = 0  # rollouts left out of the statistics (mask_sample)
    masked_reasons: dict[str, int] = field(default_factory=dict)  # failure_kind -> masked rollouts
    tasks_fully_masked: list[int] = field(default_factory=list)  # every rollout masked: omitted from the output

    def format(self) -> str:
        mean = "n/a" if self.mean_reward is None else f"{self.mean_reward:.4f}"
        lines = [
            f"Tasks: {self.tasks_profiled}/{self.tasks} profiled, {self.samples} samples, mean reward {mean}",
            f"Tasks whose samples all have the same reward (no learning signal for GRPO): {self.tasks_all_same_reward}",
        ]
        if self.pass_threshold is not None and self.pass_rate is not None:
            lines.append(f"Pass rate (reward >= {self.pass_threshold}): {self.pass_rate:.4f} of samples")
        for group, value in sorted(self.group_mean_reward.items()):
            lines.append(f"  {group}: mean reward {value:.4f}")
        if self.masked_samples:
            reasons = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.masked_reasons.items()))
            lines.append(
                f"Masked samples (mask_sample: the environment failed, the reward is no measurement), left out of the"
                f" statistics: {self.masked_samples} ({reasons})"
            )
        for what, indices in (
            ("Tasks without rollouts", self.tasks_without_rollouts),
            ("Tasks whose rollouts were all masked", self.tasks_fully_masked),
        ):
            if indices:
                shown = ", ".join(map(str, indices[:MAX_LISTED]))
                more = f" and {len(indices) - MAX_LISTED} more" if len(indices) > MAX_LISTED else ""
                lines.append(f"{what} (omitted from the output): {len(indices)}: {shown}{more}")
        if self.output_jsonl_fpath:
            lines.append(f"Profile: {self.output_jsonl_fpath}")
        return "\n".join(lines)


def _load_tasks(path: str) -> dict[int, dict[str, Any]]:
    """Task index → task row (without `_ng_*` keys)."""
    tasks: dict[int, dict[str, Any]] = {}
    for position, (line_no, row) in enumerate(iter_jsonl(path)):
        index = row.get(TASK_INDEX_KEY, position)
        if not isinstance(index, int) or isinstance(index, bool):
            raise DataError(f"{path}:{line_no}: {TASK_INDEX_KEY} must be an integer, got {index!r}")
        if index not in tasks:
            tasks[index] = {k: v for k, v in row.items() if not k.startswith("_ng_")}
    return tasks


def _agent_name(agent_ref: Any) -> str:
    return str(agent_ref.get("name", "unknown")) if isinstance(agent_ref, dict) else "unknown"


@dataclass
class _Rewards:
    """The measured rewards of a rollouts file per task index and agent, and per group (`agent:<agent_ref name>`,
    `dataset:<dataset>`); its masked rollouts per task index and agent, and per reason; each agent's `agent_ref`."""

    by_task: dict[int, dict[str, list[float]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    by_group: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    masked_by_task: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    masked_reasons: Counter[str] = field(default_factory=Counter)
    agent_refs: dict[str, Any] = field(default_factory=dict)

    def rewards(self, index: int) -> list[float]:
        """The measured rewards of task `index`, all its agents'."""
        return [r for rewards in self.by_task.get(index, {}).values() for r in rewards]


def _load_rewards(path: str, tasks: dict[int, dict[str, Any]]) -> _Rewards:
    loaded = _Rewards()
    by_task, by_group = loaded.by_task, loaded.by_group
    for line_no, row in iter_jsonl(path):
        index, reward = row.get(TASK_INDEX_KEY), row.get("reward")
        if not isinstance(index, int) or isinstance(index, bool):
            raise DataError(
                f"{path}:{line_no}: rollout has no integer {TASK_INDEX_KEY} (was it written by ng_collect_rollouts?)"
            )
        if index not in tasks:
            raise DataError(
                f"{path}:{line_no}: {TASK_INDEX_KEY}={index} is not a task of the input ({len(tasks)} tasks); is it the"
                " right input file?"
            )
        agent_ref = row.get("agent_ref") or tasks[index].get("agent_ref") or {}
        agent = _agent_name(agent_ref)
        loaded.agent_refs.setdefault(agent, agent_ref)
        reason = mask_reason(row)
        if reason is not None:
            loaded.masked_by_task[index][agent] += 1
            loaded.masked_reasons[reason] += 1
            continue
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            raise DataError(f"{path}:{line_no}: rollout has no numeric reward (got {reward!r})")
        by_task[index][agent].append(float(reward))
        by_group[f"agent:{agent}"].append(float(reward))
        dataset = row.get("dataset", tasks[index].get("dataset"))
        if isinstance(dataset, str):
            by_group[f"dataset:{dataset}"].append(float(reward))
    return loaded


def profile_rollouts(
    input_jsonl_fpath: str,
    rollouts_jsonl_fpath: str,
    output_jsonl_fpath: str,
    pass_threshold: float | None = None,
) -> ProfileSummary:
    """Write the per-task profile (rows sorted by task index) and return the summary.

    Raises:
        DataError: a bad line in either file (`file:line:`), an unmasked rollout without a numeric reward, or a
            rollout whose `_ng_task_index` is not a task of the input.
    """
    tasks = _load_tasks(input_jsonl_fpath)
    loaded = _load_rewards(rollouts_jsonl_fpath, tasks)
    by_task, masked = loaded.by_task, loaded.masked_by_task
    rows, groups = [], []
    for i in sorted(by_task):
        fanned = len(set(by_task[i]) | set(masked[i])) > 1  # several agents ran the task: a row per agent
        for agent, rewards in by_task[i].items():  # an agent whose rollouts were all masked has none
            task = {**tasks[i], "agent_ref": loaded.agent_refs[agent]} if fanned else tasks[i]
            left_out = masked[i][agent] if fanned else sum(masked[i].values())
            rows.append(
                {**task, **reward_stats(rewards, pass_threshold), **({"masked_samples": left_out} if left_out else {})}
            )
            groups.append(rewards)
    write_jsonl(output_jsonl_fpath, rows)

    all_rewards = [r for i in by_task for r in loaded.rewards(i)]
    passed = sum(1 for r in all_rewards if pass_threshold is not None and r >= pass_threshold)
    return ProfileSummary(
        tasks=len(tasks),
        tasks_profiled=len(by_task),
        tasks_without_rollouts=sorted(set(tasks) - set(by_task) - set(masked)),
        samples=len(all_rewards),
        mean_reward=statistics.fmean(all_rewards) if all_rewards else None,
        pass_threshold=pass_threshold,
        pass_rate=passed / len(all_rewards) if all_rewards and pass_threshold is not None else None,
        tasks_all_same_reward=sum(1 for rewards in groups if min(rewards) == max(rewards)),
        group_mean_reward={group: statistics.fmean(rewards) for group, rewards in loaded.by_group.items()},
        output_jsonl_fpath=output_jsonl_fpath,
        masked_samples=sum(sum(counts.values()) for counts in masked.values()),
        masked_reasons=dict(loaded.masked_reasons),
        tasks_fully_masked=sorted(set(masked) - set(by_task)),
    )


def profile_main(cfg: ProfileConfig) -> int:
    """`ng_profile`: write the profile and print the summary. Returns 0 (errors raise `NemoGymError`)."""
    summary = profile_rollouts(
        cfg.input_jsonl_fpath, cfg.rollouts_jsonl_fpath, cfg.output_jsonl_fpath, cfg.pass_threshold
    )
    print(summary.format())
    return 0
