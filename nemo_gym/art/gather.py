"""Run many rollouts concurrently with one progress bar: `gather_trajectory_groups` (ART's name and arguments).

The bar counts trajectories and shows the running mean of the reward and of every metric, and the number of
exceptions. A rollout that raises is kept in its group's `exceptions`; a group awaitable that raises as a
whole is dropped. Either counts against `max_exceptions`: an int is a count, a float in (0, 1) a share of all
trajectories; beyond it the exception propagates and the gather stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from tqdm.auto import tqdm

from nemo_gym.art.trajectories import GATHER_PROGRESS, GatherProgress, PendingGroup, TrajectoryGroup

__all__ = ["gather_trajectory_groups"]


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
        max_exceptions: failed rollouts (or groups) tolerated: a count, or a share of all trajectories when in (0, 1).
        after_each: awaited on each finished group (e.g. a judge scoring it); its result replaces the group,
            None drops it.

    Returns:
        The groups, in the order given, without those that failed as a whole or that `after_each` dropped.

    Raises:
        Exception: the exception of the rollout (or group) that went past `max_exceptions`.
        ValueError: a trajectory with a metric that is not a number or a bool.
    """
    groups = list(groups)
    progress = GatherProgress(
        total=sum(getattr(g, "num_trajectories", 1) for g in groups), max_exceptions=max_exceptions
    )
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

    token = GATHER_PROGRESS.set(progress)
    tasks = [asyncio.ensure_future(one(g)) for g in groups]  # created here: they inherit the progress context
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        GATHER_PROGRESS.reset(token)
        if progress.pbar is not None:
            progress.pbar.close()
    return [group for group in results if group is not None]
