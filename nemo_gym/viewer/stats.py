"""Reward statistics for the viewer: per task, and a histogram.

The per-task columns have `nemo_gym.collect.profile.reward_stats`'s names and definitions (sample std, i.e. divided by
n - 1, and 0 for one rollout, as NeMo Gym's reward profile), computed with a pandas group-by so that files with
many tasks stay fast. Rows without a reward are left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["task_reward_stats", "reward_histogram"]

MAX_DISTINCT_BARS = 20


def task_reward_stats(table: pd.DataFrame) -> pd.DataFrame:
    """Per `(environment, task_index)`: avg/std/min/max/median reward and total_samples, sorted by task.

    Args:
        table: `RolloutIndex.table(...)` rows (columns environment, task_index, reward).
    """
    rated = table[np.isfinite(table["reward"].to_numpy(dtype=float))]
    columns = [
        "environment",
        "task_index",
        "avg_reward",
        "std_reward",
        "min_reward",
        "max_reward",
        "median_reward",
        "total_samples",
    ]
    if rated.empty:
        return pd.DataFrame(columns=columns)
    grouped = rated.groupby(["environment", "task_index"], sort=True)["reward"]
    stats = grouped.agg(
        avg_reward="mean",
        std_reward=lambda r: float(r.std(ddof=1)) if len(r) > 1 else 0.0,  # sample std, as ng_profile
        min_reward="min",
        max_reward="max",
        median_reward="median",
        total_samples="count",
    )
    return stats.reset_index()[columns]


def reward_histogram(rewards: np.ndarray, bins: int = MAX_DISTINCT_BARS) -> pd.DataFrame:
    """Counts of `rewards` `(n,)` (NaN ignored) as columns `reward` (a label) and `count`, in ascending order.

    At most `bins` distinct values get one bar each (a binary reward gives two bars); more values are put in
    `bins` equal-width bins labelled `[low, high)` (the last bin includes its upper edge).
    """
    finite = rewards[np.isfinite(rewards)]
    if finite.size == 0:
        return pd.DataFrame({"reward": pd.Series(dtype=str), "count": pd.Series(dtype=int)})
    values, counts = np.unique(finite, return_counts=True)
    if values.size <= bins:
        return pd.DataFrame({"reward": [f"{v:g}" for v in values], "count": counts})
    counts, edges = np.histogram(finite, bins=bins)
    labels = [
        f"[{low:.3g}, {high:.3g}{']' if i == bins - 1 else ')'}"
        for i, (low, high) in enumerate(zip(edges[:-1], edges[1:]))
    ]
    return pd.DataFrame({"reward": labels, "count": counts})
