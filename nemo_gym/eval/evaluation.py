"""Evaluation: pass@k, pass^k and mean reward of a policy, per environment and overall, from a rollouts file; two
files compared. `ng_eval` (`nemo_gym.eval.command`) collects or reads the rollouts and writes the report made here.

Every task is scored: a sample passes when `reward >= pass_threshold`; a task with `n` samples of which `c` pass gives

    pass@k = 1 - C(n - c, k) / C(n, k)   the probability that at least one of k samples drawn without
                                         replacement from the n passes: the unbiased estimator of
                                         Chen et al. 2021, "Evaluating Large Language Models Trained on
                                         Code" (Codex), eq. 1, computed as in their numpy reference as
                                         1 - prod_{i=n-c+1}^{n} (1 - k / i)  (no large binomials)
    pass^k = C(c, k) / C(n, k)           the probability that all k drawn samples pass (consistency):
                                         Yao et al. 2024, "tau-bench", sec. 4; computed as
                                         prod_{i=0}^{k-1} (c - i) / (n - i)

Both are averaged over tasks (each task weighs the same); `mean_reward` is the mean over samples. Every k
must be <= the n of every task scored. A task is an environment's row, keyed by `_ng_task_index`; its
environment is the row's `dataset` field when it is a string, else its `agent_ref` name.

Infrastructure failures are not zeros: a task with a sample in `<rollouts>_failures.jsonl`, or with fewer rows
than the collection's `num_repeats` (from `<rollouts>_state.json`), is left out of every metric and counted in
`num_tasks_excluded`. Rows without `_ng_task_index` (rollouts from elsewhere) are grouped by their prompt
(`responses_create_params.input`) and agent instead (`nemo_gym.eval.comparison.task_key`).

A baseline file (`compare`) is scored with the same ks and threshold and compared with the candidate (the rollouts
evaluated) on the tasks scored in both: each metric for the baseline, the candidate and their difference, per
environment and overall, and the mean reward difference paired by task with its 95 % percentile bootstrap interval
over tasks (`nemo_gym.eval.comparison`). Tool calls and turns per sample are reported too
(`nemo_gym.eval.comparison.tool_calls_and_turns`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collect.files import OutputPaths
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import AGENT_REF_KEY, TASK_INDEX_KEY, iter_jsonl
from nemo_gym.eval.bootstrap_ci import DEFAULT_RESAMPLES
from nemo_gym.eval.comparison import (
    TaskPair,
    TaskTally,
    pair_tasks,
    paired_reward_difference,
    prompt_digest,
    task_key,
    tool_calls_and_turns,
)

__all__ = [
    "TaskResult",
    "pass_at_k",
    "pass_hat_k",
    "load_task_results",
    "evaluate",
    "compare",
    "resolve_ks",
    "resolve_both_ks",
]

DEFAULT_KS = (1, 4, 8)


# -- the estimators ---------------------------------------------------------------------------------------
def _check_nck(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (samples per task), got k={k} with n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, eq. 1), in [0, 1].

    Args:
        n: samples of the task; c: samples that passed; k: samples drawn (1 <= k <= n).

    Raises:
        ValueError: k outside [1, n] or c outside [0, n].
    """
    _check_nck(n, c, k)
    if n - c < k:  # every draw of k holds a passing sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k of one task: C(c, k) / C(n, k), the chance that k samples drawn all pass (τ-bench), in [0, 1].

    Raises:
        ValueError: k outside [1, n] or c outside [0, n].
    """
    _check_nck(n, c, k)
    if c < k:
        return 0.0
    return math.prod((c - i) / (n - i) for i in range(k))


# -- tasks from rollouts ----------------------------------------------------------------------------------
@dataclass
class TaskResult:
    """One task: its rewards, tool calls and turns (one per sample), or why it is excluded (`excluded` set, then not
    scored). `prompt_digest` is `nemo_gym.eval.comparison.prompt_digest` of its first row (None without rows)."""

    key: Any
    environment: str
    rewards: list[float]
    excluded: str | None = None
    tool_calls: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    prompt_digest: str | None = None

    def passed(self, threshold: float) -> int:
        return sum(1 for r in self.rewards if r >= threshold)

    def tally(self, threshold: float) -> TaskTally:
        """The task as `nemo_gym.eval.comparison` sums."""
        tally = TaskTally(self.environment, self.prompt_digest)
        unknown = [0] * len(self.rewards)  # a TaskResult made without tool calls and turns counts none
        for reward, calls, turns in zip(self.rewards, self.tool_calls or unknown, self.turns or unknown, strict=True):
            tally.add(reward, reward >= threshold, calls, turns)
        return tally


def environment_of(row: dict[str, Any]) -> str:
    """The row's `dataset` when it is a string, else its `agent_ref` name, else "unknown"."""
    if isinstance(row.get("dataset"), str):
        return row["dataset"]
    agent_ref = row.get(AGENT_REF_KEY)
    return agent_ref["name"] if isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str) else "unknown"


def _read_optional(path: Path) -> Iterable[dict[str, Any]]:
    return (row for _, row in iter_jsonl(path)) if path.is_file() else ()


def load_task_results(rollouts_jsonl_fpath: str | Path, max_tasks: int | None = None) -> list[TaskResult]:
    """The tasks of a rollouts file, sorted by key, with the collector's side files taken into account.

    Side files, when present: `_state.json` (`num_tasks`, `num_repeats`: a task with fewer rows is excluded
    as "missing"), `_failures.jsonl` (a task with a failure record is excluded as "failed: <class>"),
    `_materialized_inputs.jsonl` (the environment of a task without rows).

    Raises:
        DataError: a bad line, or a rollout without a finite numeric `reward`.
    """
    paths = OutputPaths.for_output(rollouts_jsonl_fpath)
    tasks: dict[Any, TaskResult] = {}
    for line_no, row in iter_jsonl(paths.output):
        reward = row.get("reward")
        if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
            raise DataError(f"{paths.output}:{line_no}: rollout has no finite numeric reward (got {reward!r})")
        key = task_key(row)
        if key not in tasks:
            tasks[key] = TaskResult(key, environment_of(row), [], prompt_digest=prompt_digest(row))
        task = tasks[key]
        calls, turns = tool_calls_and_turns(row.get("response"))
        task.rewards.append(float(reward))
        task.tool_calls.append(calls)
        task.turns.append(turns)
    state = orjson.loads(paths.state.read_bytes()) if paths.state.is_file() else {}
    inputs = {row[TASK_INDEX_KEY]: row for row in _read_optional(paths.materialized_inputs) if TASK_INDEX_KEY in row}
    for index in range(state.get("num_tasks", 0)):
        if index not in tasks:
            tasks[index] = TaskResult(index, environment_of(inputs.get(index, {})), [])
    for failure in _read_optional(paths.failures):
        task = tasks.setdefault(task_key(failure), TaskResult(task_key(failure), environment_of(failure), []))
        task.excluded = f"failed: {failure.get('failure_class', 'unknown')}"
    num_repeats = state.get("num_repeats")  # an int, or each task's (NeMo Gym 0.7.0's fan_out or num_repeats dict)
    for task in tasks.values():
        expected = num_repeats[task.key] if isinstance(num_repeats, list) and isinstance(task.key, int) else num_repeats
        expected = expected if isinstance(expected, int) else None
        if task.excluded is None and (not task.rewards or (expected and len(task.rewards) < expected)):
            task.excluded = f"missing: {len(task.rewards)}/{expected or '?'} samples"
    ordered = sorted(tasks.values(), key=lambda t: (isinstance(t.key, str), t.key))
    return ordered[:max_tasks] if max_tasks else ordered


# -- metrics ----------------------------------------------------------------------------------------------
def resolve_ks(requested: list[int] | None, min_n: int) -> list[int]:
    """The ks to report: `requested` (each checked against `min_n`, the fewest samples of a scored task; 0 when
    none is scored), or DEFAULT_KS up to `min_n`.

    Raises:
        ConfigError: a requested k < 1, or > min_n when a task is scored.
    """
    if requested is None:
        return [k for k in DEFAULT_KS if k <= max(min_n, 1)]
    bad = [k for k in requested if k < 1 or (min_n and k > min_n)]  # min_n 0: no scored task, metrics are null
    if bad:
        raise ConfigError(
            f"k={bad}: every k must satisfy 1 <= k <= n, the samples per task (here n={min_n}); pass +k=[...] with"
            " smaller values"
        )
    return sorted(set(requested))


def _mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _group_metrics(tasks: list[TaskResult], ks: list[int], threshold: float) -> dict[str, Any]:
    scored = [t for t in tasks if t.excluded is None]
    rewards = [r for t in scored for r in t.rewards]
    metrics: dict[str, Any] = {
        "num_tasks": len(scored),
        "num_samples": len(rewards),
        "num_tasks_excluded": len(tasks) - len(scored),
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "tool_calls_per_sample": _mean_or_none([c for t in scored for c in t.tool_calls]),
        "turns_per_sample": _mean_or_none([n for t in scored for n in t.turns]),
    }
    for name, estimator in (("pass@", pass_at_k), ("pass^", pass_hat_k)):
        for k in ks:
            values = [estimator(len(t.rewards), t.passed(threshold), k) for t in scored]
            metrics[f"{name}{k}"] = statistics.fmean(values) if values else None
    return metrics


def evaluate(tasks: list[TaskResult], ks: list[int] | None, pass_threshold: float) -> dict[str, Any]:
    """The report: `{"k", "pass_threshold", "overall", "environments": {name: metrics}, "excluded_tasks", "tasks"}`.

    Metrics of a group: num_tasks, num_samples, num_tasks_excluded, mean_reward, pass@k and pass^k for each k
    (null when the group has no scored task).

    Raises:
        ConfigError: a k outside [1, n] for some scored task.
    """
    scored = [t for t in tasks if t.excluded is None]
    ks = resolve_ks(ks, min((len(t.rewards) for t in scored), default=0))
    environments = sorted({t.environment for t in tasks})
    return {
        "k": ks,
        "pass_threshold": pass_threshold,
        "overall": _group_metrics(tasks, ks, pass_threshold),
        "environments": {
            env: _group_metrics([t for t in tasks if t.environment == env], ks, pass_threshold) for env in environments
        },
        "excluded_tasks": [
            {"task": t.key, "environment": t.environment, "reason": t.excluded} for t in tasks if t.excluded
        ],
        "tasks": [
            {
                "task": t.key,
                "environment": t.environment,
                "n": len(t.rewards),
                "c": t.passed(pass_threshold),
                "mean_reward": statistics.fmean(t.rewards),
            }
            for t in scored
        ],
    }


# -- two files compared ------------------------------------------------------------------------------------
_COUNTS = ("num_tasks", "num_samples", "num_tasks_excluded")


def _difference(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, float | None]:
    metrics = [m for m in candidate if m not in _COUNTS]
    return {m: None if baseline[m] is None or candidate[m] is None else candidate[m] - baseline[m] for m in metrics}


def _side_by_side(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    return {"baseline": baseline, "candidate": candidate, "difference": _difference(baseline, candidate)}


def compare(
    candidate: list[TaskResult],
    baseline: list[TaskResult],
    ks: list[int],
    pass_threshold: float,
    resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, Any]:
    """Two files' tasks compared on the tasks scored in both (keys as `load_task_results` gives them).

    Returns `{"num_tasks", "baseline_only", "candidate_only", "overall", "environments", "mean_reward_difference",
    "prompt_mismatches", "tasks"}`: `overall` and each environment hold `baseline`, `candidate` (the metrics of
    `evaluate` on the common tasks) and `difference` (candidate - baseline of each metric);
    `mean_reward_difference` is `nemo_gym.eval.comparison.PairedDifference` (mean over tasks of the per-task
    difference, its 95 % bootstrap interval `ci95`, improved/worsened/unchanged task counts); `tasks` has a row
    per task of either file.

    Raises:
        ConfigError: a k above the samples of a common task.
    """
    tallies = [{t.key: t.tally(pass_threshold) for t in side if t.excluded is None} for side in (baseline, candidate)]
    pairs = pair_tasks(*tallies)
    both = {p.key for p in pairs if p.status == "both"}
    base = evaluate([t for t in baseline if t.key in both], ks, pass_threshold)
    cand = evaluate([t for t in candidate if t.key in both], ks, pass_threshold)
    empty = _group_metrics([], ks, pass_threshold)
    environments = sorted(base["environments"].keys() | cand["environments"].keys())
    diff = paired_reward_difference(pairs, resamples)
    return {
        "num_tasks": len(both),
        "baseline_only": [p.key for p in pairs if p.status == "baseline only"],
        "candidate_only": [p.key for p in pairs if p.status == "candidate only"],
        "overall": _side_by_side(base["overall"], cand["overall"]),
        "environments": {
            env: _side_by_side(base["environments"].get(env, empty), cand["environments"].get(env, empty))
            for env in environments
        },
        "mean_reward_difference": {
            "mean": diff.mean_difference,
            "ci95": list(diff.ci95) if diff.ci95 else None,
            "resamples": diff.resamples,
            "improved": diff.improved,
            "worsened": diff.worsened,
            "unchanged": diff.unchanged,
        },
        "prompt_mismatches": diff.prompt_mismatches,
        "tasks": [_pair_row(p) for p in pairs],
    }


def _pair_row(pair: TaskPair) -> dict[str, Any]:
    """One task of either file, for the report's `comparison.paired.tasks`."""
    row: dict[str, Any] = {"task": pair.key, "environment": pair.environment, "status": pair.status}
    for name, tally in (("baseline", pair.baseline), ("candidate", pair.candidate)):
        row[f"{name}_samples"] = tally.num_rollouts if tally else 0
        row[f"{name}_mean_reward"] = tally.mean_reward if tally else None
    row["difference"] = pair.reward_delta
    row["same_prompt"] = pair.same_prompt
    return row


def resolve_both_ks(
    candidate: list[TaskResult], baseline: list[TaskResult], requested: list[int] | None, baseline_path: str
) -> list[int]:
    """The ks valid for both files: each k at most the fewest samples of a scored task in either.

    Raises:
        ConfigError: a requested k above that (the message names the baseline file).
    """
    min_n = min((len(t.rewards) for t in [*candidate, *baseline] if t.excluded is None), default=0)
    try:
        return resolve_ks(requested, min_n)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} (n is the fewest samples of a task in either file; baseline: {baseline_path})"
        ) from None
