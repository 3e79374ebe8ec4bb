"""NeMo Gym 0.7.0's additions to the reward profile (its `nemo_gym/reward_profile.py`), computed from the same
per-rollout numbers as the rest of the profile (`nemo_gym.env.metrics.numeric_fields`):

- **repeat-level metrics** (`<stem>_repeat_level_metrics.json`): for each agent with more than one rollout index,
  one row per rollout index ("repeat") over the tasks that have it: `agent_ref {name}`, `_ng_rollout_index`,
  `sample_count` (tasks with that repeat), `missing_count` (the agent's other tasks), then for each numeric field
  (sorted by name) `mean/`, `median/`, `std/` (sample, ddof 1; 0.0 for one value), `sem/` (std / sqrt(n)), `min/`,
  `max/`, `p25/`, `p75/` (linear interpolation, pandas' `quantile`) and, for n > 1, `ci_low_95/` and `ci_high_95/`:
  the two-sided 95 % Student-t interval `mean ± t(0.975, n - 1) · sem` (scipy's `stats.t.interval`, as NeMo Gym);
  `(mean, mean)` when sem is 0.
- **across repeats** (merged into `<stem>_agent_metrics.json`): per agent, each repeat's `mean/<field>` taken as one
  observation: `mean_across_repeats/mean/<field>`, `median_…`, `std_…`, `min_…`, `max_…`, `se_…` (std / sqrt(number
  of repeats)) and `ci_low_95_…`/`ci_high_95_…` for two repeats or more.
- **coverage** (`coverage_metrics`): when some of an agent's rollouts are masked (`mask_sample`), its agent row gains
  `coverage/measured_rollouts`, `coverage/masked_rollouts`, `coverage/measured_tasks`, `coverage/fully_masked_tasks`;
  an agent whose every rollout is masked has a row of these alone.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from nemo_gym.common.jsonl import AGENT_REF_KEY, ROLLOUT_INDEX_KEY
from nemo_gym.env.metrics import Pair

__all__ = ["across_repeats", "coverage_metrics", "repeat_level_metrics", "t_interval_95"]


def t_interval_95(mean: float, se: float, n: int) -> tuple[float, float] | None:
    """The two-sided 95 % Student-t interval around `mean` with standard error `se` and n - 1 degrees of freedom
    (scipy's `stats.t.interval(0.95, df=n - 1, loc=mean, scale=se)`, NeMo Gym 0.7.0's `_confidence_interval`);
    None for n <= 1, `(mean, mean)` when `se` is 0."""
    if n <= 1:
        return None
    if se == 0:
        return mean, mean
    from scipy import stats  # noqa: PLC0415 (imported on use: only the 0.7.0 profile needs it)

    low, high = stats.t.interval(0.95, df=n - 1, loc=mean, scale=se)
    return float(low), float(high)


def _quantile(ordered: list[float], q: float) -> float:
    """pandas' `Series.quantile(q)` (linear interpolation between the closest ranks) of sorted values."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def _repeat_stats(field: str, values: list[float]) -> dict[str, float]:
    n, ordered = len(values), sorted(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    sem = std / math.sqrt(n)
    row = {
        f"mean/{field}": mean,
        f"median/{field}": float(statistics.median(values)),
        f"std/{field}": std,
        f"sem/{field}": sem,
        f"min/{field}": float(ordered[0]),
        f"max/{field}": float(ordered[-1]),
        f"p25/{field}": _quantile(ordered, 0.25),
        f"p75/{field}": _quantile(ordered, 0.75),
    }
    if interval := t_interval_95(mean, sem, n):
        row[f"ci_low_95/{field}"], row[f"ci_high_95/{field}"] = interval
    return row


def repeat_level_metrics(fields: dict[Pair, dict[str, int | float]], agent_of: dict[Pair, str]) -> list[dict[str, Any]]:
    """The rows of `<stem>_repeat_level_metrics.json` (module docstring), sorted by agent name then rollout index.

    Args:
        fields: per (task index, rollout index), the rollout's profiled numbers (`numeric_fields`).
        agent_of: per (task index, rollout index), the name of the agent that ran it.
    """
    tasks_of: dict[str, set[int]] = defaultdict(set)
    by_repeat: dict[tuple[str, int], list[Pair]] = defaultdict(list)
    for pair in fields:
        tasks_of[agent_of[pair]].add(pair[0])
        by_repeat[agent_of[pair], pair[1]].append(pair)
    repeats_of: dict[str, set[int]] = defaultdict(set)
    for agent, repeat in by_repeat:
        repeats_of[agent].add(repeat)
    rows = []
    for (agent, repeat), pairs in sorted(by_repeat.items()):
        if len(repeats_of[agent]) < 2:
            continue  # one repeat: nothing to compare across repeats
        present = len({task for task, _ in pairs})
        row: dict[str, Any] = {
            AGENT_REF_KEY: {"name": agent},
            ROLLOUT_INDEX_KEY: repeat,
            "sample_count": present,
            "missing_count": len(tasks_of[agent]) - present,
        }
        values: dict[str, list[float]] = defaultdict(list)
        for pair in pairs:
            for field, value in fields[pair].items():
                values[field].append(value)
        for field in sorted(values):
            row |= _repeat_stats(field, values[field])
        rows.append(row)
    return rows


def across_repeats(repeat_rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per agent name, the `<stat>_across_repeats/mean/<field>` entries over its repeat rows (module docstring)."""
    means: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in repeat_rows:
        for key, value in row.items():
            if key.startswith("mean/"):
                means[row[AGENT_REF_KEY]["name"]][key].append(value)
    result: dict[str, dict[str, float]] = {}
    for agent, columns in means.items():
        entry: dict[str, float] = {}
        for key, values in columns.items():
            n, mean = len(values), statistics.fmean(values)
            std = statistics.stdev(values) if n > 1 else 0.0
            se = std / math.sqrt(n)
            entry |= {
                f"mean_across_repeats/{key}": mean,
                f"median_across_repeats/{key}": float(statistics.median(values)),
                f"std_across_repeats/{key}": std,
                f"min_across_repeats/{key}": float(min(values)),
                f"max_across_repeats/{key}": float(max(values)),
                f"se_across_repeats/{key}": se,
            }
            if interval := t_interval_95(mean, se, n):
                entry[f"ci_low_95_across_repeats/{key}"], entry[f"ci_high_95_across_repeats/{key}"] = interval
        result[agent] = entry
    return result


def coverage_metrics(pairs: Iterable[Pair], masked: set[Pair]) -> dict[str, int]:
    """NeMo Gym 0.7.0's `coverage/*` counts over one agent's rollouts `pairs` of which `masked` are masked; `{}` when
    none is masked (a run without masks publishes the keys it published before)."""
    pairs = list(pairs)
    mine = [p for p in pairs if p in masked]
    if not mine:
        return {}
    measured = [p for p in pairs if p not in masked]
    tasks, measured_tasks = {t for t, _ in pairs}, {t for t, _ in measured}
    return {
        "coverage/measured_rollouts": len(measured),
        "coverage/masked_rollouts": len(mine),
        "coverage/measured_tasks": len(measured_tasks),
        "coverage/fully_masked_tasks": len(tasks - measured_tasks),
    }
