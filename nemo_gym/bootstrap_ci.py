"""Percentile bootstrap confidence interval of a mean, resampling items (tasks) with replacement.

Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13.3 (the percentile interval): draw
`resamples` samples of `len(values)` items with replacement, take each sample's mean, sort, and read the
`(1 - confidence) / 2` and `(1 + confidence) / 2` quantiles. For a paired comparison (the same tasks under two
models), pass the per-task differences: the interval of their mean is the interval of the paired difference.

Departure: no bias correction (BCa); the quantiles are order statistics (no interpolation). With 10,000
resamples and 95 % they are the 250th and 9,750th smallest means, as benchmarks/learning_basic_arithmetic.py
has always computed them (this code moved here from that script, draw for draw: same `random.Random`, same
calls, so its `--report-only` figures do not change).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = ["DEFAULT_RESAMPLES", "bootstrap_mean_ci"]

DEFAULT_RESAMPLES = 10_000


def bootstrap_mean_ci(
    values: Sequence[float], resamples: int = DEFAULT_RESAMPLES, confidence: float = 0.95, rng: random.Random | None = None
) -> tuple[float, float]:
    """The percentile bootstrap interval `(low, high)` of the mean of `values` `(n_items,)`.

    Args:
        values: one number per item (e.g. per task: its mean reward, or its difference between two models).
        resamples: bootstrap samples drawn.
        confidence: the interval's coverage, in (0, 1).
        rng: the random source (draws continue from its state); default `random.Random(0)`, so results repeat.

    Raises:
        ValueError: `values` is empty, `resamples` < 1, or `confidence` outside (0, 1).
    """
    if not values:
        raise ValueError("bootstrap_mean_ci needs at least one value")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need resamples >= 1 and 0 < confidence < 1, got resamples={resamples}, confidence={confidence}")
    rng = rng if rng is not None else random.Random(0)
    values = list(values)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low_rank, high_rank = round(tail * resamples), round((1 - tail) * resamples) - 1
    return means[min(low_rank, resamples - 1)], means[max(high_rank, 0)]
