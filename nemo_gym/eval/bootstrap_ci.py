"""Percentile bootstrap confidence interval of a mean, resampling items (tasks) with replacement.

Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13.3 (the percentile interval): draw
`resamples` samples of `len(values)` items with replacement, take each sample's mean, sort, and read the
`(1 - confidence) / 2` and `(1 + confidence) / 2` quantiles. For a paired comparison (the same tasks under two
models), pass the per-task differences: the interval of their mean is the interval of the paired difference.

Departure: no bias correction (BCa); the quantiles are order statistics (no interpolation). With 10,000
resamples and 95 % they are the 250th and 9,750th smallest means, as benchmarks/learning_basic_arithmetic.py
has always computed them.

Two random sources. Given a `random.Random` (`rng=`), the draws are the ones that script made before this code
moved here (same calls, so its `--report-only` figures do not change): pure Python, O(resamples x n_items), about
a minute for 50,000 tasks. Otherwise the draws come from numpy's PCG64 seeded with `seed`, vectorized (seconds for
50,000 tasks); without numpy (a core-only install: numpy is not a dependency of the core), from
`random.Random(seed)`. The interval is the same up to Monte Carlo error whichever source draws.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_RESAMPLES", "bootstrap_mean_ci"]

DEFAULT_RESAMPLES = 10_000


_CHUNK_DRAWS = 4_000_000  # numpy: indices drawn at once (32 MB of int64)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _numpy_means(values: Sequence[float], resamples: int, seed: int) -> list[float]:
    """`resamples` bootstrap means (unsorted), drawn with numpy in chunks of at most `_CHUNK_DRAWS` indices."""
    np = _numpy()
    data, gen = np.asarray(values, dtype=float), np.random.Generator(np.random.PCG64(seed))
    per_chunk = max(1, _CHUNK_DRAWS // len(data))
    means = [
        data[gen.integers(0, len(data), size=(min(per_chunk, resamples - done), len(data)))].mean(axis=1)
        for done in range(0, resamples, per_chunk)
    ]
    return np.concatenate(means).tolist()


def bootstrap_mean_ci(
    values: Sequence[float],
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    rng: random.Random | None = None,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval `(low, high)` of the mean of `values` `(n_items,)`.

    Args:
        values: one number per item (e.g. per task: its mean reward, or its difference between two models).
        resamples: bootstrap samples drawn.
        confidence: the interval's coverage, in (0, 1).
        rng: a random source whose draws continue from its state (pure Python; see the module docstring).
        seed: without `rng`, the seed of the draws (numpy when installed), so results repeat.

    Raises:
        ValueError: `values` is empty, `resamples` < 1, or `confidence` outside (0, 1).
    """
    if not values:
        raise ValueError("bootstrap_mean_ci needs at least one value")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(
            f"need resamples >= 1 and 0 < confidence < 1, got resamples={resamples}, confidence={confidence}"
        )
    values = list(values)
    n = len(values)
    if rng is None and _numpy() is not None:
        means = sorted(_numpy_means(values, resamples, seed))
    else:
        rng = rng if rng is not None else random.Random(seed)
        means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low_rank, high_rank = round(tail * resamples), round((1 - tail) * resamples) - 1
    return means[min(low_rank, resamples - 1)], means[max(high_rank, 0)]
