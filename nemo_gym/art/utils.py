"""Training-loop helpers in ART's style: `iterate_dataset` (resumable batches) and the `retry` decorator."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tqdm.auto import tqdm

__all__ = ["DatasetBatch", "iterate_dataset", "retry"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class DatasetBatch(Generic[T]):
    """The items of one training step.

    Attributes:
        items: at most `groups_per_step` dataset items (the last batch of an epoch may be shorter).
        step: global step, 0-based, counted over all epochs (pass `await model.get_step()` as `initial_step`).
        epoch: 0-based epoch.
        epoch_step: 0-based step inside the epoch.
    """

    items: list[T]
    step: int
    epoch: int
    epoch_step: int


def iterate_dataset(
    items: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    *,
    seed: int = 0,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Batches of `items` for `num_epochs` epochs, each epoch in its own fixed shuffled order.

    The order of epoch e is `random.Random(f"{seed}:{e}")`'s shuffle of the indices, so batch k depends only
    on (items, groups_per_step, seed, k): a run restarted with `initial_step=k` gets exactly the batches k,
    k+1, ... the uninterrupted run would have had. An epoch has ceil(len(items) / groups_per_step) steps.

    Raises:
        ValueError: `groups_per_step` or `num_epochs` below 1, or `initial_step` negative.
    """
    if groups_per_step < 1 or num_epochs < 1 or initial_step < 0:
        raise ValueError(
            f"need groups_per_step >= 1, num_epochs >= 1, initial_step >= 0 (got {groups_per_step}, {num_epochs},"
            f" {initial_step})"
        )
    steps_per_epoch = math.ceil(len(items) / groups_per_step)
    total_steps = steps_per_epoch * num_epochs
    bar = tqdm(desc="steps", total=total_steps, initial=min(initial_step, total_steps)) if use_tqdm else None
    try:
        for step in range(initial_step, total_steps):
            epoch, epoch_step = divmod(step, steps_per_epoch)
            order = list(range(len(items)))
            random.Random(f"{seed}:{epoch}").shuffle(order)
            chosen = order[epoch_step * groups_per_step : (epoch_step + 1) * groups_per_step]
            yield DatasetBatch([items[i] for i in chosen], step=step, epoch=epoch, epoch_step=epoch_step)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def retry(
    max_attempts: int = 3,
    *,
    delay_s: float = 0.25,
    backoff: float = 2.0,
    max_delay_s: float = 30.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[BaseException, int], Any] | None = None,
) -> Callable[[F], F]:
    """Decorator: call the function again when it raises one of `exceptions`, at most `max_attempts` times in all.

    Works on plain and `async` functions. The k-th retry waits `min(delay_s * backoff**(k-1), max_delay_s)`
    seconds (`asyncio.sleep` for async functions). `on_retry(exception, attempt)` (attempt = 1 for the first
    failure; may be async) is called before each wait. Other exceptions propagate at once.

    Raises:
        ValueError: `max_attempts` below 1.
        Exception: the last attempt's exception, unchanged.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")

    def wait_s(attempt: int) -> float:
        return min(delay_s * backoff ** (attempt - 1), max_delay_s)

    def decorate(function: F) -> F:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await function(*args, **kwargs)
                    except exceptions as exc:
                        if attempt == max_attempts:
                            raise
                        if on_retry is not None and inspect.isawaitable(answer := on_retry(exc, attempt)):
                            await answer
                        await asyncio.sleep(wait_s(attempt))

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(1, max_attempts + 1):
                try:
                    return function(*args, **kwargs)
                except exceptions as exc:
                    if attempt == max_attempts:
                        raise
                    if on_retry is not None:
                        on_retry(exc, attempt)
                    time.sleep(wait_s(attempt))

        return wrapper  # type: ignore[return-value]

    return decorate
