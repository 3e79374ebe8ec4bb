"""The files of a collection as a sink of `nemo_gym.collect.engine.collect`: `RolloutFiles` writes `<out>.jsonl` and
its side files (`nemo_gym.collect.files.OutputPaths`: materialized inputs, failures, aggregate metrics, state) as
the rollouts complete, and resumes from them: pairs already in `<out>.jsonl` are not run again.

Used by `ng_collect_rollouts` (resume on by default) and by `ng_train` for its per-step files under
`output_dir/rollouts/` (`resume=False`: earlier files of the same name are moved aside as `.bak`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nemo_gym.collect.aggregate_metrics import write_aggregate_metrics
from nemo_gym.collect.files import (
    OutputPaths,
    Pair,
    check_same_input,
    compact_failures,
    move_aside,
    read_done,
    read_failures,
    rollout_input,
    write_state,
)
from nemo_gym.collect.plan import RolloutPlan
from nemo_gym.common.jsonl import JsonlAppender, write_jsonl
from nemo_gym.serving.client import ServerClient

__all__ = ["RolloutFiles", "collection_metrics", "input_fingerprint"]


def input_fingerprint(tasks: list[dict[str, Any]], num_repeats: int, *, add_seed: bool = False) -> str:
    """sha256 over the materialized task rows (keys sorted), `num_repeats` and (when set) `add_seed`; hex digest
    (`nemo_gym.collect.plan.RolloutPlan.fingerprint` of the plain plan)."""
    return RolloutPlan.uniform(tasks, num_repeats).fingerprint(add_seed=add_seed)


def collection_metrics(result: Any) -> dict[str, Any]:
    """The `collection` part of `<out>_aggregate_metrics.json` for a `CollectResult`."""
    return {
        "rollouts_expected": result.rollouts_expected,
        "rollouts_done": result.rollouts_done,
        "rollouts_this_run": len(result.rollouts),
        "rollouts_resumed": result.rollouts_resumed,
        "rollouts_failed": result.rollouts_expected - result.rollouts_done,
        "failures_by_class": result.failures_by_class,
        "mean_reward": result.mean_reward,
        "wall_s": result.wall_s,
        "rollouts_per_s": result.rollouts_per_s,
        "retries": result.retries,
        "watchdog": result.watchdog,
    }


class RolloutFiles:
    """A `CollectSink` writing `output` and its side files (see the module docstring).

    Args:
        output: the rollouts JSONL; its side files go next to it.
        resume: keep an earlier run's rows (its input must be the same, checked by `open`); False moves them aside.
        input_jsonl_fpath: the input named in the state file and in the messages.
    """

    def __init__(self, output: str | Path, *, resume: bool, input_jsonl_fpath: str):
        self.paths = OutputPaths.for_output(output)
        self.resume = resume
        self.input_jsonl_fpath = input_jsonl_fpath
        self.fingerprint = ""
        self.num_tasks = 0
        self.num_repeats: int | list[int] = 0
        self._outputs: JsonlAppender | None = None
        self._failure_log: JsonlAppender | None = None

    def open(
        self, plan: RolloutPlan, *, add_seed: bool = False
    ) -> tuple[dict[Pair, float], dict[Pair, dict[str, Any]]]:
        """Set earlier files aside (no resume), or refuse an earlier output made from another input and read it back;
        write the state and the materialized inputs (the rows as dispatched: `nemo_gym.collect.files.rollout_input`).
        The fingerprint is of the plan's rows as `collect` dispatches them (an environment server's rows routed to its
        agent), the same in every run of one command against the same servers.

        Raises:
            ConfigError: with resume, the earlier output was made from another input (saying what differs).
        """
        self.fingerprint = plan.fingerprint(add_seed=add_seed)
        self.num_tasks, self.num_repeats = plan.num_tasks, plan.state_repeats()
        if self.resume:
            check_same_input(self.paths, self.fingerprint, self.input_jsonl_fpath, self.num_repeats, self.num_tasks)
        else:
            move_aside(self.paths)
        done = read_done(self.paths, plan.rollouts_per_task())
        failures = {pair: record for pair, record in read_failures(self.paths.failures).items() if pair not in done}
        self._write_state()
        pairs, row_of = plan.pairs(), plan.row_of()
        write_jsonl(self.paths.materialized_inputs, (rollout_input(row_of(p), *p, add_seed=add_seed) for p in pairs))
        if done:
            print(
                f"Resuming: {len(done)}/{len(pairs)} rollouts already in {self.paths.output}; running the"
                f" {len(pairs) - len(done)} missing.",
                file=sys.stderr,
            )
        self._outputs, self._failure_log = JsonlAppender(self.paths.output), JsonlAppender(self.paths.failures)
        return done, failures

    def _write_state(self, **extra: Any) -> None:
        write_state(self.paths, self.fingerprint, self.input_jsonl_fpath, self.num_repeats, self.num_tasks, **extra)

    def add(self, rollout: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
        """Append a row to the output, or a failure record to the failures file (one flushed line each)."""
        if rollout is not None:
            self._outputs.append(rollout)
        else:
            self._failure_log.append(failure)

    def stalled(self, stall: dict[str, Any]) -> None:
        """Record a watchdog stall in the state file."""
        self._write_state(watchdog_stall=stall)

    def close(self, failures: dict[Pair, dict[str, Any]]) -> None:
        """fsync the appended files; the failures file keeps only the pairs still without a row (none: no file)."""
        for appender in (self._outputs, self._failure_log):
            if appender is not None:
                appender.close()
        compact_failures(self.paths.failures, failures)

    async def finish(self, result: Any, client: ServerClient) -> None:
        """Write `<out>_aggregate_metrics.json` over every row of the output (`nemo_gym.collect.aggregate_metrics`)."""
        await write_aggregate_metrics(
            client, self.paths.output, self.paths.aggregate_metrics, collection_metrics(result)
        )
