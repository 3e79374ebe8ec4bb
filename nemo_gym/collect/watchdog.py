"""The collector's watchdog: report when no rollout has completed for `watchdog_s` seconds.

A hung server (a black-holed model, a deadlocked environment) shows up as a collection that stops moving long
before the per-call deadlines end it. `CollectWatchdog` tracks the rollouts in flight and, while some are in
flight and none has completed (as a row or a failure record) for `watchdog_s` seconds, prints one line to
stderr naming the oldest ones and records a stall (again every `watchdog_s` while it lasts). The stalls go to
`<out>_state.json` as they happen (a live signal for whoever watches the run) and to the aggregate metrics.
It only reports: the per-call deadlines of `ServerClient` still decide when a rollout fails.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

__all__ = ["DEFAULT_WATCHDOG_S", "CollectWatchdog"]

Pair = tuple[int, int]  # (task index, rollout index)
SHOWN_IN_FLIGHT = 10  # rollouts named in a stall line and record
DEFAULT_WATCHDOG_S = (
    300.0  # seconds without a completed rollout before a stall is reported (ng_collect_rollouts, ng_train)
)


class CollectWatchdog:
    """Tracks rollouts in flight and reports stalls.

    Args:
        watchdog_s: seconds without a completed rollout before a stall is reported; 0 disables it.
        agent_of: the agent instance name of a pair (named in the report).
        on_stall: called with each stall record (e.g. to write it to the state file).
    """

    def __init__(
        self,
        watchdog_s: float,
        agent_of: Callable[[Pair], str],
        on_stall: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.watchdog_s = watchdog_s
        self.agent_of = agent_of
        self.on_stall = on_stall
        self.in_flight: dict[Pair, float] = {}  # pair -> monotonic start, seconds
        self.last_progress_s = time.monotonic()
        self.last_report_s = float("-inf")
        self.stalls: list[dict[str, Any]] = []

    def started(self, pair: Pair) -> None:
        self.in_flight[pair] = time.monotonic()

    def finished(self, pair: Pair) -> None:
        self.in_flight.pop(pair, None)
        self.last_progress_s = time.monotonic()

    def check(self) -> dict[str, Any] | None:
        """Report a stall if one is due now; returns its record, else None."""
        now = time.monotonic()
        idle_s = now - self.last_progress_s
        if not self.watchdog_s or not self.in_flight or min(idle_s, now - self.last_report_s) < self.watchdog_s:
            return None
        oldest = sorted(self.in_flight.items(), key=lambda item: item[1])[:SHOWN_IN_FLIGHT]
        shown = [
            {"task_index": t, "rollout_index": r, "agent": self.agent_of((t, r)), "running_s": round(now - start, 1)}
            for (t, r), start in oldest
        ]
        stall = {
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "idle_s": round(idle_s, 1),
            "in_flight_count": len(self.in_flight),
            "in_flight": shown,
        }
        self.stalls.append(stall)
        self.last_report_s = now  # the next report comes after another watchdog_s without progress
        names = ", ".join(
            f"(task {s['task_index']}, repeat {s['rollout_index']}) via {s['agent']} for {s['running_s']:g} s"
            for s in shown
        )
        more = f" and {len(self.in_flight) - len(shown)} more" if len(self.in_flight) > len(shown) else ""
        print(
            f"ng_collect_rollouts: watchdog: no rollout completed for {idle_s:.0f} s (+watchdog_s={self.watchdog_s:g});"
            f" {len(self.in_flight)} in flight: {names}{more}",
            file=sys.stderr,
            flush=True,
        )
        if self.on_stall:
            self.on_stall(stall)
        return stall

    async def run(self) -> None:
        """Check until cancelled (no-op when disabled)."""
        if not self.watchdog_s:
            return
        period_s = min(max(self.watchdog_s / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period_s)
            self.check()

    def metrics(self) -> dict[str, Any]:
        """`{"watchdog_s", "stalls": [...]}` for the aggregate metrics."""
        return {"watchdog_s": self.watchdog_s, "stalls": self.stalls}
