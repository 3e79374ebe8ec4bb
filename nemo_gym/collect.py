"""Rollout collection (`ng_collect_rollouts`): send dataset rows through agents and write rollouts as JSONL.

One rollout per (task index, repeat index): the row (with `responses_create_params` overrides merged over its
own, `agent_ref`, `_ng_task_index`, `_ng_rollout_index`) is POSTed to the agent's `/run`; the verify answer
merged over the row, with the two indices and `agent_ref`, is one line of the output, appended and flushed as
it completes. At most `num_samples_in_parallel` rollouts are in flight.

Files next to the output `<out>.jsonl` (ARCHITECTURE §3):
    <out>_materialized_inputs.jsonl  one row per (task, repeat) as dispatched
    <out>_failures.jsonl             rollouts that failed for infrastructure reasons (a `ServerError`, or an
                                     answer without a numeric reward): `failure_class`, `message`, indices,
                                     `transient` (whether a retry could have helped), `timestamp`, and the
                                     `response` a failed /verify got when the agent returns it (simple_agent
                                     does). Never in the output, never scored as reward 0. Absent when every
                                     rollout has a row.
    <out>_aggregate_metrics.json     `{"agents": [{agent_ref, agent_metrics, source}], "collection": {...}}`
    <out>_state.json                 fingerprint of the materialized input rows and num_repeats (for resume)
(written by `nemo_gym.collect_files`, which also reads them back to resume, and `nemo_gym.collect_metrics`).

Retries: a `/run` call is retried (up to `max_retries`, by `ServerClient`) only after a transient failure
(`nemo_gym.errors.is_transient`: connection error, timeout, 429 after its Retry-After, 502/503/504 whose
typed body names no deterministic failure class). A deterministic failure (a 4xx such as 422, an agent's 502
with an inner `judge_unparsable`, `bad_answer`, `sandbox_unavailable`, ...) is recorded at once: running the
same rollout again would fail the same way. Every call has a total deadline, so a collection against a
black-holed server ends with `timeout` records after at most `ClientTimeouts.worst_case_s()` per rollout.

Resume (the default): rerunning the same command runs only the (task, repeat) pairs without a row; a crash's
incomplete last line is cut off first, pairs only in the failures file are retried. A different input (rows,
limit, overrides, agent or num_repeats) is refused; `+resume=false` moves the old files aside as `.bak`.

Exit status of `collect_main`: 0 every rollout has a row, 1 some failed (see the failures file),
130 interrupted (Ctrl-C; rerun to resume). Errors before any rollout (bad input line, unknown agent, changed
input) raise `NemoGymError` subclasses; the CLI prints them and exits 2.

Compared with NeMo Gym's collector: as in its current version a row's own `agent_ref` wins over `agent_name`
(its first versions let `agent_name` override every row); an HTTP failure is a failures-file record instead of an
exception that stops the run; resume is on by default (NeMo Gym: `resume_from_cache=false`) and refuses an
output made from another input; the whole input is validated before the first rollout.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from nemo_gym.client import ClientTimeouts, ServerClient
from nemo_gym.collect_files import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, OutputPaths, Pair, check_same_input, compact_failures, count_lines, move_aside, now, read_done, read_failures, write_state
from nemo_gym.collect_metrics import AGENT_REF_KEY, is_reward, write_aggregate_metrics
from nemo_gym.collect_watchdog import CollectWatchdog
from nemo_gym.errors import ConfigError, DataError, ServerError, ServerHTTPError, is_transient
from nemo_gym.head import discover_head_url
from nemo_gym.jsonl import JsonlAppender, iter_jsonl, write_jsonl
from nemo_gym.processes import run_interruptible
from nemo_gym.responses_params import ResponsesCreateParams, unknown_keys

__all__ = [
    "CollectConfig",
    "CollectSummary",
    "OutputPaths",
    "collect_main",
    "collect_rollouts",
    "run_rollout",
    "load_tasks",
    "input_fingerprint",
    "TASK_INDEX_KEY",
    "ROLLOUT_INDEX_KEY",
    "AGENT_REF_KEY",
    "BAD_VERIFY_ANSWER",
]

BAD_VERIFY_ANSWER = "bad_verify_answer"


class CollectConfig(BaseModel):
    """Parameters of `ng_collect_rollouts`."""

    model_config = ConfigDict(extra="forbid")
    agent_name: str | None = Field(None, description="agent instance for rows without an agent_ref (a row's own agent_ref wins)")
    input_jsonl_fpath: str = Field(description="input JSONL: one task a line, each with a responses_create_params object")
    output_jsonl_fpath: str = Field(
        description="output JSONL of rollouts; side files <stem>_failures.jsonl, _materialized_inputs.jsonl, _aggregate_metrics.json, _state.json go next to it"
    )
    limit: int | None = Field(None, ge=1, description="use only the first `limit` rows of the input")
    num_repeats: int = Field(1, ge=1, description="rollouts per task (e.g. 4 for mean@4 or a GRPO group of 4)")
    num_samples_in_parallel: int = Field(32, ge=1, description="most rollouts in flight at once")
    responses_create_params: ResponsesCreateParams = Field(
        default_factory=dict, description="merged over each row's responses_create_params, e.g. {temperature: 0.7, max_output_tokens: 512} (Responses API create parameters)"
    )
    head_server_url: str | None = Field(None, description="head server URL; default $NEMO_GYM_HEAD_URL or the only running ng_run")
    resume: bool = Field(
        True,
        description="keep finished rollouts of an earlier run of the same command and run only the missing ones; false starts over (old files moved aside as .bak)",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one /run call, seconds")
    max_retries: int = Field(
        3, ge=0, description="retries of a /run call after a transient failure (connection error, timeout, 429, 502/503/504 without a deterministic inner failure class)"
    )
    progress: bool = Field(True, description="show a progress bar")
    watchdog_s: float = Field(
        300.0, ge=0, description="report (stderr, state file, aggregate metrics) when no rollout has completed for this many seconds, naming those in flight; 0 disables"
    )


@dataclass
class CollectSummary:
    """What a collection did. Counts are rollouts; `wall_s` and `rollouts_per_s` cover this run only."""

    output_jsonl_fpath: str
    rollouts_expected: int
    rollouts_done: int
    rollouts_this_run: int
    rollouts_resumed: int
    failures_by_class: dict[str, int]
    mean_reward: float | None
    wall_s: float
    retries: int
    failures_jsonl_fpath: str
    watchdog: dict[str, Any] = field(default_factory=dict)

    @property
    def rollouts_missing(self) -> int:
        return self.rollouts_expected - self.rollouts_done

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts_this_run / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def exit_status(self) -> int:
        return 0 if self.rollouts_missing == 0 else 1

    def as_metrics(self) -> dict[str, Any]:
        """The `collection` part of `<out>_aggregate_metrics.json`."""
        return {
            "rollouts_expected": self.rollouts_expected,
            "rollouts_done": self.rollouts_done,
            "rollouts_this_run": self.rollouts_this_run,
            "rollouts_resumed": self.rollouts_resumed,
            "rollouts_failed": self.rollouts_missing,
            "failures_by_class": self.failures_by_class,
            "mean_reward": self.mean_reward,
            "wall_s": self.wall_s,
            "rollouts_per_s": self.rollouts_per_s,
            "retries": self.retries,
            "watchdog": self.watchdog,
        }

    def format(self) -> str:
        mean = "n/a" if self.mean_reward is None else f"{self.mean_reward:.4f}"
        lines = [
            (
                f"Rollouts: {self.rollouts_done}/{self.rollouts_expected} in {self.output_jsonl_fpath} "
                f"({self.rollouts_this_run} this run, {self.rollouts_resumed} from an earlier run)"
            ),
            f"Mean reward: {mean}",
            f"Wall time: {self.wall_s:.1f} s, {self.rollouts_per_s:.2f} rollouts/s, {self.retries} retries",
        ]
        if self.rollouts_missing:
            classes = ", ".join(f"{name}: {n}" for name, n in sorted(self.failures_by_class.items())) or "none this run"
            lines.append(
                f"Failed: {self.rollouts_missing} rollouts ({classes}); they are in {self.failures_jsonl_fpath}, "
                "not in the output. Rerun the same command to retry them."
            )
        return "\n".join(lines)


# -- input -----------------------------------------------------------------------------------------------
def load_tasks(cfg: CollectConfig) -> list[dict[str, Any]]:
    """The input rows, validated and materialized: overrides merged, `agent_ref` resolved, `_ng_*` keys dropped.

    Only the first `cfg.limit` rows are read. Every row is checked before any rollout starts.

    Raises:
        DataError: a line is not a JSON object, has no `responses_create_params` object or one with a key that is
            no Responses API create parameter (`nemo_gym.responses_params`), has a malformed
            `agent_ref`, or has no agent (no `agent_ref` and no `agent_name`); or the input has no rows.
    """
    tasks: list[dict[str, Any]] = []
    lines_without_agent: list[int] = []
    path = cfg.input_jsonl_fpath
    for line_no, row in iter_jsonl(path, limit=cfg.limit):
        params = row.get("responses_create_params")
        if not isinstance(params, dict):
            got = "it is missing" if params is None else f"got {type(params).__name__}"
            raise DataError(f"{path}:{line_no}: needs a `responses_create_params` object ({got})")
        if problems := unknown_keys(params):
            raise DataError(f"{path}:{line_no}: responses_create_params: {'; '.join(problems)}")
        agent_ref = row.get(AGENT_REF_KEY)
        if agent_ref is None and cfg.agent_name:
            agent_ref = {"name": cfg.agent_name}
        elif agent_ref is None:
            lines_without_agent.append(line_no)
        elif not (isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str)):
            raise DataError(f'{path}:{line_no}: agent_ref must be an object {{"name": "<agent instance>"}}, got {agent_ref!r}')
        task = {k: v for k, v in row.items() if k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)}
        task["responses_create_params"] = {**params, **cfg.responses_create_params}
        task[AGENT_REF_KEY] = agent_ref
        tasks.append(task)
    if lines_without_agent:
        shown = ", ".join(f"{path}:{n}" for n in lines_without_agent[:10])
        more = f" and {len(lines_without_agent) - 10} more" if len(lines_without_agent) > 10 else ""
        raise DataError(f"{shown}{more}: row has no agent_ref; pass +agent_name=<agent instance> or add agent_ref to the rows")
    if not tasks:
        raise DataError(f"{path}: no rows")
    return tasks


def input_fingerprint(tasks: list[dict[str, Any]], num_repeats: int) -> str:
    """sha256 over the materialized task rows (keys sorted) and `num_repeats`; hex digest."""
    digest = hashlib.sha256(f"num_repeats={num_repeats}\n".encode())
    for task in tasks:
        digest.update(orjson.dumps(task, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
        digest.update(b"\n")
    return digest.hexdigest()


def _dispatched_row(task: dict[str, Any], pair: Pair) -> dict[str, Any]:
    return {**task, TASK_INDEX_KEY: pair[0], ROLLOUT_INDEX_KEY: pair[1]}


def _all_pairs(num_tasks: int, num_repeats: int) -> Iterator[Pair]:
    return ((t, r) for t in range(num_tasks) for r in range(num_repeats))


# -- one rollout --------------------------------------------------------------------------------------------
def _failure_record(row: dict[str, Any], failure_class: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        TASK_INDEX_KEY: row[TASK_INDEX_KEY],
        ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY],
        AGENT_REF_KEY: row[AGENT_REF_KEY],
        "failure_class": failure_class,
        "message": message[:4000],
        **extra,
        "timestamp": now(),
    }


def _server_failure(row: dict[str, Any], exc: ServerError) -> dict[str, Any]:
    """A failure record for a ServerError; an agent's typed body `{"error": {"type", "message"}}` gives the class."""
    failure_class, message, extra = exc.failure_class, str(exc), {"transient": is_transient(exc)}
    if isinstance(exc, ServerHTTPError):
        extra["status_code"] = exc.status_code
        try:
            error = orjson.loads(exc.body).get("error")
        except (orjson.JSONDecodeError, AttributeError):
            error = None
        if isinstance(error, dict) and isinstance(error.get("type"), str):
            failure_class = error["type"]
            message = str(error.get("message") or message)
            if error.get("server"):
                extra["failed_server"] = error["server"]
            if isinstance(error.get("response"), dict):  # the trajectory a failed /verify got (simple_agent): to debug the verifier
                extra["response"] = error["response"]
    return _failure_record(row, failure_class, message, **extra)


async def run_rollout(client: ServerClient, row: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """One rollout: POST a dispatched row (with `agent_ref`, `_ng_task_index`, `_ng_rollout_index`) to its agent's
    `/run`. Returns `(output row, None)`, or `(None, failure record)` when it failed (a `ServerError`, or an answer
    without a numeric finite reward): a failure is a value with its class and message, never a reward of 0."""
    try:
        answer = await client.post(row[AGENT_REF_KEY]["name"], "/run", row)
    except ServerError as exc:
        return None, _server_failure(row, exc)
    except ValueError as exc:  # a 2xx answer that is not JSON
        return None, _failure_record(row, BAD_VERIFY_ANSWER, f"answer is not JSON: {exc}")
    if not isinstance(answer, dict) or not is_reward(answer.get("reward")):
        got = repr(answer.get("reward")) if isinstance(answer, dict) else f"a {type(answer).__name__}"
        return None, _failure_record(row, BAD_VERIFY_ANSWER, f"verify answer has no numeric finite `reward` (got {got})")
    keys = {TASK_INDEX_KEY: row[TASK_INDEX_KEY], ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY], AGENT_REF_KEY: row[AGENT_REF_KEY]}
    return {**row, **answer, **keys}, None


# -- the run --------------------------------------------------------------------------------------------
@dataclass
class _Progress:
    """Mutable state of a run: counts, rewards, the failures, the progress bar."""

    bar: tqdm
    reward_sum: float
    reward_count: int
    started_s: float = field(default_factory=time.monotonic)
    done_this_run: int = 0
    failures: Counter = field(default_factory=Counter)

    def add_reward(self, reward: float) -> None:
        self.done_this_run += 1
        self.reward_sum += reward
        self.reward_count += 1
        self._update()

    def add_failure(self, failure_class: str) -> None:
        self.failures[failure_class] += 1
        self._update()

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None

    def _update(self) -> None:
        elapsed_s = max(time.monotonic() - self.started_s, 1e-9)
        mean = self.mean_reward
        self.bar.set_postfix(
            {
                "rollouts/s": f"{self.done_this_run / elapsed_s:.2f}",
                "mean_reward": "n/a" if mean is None else f"{mean:.3f}",
                "failed": sum(self.failures.values()),
            },
            refresh=False,
        )
        self.bar.update(1)


async def _dispatch(
    client: ServerClient,
    rows: Iterator[dict[str, Any]],
    num_parallel: int,
    on_done: Any,
    watchdog: CollectWatchdog,
) -> None:
    """Run rollouts for `rows` with `num_parallel` workers; `on_done(output row | None, failure | None)`;
    `watchdog` is told when each rollout starts and ends.

    On cancellation the workers are cancelled (their rollouts are lost, to be redone on resume) and
    CancelledError propagates.
    """

    async def worker() -> None:
        for row in rows:  # one shared iterator: next() never interleaves in asyncio
            pair = (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY])
            watchdog.started(pair)
            result = await run_rollout(client, row)
            watchdog.finished(pair)
            on_done(*result)

    workers = [asyncio.create_task(worker()) for _ in range(num_parallel)]
    watching = asyncio.create_task(watchdog.run())
    try:
        await asyncio.gather(*workers)
    finally:
        for task in [*workers, watching]:
            task.cancel()
        await asyncio.gather(*workers, watching, return_exceptions=True)


async def _check_agents(client: ServerClient, cfg: CollectConfig, tasks: list[dict[str, Any]]) -> None:
    """Resolve every agent's address and check every row against its environment's row schema, before
    any rollout (ServerError names an unknown agent; DataError names `file:line` and the task field)."""
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
    if not validators:
        return
    for (line_no, _), task in zip(iter_jsonl(cfg.input_jsonl_fpath, limit=cfg.limit), tasks):
        validator = validators.get(task[AGENT_REF_KEY]["name"])
        error = next(iter(validator.iter_errors(task)), None) if validator else None
        if error is not None:
            field = ".".join(str(p) for p in error.absolute_path) or "row"
            raise DataError(f"{cfg.input_jsonl_fpath}:{line_no}: task field {field}: {error.message} (required by the environment of agent {task[AGENT_REF_KEY]['name']!r})")


@dataclass
class _Plan:
    """What a run has to do: the tasks, the files, the pairs already done (→ reward) and the pending ones."""

    tasks: list[dict[str, Any]]
    paths: OutputPaths
    done: dict[Pair, float]
    failures: dict[Pair, dict[str, Any]]
    pending: list[Pair]
    total: int
    fingerprint: str


async def _prepare(cfg: CollectConfig, client: ServerClient) -> _Plan:
    """Validate the input, check or set aside earlier files, write the state and materialized inputs."""
    tasks = load_tasks(cfg)
    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    fingerprint = input_fingerprint(tasks, cfg.num_repeats)
    if cfg.resume:
        check_same_input(paths, fingerprint, cfg.input_jsonl_fpath, cfg.num_repeats, len(tasks))
    await _check_agents(client, cfg, tasks)
    if not cfg.resume:
        move_aside(paths)
    done = read_done(paths, len(tasks), cfg.num_repeats)
    failures = {pair: record for pair, record in read_failures(paths.failures).items() if pair not in done}
    write_state(paths, fingerprint, cfg.input_jsonl_fpath, cfg.num_repeats, len(tasks))
    all_pairs = list(_all_pairs(len(tasks), cfg.num_repeats))
    write_jsonl(paths.materialized_inputs, (_dispatched_row(tasks[t], (t, r)) for t, r in all_pairs))
    pending = [pair for pair in all_pairs if pair not in done]
    if done:
        print(f"Resuming: {len(done)}/{len(all_pairs)} rollouts already in {paths.output}; running the {len(pending)} missing.", file=sys.stderr)
    return _Plan(tasks, paths, done, failures, pending, len(all_pairs), fingerprint)


async def collect_rollouts(cfg: CollectConfig, client: ServerClient) -> CollectSummary:
    """Collect the rollouts of `cfg` through `client`; see the module docstring for the files and resume.

    Raises:
        DataError: a bad input line (before any rollout) or a corrupt earlier output.
        ConfigError: the earlier output was made from a different input.
        ServerError: an agent is not known to the head server (before any rollout).
        asyncio.CancelledError: cancelled (Ctrl-C); finished rollouts are on disk, resume completes the rest.
    """
    plan = await _prepare(cfg, client)
    previous_rewards = [r for r in plan.done.values() if math.isfinite(r)]
    bar = tqdm(
        total=plan.total, initial=len(plan.done), desc="Collecting rollouts", unit="rollout", disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True
    )
    progress = _Progress(bar, reward_sum=sum(previous_rewards), reward_count=len(previous_rewards))
    retries_before = client.retries_used
    outputs, failure_log = JsonlAppender(plan.paths.output), JsonlAppender(plan.paths.failures)

    def on_done(output_row: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
        record = output_row if output_row is not None else failure
        pair = (record[TASK_INDEX_KEY], record[ROLLOUT_INDEX_KEY])
        if output_row is not None:
            outputs.append(output_row)
            plan.done[pair] = float(output_row["reward"])
            plan.failures.pop(pair, None)
            progress.add_reward(plan.done[pair])
        else:
            failure_log.append(failure)
            plan.failures[pair] = failure
            progress.add_failure(failure["failure_class"])

    def on_stall(stall: dict[str, Any]) -> None:
        write_state(plan.paths, plan.fingerprint, cfg.input_jsonl_fpath, cfg.num_repeats, len(plan.tasks), watchdog_stall=stall)

    watchdog = CollectWatchdog(cfg.watchdog_s, lambda pair: plan.tasks[pair[0]][AGENT_REF_KEY]["name"], on_stall)
    try:
        rows = (_dispatched_row(plan.tasks[t], (t, r)) for t, r in plan.pending)
        await _dispatch(client, rows, min(cfg.num_samples_in_parallel, max(len(plan.pending), 1)), on_done, watchdog)
    finally:  # also on Ctrl-C: every written row is whole; fsync; failures file holds only still-missing pairs
        bar.close()
        outputs.close()
        failure_log.close()
        compact_failures(plan.paths.failures, plan.failures)

    summary = CollectSummary(
        output_jsonl_fpath=str(plan.paths.output),
        rollouts_expected=plan.total,
        rollouts_done=len(plan.done),
        rollouts_this_run=progress.done_this_run,
        rollouts_resumed=plan.total - len(plan.pending),
        failures_by_class=dict(progress.failures),
        mean_reward=progress.mean_reward,
        wall_s=time.monotonic() - progress.started_s,
        retries=client.retries_used - retries_before,
        failures_jsonl_fpath=str(plan.paths.failures),
        watchdog=watchdog.metrics(),
    )
    await write_aggregate_metrics(client, plan.paths.output, plan.paths.aggregate_metrics, summary.as_metrics())
    return summary


# -- entry ----------------------------------------------------------------------------------------------
def collect_main(cfg: CollectConfig) -> int:
    """`ng_collect_rollouts`: collect, print the summary; returns the exit status (0, 1 or 130)."""
    head_url = discover_head_url(cfg.head_server_url)
    timeouts = ClientTimeouts(read_s=cfg.request_timeout_s, max_retries=cfg.max_retries)

    async def run() -> CollectSummary:
        async with ServerClient(head_url, timeouts=timeouts, max_connections=max(64, 2 * cfg.num_samples_in_parallel)) as client:
            return await collect_rollouts(cfg, client)

    try:
        summary = run_interruptible(run())  # SIGINT / SIGTERM: finished rollouts stay saved, exit 130
    except KeyboardInterrupt:
        paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
        saved = count_lines(paths.output)
        print(
            f"\nInterrupted: {saved} finished rollouts are saved in {paths.output}. Rerun the same command to collect only the missing ones.",
            file=sys.stderr,
        )
        return 130
    print(summary.format())
    return summary.exit_status
