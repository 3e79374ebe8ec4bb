"""Run many rollouts concurrently with one progress bar: `gather_trajectory_groups` (ART's name and arguments).

The bar counts trajectories and shows the running mean of the reward and of every metric, and the number of
exceptions. A rollout that raises is kept in its group's `exceptions`; a group awaitable that raises as a
whole is dropped. Either counts against `max_exceptions`: an int is a count, a float in (0, 1) a share of all
trajectories; beyond it the exception propagates and the gather stops.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from nemo_gym.art.trajectories import Trajectory, TrajectoryGroup

__all__ = ["PendingGroup", "gather_trajectory_groups"]


@dataclass
class GatherProgress:
    """Counts and the progress bar of one `gather_trajectory_groups` call."""

    total: int = 0
    max_exceptions: int | float = 0
    pbar: tqdm | None = None
    sums: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    exceptions: int = 0

    def record(self, trajectory: Trajectory) -> None:
        trajectory.check_metrics()
        for name, value in {"reward": trajectory.reward, **trajectory.metrics}.items():
            self.sums[name] += float(value)
            self.counts[name] += 1
        self._update(1)

    def record_exception(self) -> None:
        """Count one failed rollout (or group); the caller re-raises it when `too_many_exceptions()`."""
        self.exceptions += 1
        self._update(1)

    def too_many_exceptions(self) -> bool:
        if 0 < self.max_exceptions < 1:
            return self.exceptions > self.max_exceptions * max(1, self.total)
        return self.exceptions > self.max_exceptions

    def _update(self, n: int) -> None:
        if self.pbar is None:
            return
        self.pbar.update(n)
        postfix: dict[str, Any] = {name: self.sums[name] / self.counts[name] for name in self.sums}
        if self.exceptions:
            postfix["exceptions"] = self.exceptions
        self.pbar.set_postfix(postfix, refresh=False)


_progress: contextvars.ContextVar[GatherProgress | None] = contextvars.ContextVar("nemo_gym_art_gather", default=None)


class PendingGroup:
    """The rollouts of one group, not yet run: `await` it for the `TrajectoryGroup`.

    Made by `TrajectoryGroup(awaitables)`. Inside `gather_trajectory_groups` each finished rollout advances
    the shared progress bar; a rollout that raises is kept in `exceptions` (or re-raised when the gather has
    seen more than `max_exceptions`). Awaited alone, a raising rollout is kept too.
    """

    def __init__(self, awaitables: list[Awaitable[Trajectory]], metadata: dict[str, Any]):
        self.awaitables = awaitables
        self.metadata = metadata

    @property
    def num_trajectories(self) -> int:
        return len(self.awaitables)

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        return self._run().__await__()

    async def _run(self) -> TrajectoryGroup:
        progress = _progress.get()
        trajectories: list[Trajectory] = []
        exceptions: list[BaseException] = []
        futures = [asyncio.ensure_future(a) for a in self.awaitables]
        try:
            for future in asyncio.as_completed(futures):
                try:
                    trajectory = await future
                except Exception as exc:  # a failed rollout is a value (BaseException: let cancellation through)
                    exceptions.append(exc)
                    if progress is not None:
                        progress.record_exception()
                        if progress.too_many_exceptions():
                            raise
                    continue
                if not isinstance(trajectory, Trajectory):
                    raise TypeError(f"a rollout returned {type(trajectory).__name__}, expected a Trajectory")
                trajectories.append(trajectory)
                if progress is not None:
                    progress.record(trajectory)
        finally:
            for future in futures:
                future.cancel()  # no-op for finished ones; stops the rest when we raise or are cancelled
        return TrajectoryGroup(trajectories, metadata=self.metadata, exceptions=exceptions)


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None]] | None = None,
) -> list[TrajectoryGroup]:
    """Await all groups concurrently, with a tqdm progress bar over their trajectories.

    Args:
        groups: awaitables of `TrajectoryGroup`, usually `TrajectoryGroup(rollout(...) for _ in range(n))`.
        pbar_desc: the bar's label; None: no bar.
        max_exceptions: failed rollouts (or groups) tolerated: a count, or a share of all trajectories when
            in (0, 1).
        after_each: awaited on each finished group (e.g. a judge scoring it); its result replaces the group,
            None drops it.

    Returns:
        The groups, in the order given, without those that failed as a whole or that `after_each` dropped.

    Raises:
        Exception: the exception of the rollout (or group) that went past `max_exceptions`.
        ValueError: a trajectory with a metric that is not a number or a bool.
    """
    groups = list(groups)
    progress = GatherProgress(total=sum(getattr(g, "num_trajectories", 1) for g in groups), max_exceptions=max_exceptions)
    if pbar_desc is not None:
        progress.pbar = tqdm(desc=pbar_desc, total=progress.total)

    async def one(group: Awaitable[TrajectoryGroup]) -> TrajectoryGroup | None:
        pending = isinstance(group, PendingGroup)
        try:
            result = await group
        except Exception:
            progress.record_exception()
            if progress.too_many_exceptions():
                raise
            return None
        if not pending:  # a plain awaitable: its trajectories were not counted yet
            for trajectory in result:
                progress.record(trajectory)
        return await after_each(result) if after_each is not None else result

    token = _progress.set(progress)
    tasks = [asyncio.ensure_future(one(g)) for g in groups]  # created here: they inherit the progress context
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        _progress.reset(token)
        if progress.pbar is not None:
            progress.pbar.close()
    return [group for group in results if group is not None]
