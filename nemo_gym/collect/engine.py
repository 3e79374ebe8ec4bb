"""Rollout collection in memory: task rows in, rollouts and failure records out (`collect`).

The engine under `ng_collect_rollouts` (`nemo_gym.collect.command`, which adds the files and their resume as a sink,
`nemo_gym.collect.sink.RolloutFiles`) and under `ng_train`'s rollouts (rows in memory; the per-step files are a
sink too). One rollout per (task index, repeat index): the task row with `agent_ref`, `_ng_task_index` and
`_ng_rollout_index` is POSTed to its agent's `/run`; the verify answer merged over the row is a rollout; a failed
rollout (a `ServerError`, or an answer without a numeric finite reward) is a failure record with its class, never
a reward of 0. At most `concurrency` rollouts are in flight. A rollout that failed `unavailable` is recorded only
once its agent answers a probe: when the head server (also probed every second) or the agent is gone, the collection
stops instead and the rollouts not finished are left for a resume (`nemo_gym.collect.liveness`).

Task rows are checked before any rollout: the row checks of `nemo_gym.collect.tasks.materialize_task` (a bad row
named by its location: `file:line` for rows read from a file by `nemo_gym.collect.tasks.read_tasks`, else `row <i>`),
then every agent's address and the row schema of its environment (`check_agents`).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonschema import Draft202012Validator
from tqdm import tqdm

from nemo_gym.collect.attempts import RerunPolicy, rollout_inputs
from nemo_gym.collect.files import Pair
from nemo_gym.collect.liveness import DEFAULT_SERVERS_GONE_S, UNAVAILABLE, ServerLiveness
from nemo_gym.collect.plan import RolloutPlan, plan_rollouts
from nemo_gym.collect.rollout import run_rollout
from nemo_gym.collect.routing import (
    dispatch_target,
    resolve_task_sources,
    route_tasksets,
    route_through_environment_servers,
)
from nemo_gym.collect.tasks import check_seedable, materialize_all, routing_key, taskset_of
from nemo_gym.collect.token_capture import TokenCaptureRebuild
from nemo_gym.collect.watchdog import CollectWatchdog
from nemo_gym.common.errors import DataError, ServerHTTPError
from nemo_gym.common.jsonl import (
    AGENT_REF_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
)
from nemo_gym.serving.client import ServerClient

__all__ = ["CollectResult", "CollectSink", "collect", "check_agents"]


async def check_agents(client: ServerClient, tasks: Sequence[dict[str, Any]], where: Callable[[int], str]) -> None:
    """Resolve every agent's address and check every task against its environment's row schema, before any
    rollout. `where(i)` names task i in an error (e.g. `file:line`).

    Raises:
        ServerError: an agent is not known to the head server. DataError: `where(i): task field ...`.
    """
    schemas: dict[str, dict[str, Any] | None] = {}
    for name in sorted({task[AGENT_REF_KEY]["name"] for task in tasks}):
        await client.server_url(name)
        try:
            schemas[name] = await client.get(name, "/row_schema")
        except ServerHTTPError as exc:
            if exc.status_code not in (404, 405):  # agents and environments without the route (NeMo Gym's)
                raise
            schemas[name] = None
    validators = {name: Draft202012Validator(schema) for name, schema in schemas.items() if schema}
    for index, task in enumerate(tasks if validators else []):
        # a materialized task (NeMo Gym 0.7.0) is its environment server's episode input, not the agent's row
        validator = validators.get(task[AGENT_REF_KEY]["name"]) if taskset_of(task) is None else None
        error = next(iter(validator.iter_errors(task)), None) if validator else None
        if error is not None:
            path = ".".join(str(p) for p in error.absolute_path) or "row"
            raise DataError(
                f"{where(index)}: task field {path}: {error.message} (required by the environment of agent"
                f" {task[AGENT_REF_KEY]['name']!r})"
            )


# -- sinks and the result ---------------------------------------------------------------------------------------
class CollectSink(Protocol):
    """Where a collection also goes as it runs (files: `nemo_gym.collect.sink.RolloutFiles`). `collect` calls `open`
    once, `add` for each finished rollout and `stalled` for each watchdog stall, `close` once (also when cancelled),
    then `finish` once when it was not cancelled."""

    def open(
        self, plan: RolloutPlan, *, add_seed: bool = False
    ) -> tuple[dict[Pair, float], dict[Pair, dict[str, Any]]]:
        """After the checks, before any rollout: (reward of each pair an earlier run finished: not run again,
        the failure record of each pair an earlier run failed: run again). Pair (t, r)'s row as dispatched is
        `nemo_gym.collect.files.rollout_input(plan.row_of()((t, r)), t, r, add_seed=add_seed)`."""
        ...

    def add(self, rollout: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
        """A finished rollout (a row, or a failure record), as it completes."""
        ...

    def stalled(self, stall: dict[str, Any]) -> None:
        """A watchdog stall record (`nemo_gym.collect.watchdog`)."""
        ...

    def close(self, failures: dict[Pair, dict[str, Any]]) -> None:
        """At the end, also when cancelled: the failure record of each pair still without a row."""
        ...

    async def finish(self, result: CollectResult, client: ServerClient) -> None:
        """After a collection that was not cancelled."""
        ...


@dataclass
class CollectResult:
    """What `collect` did. Counts are rollouts; `wall_s` covers this run only.

    rollouts: this run's rollout rows, in completion order; failures: the failure record of each pair still without
    a row (in pair order); rollouts_resumed: pairs a sink's earlier run had finished (not run again);
    failures_by_class: this run's failed attempts by class; mean_reward: over every finished pair (earlier ones too);
    not_retried: an earlier run's failed pairs not sent again, by why (`nemo_gym.collect.attempts.RerunPolicy.held`).
    """

    rollouts: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    rollouts_expected: int
    rollouts_resumed: int
    failures_by_class: dict[str, int]
    mean_reward: float | None
    wall_s: float
    retries: int
    watchdog: dict[str, Any] = field(default_factory=dict)
    not_retried: dict[str, int] = field(default_factory=dict)

    @property
    def rollouts_done(self) -> int:
        return self.rollouts_resumed + len(self.rollouts)

    @property
    def rollouts_per_s(self) -> float:
        return len(self.rollouts) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class _Progress:
    """Mutable state of a run: the finished and failed pairs, rewards, the progress bar."""

    bar: tqdm
    done: dict[Pair, float]
    failures: dict[Pair, dict[str, Any]]
    reward_sum: float = 0.0
    reward_count: int = 0
    started_s: float = field(default_factory=time.monotonic)
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    failure_classes: Counter = field(default_factory=Counter)
    not_retried: dict[str, int] = field(default_factory=dict)
    resumed: int = 0

    def __post_init__(self) -> None:
        previous = [r for r in self.done.values() if math.isfinite(r)]
        self.reward_sum, self.reward_count, self.resumed = sum(previous), len(previous), len(self.done)

    @classmethod
    def start(
        cls,
        done: dict[Pair, float],
        failures: dict[Pair, dict[str, Any]],
        total: int,
        *,
        show: bool,
        not_retried: dict[str, int],
    ) -> _Progress:
        """The state at the start of a run of `total` rollouts, `done` of them by an earlier run, `failures` by an
        earlier run (`not_retried` of them, by why, not sent again), with its progress bar on stderr (hidden unless
        `show`)."""
        bar = tqdm(
            total=total,
            initial=len(done),
            desc="Collecting rollouts",
            unit="rollout",
            disable=not show,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        return cls(bar, done, failures, not_retried=not_retried)

    def sending_to(self, sink: CollectSink) -> Callable[[dict[str, Any] | None, dict[str, Any] | None], None]:
        """The dispatch's `on_done`: each finished rollout (or failure record) counted here, then given to `sink`."""

        def on_done(rollout: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
            self.add(rollout, failure)
            sink.add(rollout, failure)

        return on_done

    def add(self, rollout: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
        record = rollout if rollout is not None else failure
        pair = (record[TASK_INDEX_KEY], record[ROLLOUT_INDEX_KEY])
        if rollout is not None:
            self.rollouts.append(rollout)
            self.done[pair] = float(rollout["reward"])
            self.failures.pop(pair, None)
            self.reward_sum += self.done[pair]
            self.reward_count += 1
        else:
            self.failures[pair] = failure
            self.failure_classes[failure["failure_class"]] += 1
        self._update()

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None

    def result(self, expected: int, retries: int, watchdog: dict[str, Any]) -> CollectResult:
        """What the run did, now (counts in rollouts)."""
        return CollectResult(
            rollouts=self.rollouts,
            failures=[self.failures[pair] for pair in sorted(self.failures)],
            rollouts_expected=expected,
            rollouts_resumed=self.resumed,
            failures_by_class=dict(self.failure_classes),
            mean_reward=self.mean_reward,
            wall_s=time.monotonic() - self.started_s,
            retries=retries,
            watchdog=watchdog,
            not_retried=self.not_retried,
        )

    def _update(self) -> None:
        elapsed_s = max(time.monotonic() - self.started_s, 1e-9)
        mean = self.mean_reward
        postfix = {
            "rollouts/s": f"{len(self.rollouts) / elapsed_s:.2f}",
            "mean_reward": "n/a" if mean is None else f"{mean:.3f}",
            "failed": sum(self.failure_classes.values()),
        }
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)


async def _dispatch(
    client: ServerClient,
    rows: Iterator[dict[str, Any]],
    num_parallel: int,
    on_done: Callable[..., None],
    watchdog: CollectWatchdog,
    liveness: ServerLiveness,
    observe: bool = False,
) -> None:
    """Run rollouts for `rows` with `num_parallel` workers; `on_done(output row | None, failure | None)`;
    `watchdog` is told when each rollout starts and ends; `liveness` watches the head server and checks the servers
    after each `unavailable` failure before it is recorded. The records of a captured agent's rollout
    (`nemo_gym.collect.token_capture`) are removed before it is sent, and the rollout is rebuilt from them after
    (its MaskedCaptureError stops the collection).

    When the servers are gone (`liveness` raises ServersGoneError) or on cancellation, the workers are cancelled
    (their rollouts are not recorded, to be redone on resume) and the exception propagates.
    """

    token_capture = await TokenCaptureRebuild.discover(client)

    async def worker() -> None:
        for row in rows:  # one shared iterator: next() never interleaves in asyncio
            pair, agent = (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]), dispatch_target(row)
            watchdog.started(pair)
            if token_capture is not None:
                await token_capture.before(row)
            rollout, failure = await run_rollout(client, row, observe=observe)
            if token_capture is not None and rollout is not None:
                await token_capture.after(rollout)
            if failure is not None and failure["failure_class"] == UNAVAILABLE:
                await liveness.check(agent)  # ServersGoneError: this rollout is left for the resume
            else:
                liveness.answered(agent)
            watchdog.finished(pair)
            on_done(rollout, failure)

    workers = [asyncio.create_task(worker()) for _ in range(num_parallel)]
    watchers = [asyncio.create_task(watchdog.run()), asyncio.create_task(liveness.watch())]
    all_workers = asyncio.gather(*workers)
    try:
        running: set[asyncio.Future] = {all_workers, *watchers}
        while all_workers in running:  # until every worker is done, or a worker or a watcher raises
            finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for future in finished:
                future.result()
    finally:
        for task in [*workers, *watchers]:
            task.cancel()
        await asyncio.gather(all_workers, *workers, *watchers, return_exceptions=True)


@dataclass
class _Sinks:
    """The sinks of a collection as one `CollectSink` (each call goes to every sink, in order)."""

    sinks: Sequence[CollectSink]

    def open(
        self, plan: RolloutPlan, *, add_seed: bool = False
    ) -> tuple[dict[Pair, float], dict[Pair, dict[str, Any]]]:
        """What every sink's earlier run finished, and the failures of the pairs none of them finished."""
        done: dict[Pair, float] = {}
        failures: dict[Pair, dict[str, Any]] = {}
        for sink in self.sinks:
            earlier_done, earlier_failures = sink.open(plan, add_seed=add_seed)
            done.update(earlier_done)
            failures.update(earlier_failures)
        return done, {pair: record for pair, record in failures.items() if pair not in done}

    def add(self, rollout: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
        for sink in self.sinks:
            sink.add(rollout, failure)

    def stalled(self, stall: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.stalled(stall)

    def close(self, failures: dict[Pair, dict[str, Any]]) -> None:
        for sink in self.sinks:
            sink.close(failures)

    async def finish(self, result: CollectResult, client: ServerClient) -> None:
        for sink in self.sinks:
            await sink.finish(result, client)


@dataclass(frozen=True)
class _Planning:
    """`collect`'s parameters that decide which rollouts run and where (`_plan_and_check`)."""

    agent_name: str | None
    responses_create_params: dict[str, Any] | None
    num_repeats: int | Mapping[str, int]
    fan_out: Mapping[str, Sequence[str]] | None
    routing_keys: Sequence[str | None] | None
    add_seed: bool
    environment_server_routes: dict[str, str] | None


async def _plan_and_check(
    client: ServerClient,
    rows: Sequence[dict[str, Any]],
    where: Callable[[int], str],
    options: _Planning,
) -> RolloutPlan:
    """The rollouts of `rows` (materialized, `nemo_gym.collect.plan`), routed and checked before any rollout, in place
    on the plan's rows: NeMo Gym 0.7.0's materialized tasks get their taskset's environment server
    (`environment_server_routes`), `task_source` rows their agent, rows for an environment server are routed to it
    (`nemo_gym.collect.routing`); then every row can take its seed (`add_seed`), and every agent is known with its
    row schema (`check_agents`). `where(i)` names row i."""
    located = [(where(i), row) for i, row in enumerate(rows)]
    tasks = materialize_all(located, options.agent_name, options.responses_create_params, "rows")
    keys = options.routing_keys or [routing_key(row) for row in rows]
    plan = plan_rollouts(tasks, keys, options.num_repeats, options.fan_out, where)
    tasks = plan.rows()

    def named(i: int) -> str:  # the plan's row i, named by its task
        return where(plan.entries[i].task_index)

    await route_tasksets(client, tasks, options.environment_server_routes or {}, named)
    await resolve_task_sources(client, tasks, named)
    if options.add_seed:
        check_seedable(tasks, named)
    await route_through_environment_servers(client, tasks)
    await check_agents(client, tasks, named)
    return plan


async def collect(
    rows: Sequence[dict[str, Any]],
    client: ServerClient,
    *,
    num_repeats: int | Mapping[str, int] = 1,
    fan_out: Mapping[str, Sequence[str]] | None = None,
    routing_keys: Sequence[str | None] | None = None,
    concurrency: int = 32,
    agent_name: str | None = None,
    responses_create_params: dict[str, Any] | None = None,
    sinks: Sequence[CollectSink] = (),
    where: Callable[[int], str] | None = None,
    progress: bool = False,
    watchdog_s: float = 0.0,
    servers_gone_s: float = DEFAULT_SERVERS_GONE_S,
    add_seed: bool = False,
    interleave_repeats: bool = False,
    environment_server_routes: dict[str, str] | None = None,
    rerun: RerunPolicy = RerunPolicy(),
    observability_enabled: bool = False,
) -> CollectResult:
    """`num_repeats` rollouts of each task row through its agent (or NeMo Gym 0.7.0's dict and `fan_out` by each
    row's routing key, `routing_keys[i]`, default row i's own: `nemo_gym.collect.plan`), at most `concurrency` in
    flight; nothing is written unless a sink is given (module docstring; `sinks` also give the pairs to resume).

    `rows`: task rows (checked and materialized here, see `materialize_task`); `where(i)` names row i in an error
    (default `row <i>`); `watchdog_s` reports stalls (0: off); `servers_gone_s`: how long an agent may refuse every
    connection before the collection stops (`nemo_gym.collect.liveness`); `add_seed`, `interleave_repeats`: NeMo Gym's;
    its `environment_server_routes` (taskset -> environment server) route its materialized tasks; `rerun`: which of
    an earlier run's failed rollouts are sent again (`nemo_gym.collect.attempts`; the others keep their records);
    `observability_enabled` (0.7.0's): each rollout with its `ng_trajectory` and `ng_perf` (`run_rollout`'s `observe`).
    A captured agent's rollouts are rebuilt from their recorded model calls (`nemo_gym.collect.token_capture`).

    Raises:
        DataError: a bad row, one its environment's row schema refuses, or one no entry of a `num_repeats` dict
            matches; ServerError: an agent is not known to the head server (both before any rollout).
        ServersGoneError: the head server or an agent stopped answering; the rollouts not finished are not recorded.
        MaskedCaptureError: more rebuilt rollouts were masked than the run's `token_id_capture.max_mask_fraction`.
        asyncio.CancelledError: cancelled. Both: the sinks are closed with what finished (a resume runs the rest).
    """
    planning = _Planning(
        agent_name, responses_create_params, num_repeats, fan_out, routing_keys, add_seed, environment_server_routes
    )
    plan = await _plan_and_check(client, rows, where or (lambda index: f"row {index}"), planning)
    done, failures = (every_sink := _Sinks(sinks)).open(plan, add_seed=add_seed)
    pending, not_retried = rerun.to_send(plan.pairs(interleave_repeats), done, failures)
    dispatched = rollout_inputs(pending, plan.row_of(), failures, add_seed)
    state = _Progress.start(done, failures, plan.total, show=progress, not_retried=not_retried)  # it adds to `done`
    row_of, retries_before, on_done = plan.row_of(), client.retries_used, state.sending_to(every_sink)
    watchdog = CollectWatchdog(watchdog_s, lambda pair: dispatch_target(row_of(pair)), every_sink.stalled)
    liveness = ServerLiveness(client, (dispatch_target(row) for row in plan.rows()), servers_gone_s=servers_gone_s)
    workers = min(concurrency, max(len(pending), 1))
    try:
        await _dispatch(client, dispatched, workers, on_done, watchdog, liveness, observability_enabled)
    finally:  # also when cancelled or the servers are gone: every sink holds what finished
        state.bar.close()
        every_sink.close(state.failures)
    result = state.result(plan.total, client.retries_used - retries_before, watchdog.metrics())
    await every_sink.finish(result, client)
    return result
