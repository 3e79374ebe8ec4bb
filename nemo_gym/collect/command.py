"""Rollout collection (`ng_collect_rollouts`): send dataset rows through agents and write rollouts as JSONL.

One rollout per (task index, repeat index): the row (with `responses_create_params` overrides merged over its
own, `agent_ref`, `_ng_task_index`, `_ng_rollout_index`) is POSTed to the agent's `/run`; the verify answer
merged over the row, with the two indices and `agent_ref`, is one line of the output, appended and flushed as
it completes. At most `num_samples_in_parallel` rollouts are in flight.

Files next to the output `<out>.jsonl` (docs/architecture.md, Data formats):
    <out>_materialized_inputs.jsonl  one row per (task, repeat) as dispatched
    <out>_failures.jsonl             rollouts that failed for infrastructure reasons (a `ServerError`, or an
                                     answer without a numeric reward): `failure_class`, `message`, indices,
                                     `transient` (whether a retry could have helped), `timestamp`, and the
                                     `response` a failed /verify got when the agent returns it (simple_agent
                                     does). Never in the output, never scored as reward 0. Absent when every
                                     rollout has a row.
    <out>_aggregate_metrics.json     `{"agents": [{agent_ref, agent_metrics, source}], "collection": {...}}`
    <out>_state.json                 fingerprint of the materialized input rows and num_repeats (for resume)
(written by `nemo_gym.collect.sink.RolloutFiles` with `nemo_gym.collect.files`, which also reads them back to
resume, and `nemo_gym.collect.aggregate_metrics`). The collection itself runs in memory
(`nemo_gym.collect.engine.collect`:
task rows in, rollouts and failure records out, `collect` here too); the files are its sink, which `ng_train`
uses for its per-step rollout files as well.

Retries: a `/run` call is retried (up to `max_retries`, by `ServerClient`) only after a transient failure
(`nemo_gym.common.errors.is_transient`: connection error, timeout, 429 after its Retry-After, 502/503/504 whose
typed body names no deterministic failure class). A deterministic failure (a 4xx such as 422, an agent's 502
with an inner `judge_unparsable`, `bad_answer`, `sandbox_unavailable`, ...) is recorded at once: running the
same rollout again would fail the same way. Every call has a total deadline, so a collection against a
black-holed server ends with `timeout` records after at most `ClientTimeouts.worst_case_s()` per rollout.

Resume (the default): rerunning the same command runs only the (task, repeat) pairs without a row; a crash's
incomplete last line is cut off first, pairs only in the failures file are retried as their next attempt, except
one whose failure was terminal or that failed `+max_rollout_attempts` times (`nemo_gym.collect.attempts`, as NeMo
Gym 0.7.0 decides). A different input (rows,
limit, overrides, agent or num_repeats) is refused; `+resume=false` moves the old files aside as `.bak`.

Servers gone (`nemo_gym.collect.liveness`): the head server is probed every second, and after a rollout fails
`unavailable` (connection refused or reset, after the retries) its agent too. A head server that refuses (its
`ng_run` has ended), or an agent that has refused for `servers_gone_s` while the head server answers, stops the
collection within seconds: the rollouts not finished are not written to the failures file (they did not fail for
a reason of their own), and rerunning the same command after restarting the servers collects them. An agent that
answers its probe (one refused call, a restart shorter than `servers_gone_s`) does not stop it: that rollout is an
`unavailable` record.

Exit status of `collect_main`: 0 every rollout has a row, 1 some failed (see the failures file), 3 the servers
stopped answering (restart them and rerun to resume), 130 interrupted (Ctrl-C; rerun to resume). Errors before any
rollout (bad input line, unknown agent, changed input) raise `NemoGymError` subclasses; the CLI prints them and exits 2.

Compared with NeMo Gym's collector: a row's own `agent_ref` wins over `agent_name`, as in NeMo Gym 0.4.0 (0.7.0's
`agent_name` re-routes every row, with a warning; rows without an agent_ref, as most datasets' are, go the same way
in both); an HTTP failure is a failures-file record instead of an exception that stops the run; resume is on by
default (NeMo Gym: `resume_from_cache=false`) and refuses an output made from another input; the whole input is
validated before the first rollout. NeMo Gym's `num_repeats_add_seed`, `prompt_config`, `interleave_repeats`,
`agent_map`, `fan_out`, `num_repeats` as a dict (`nemo_gym.collect.plan`), `task_source` rows (with their datasets'
`agent:` pins), `environment_server_routes` (0.7.0's materialized tasksets, sent to environment servers as episodes)
and `resume_from_cache` are taken as it takes them; its other parameters are refused by name (`NEMO_GYM_UNSUPPORTED`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_gym.collect.attempts import MAX_ATTEMPTS_ENV, RerunPolicy, max_attempts_from_env
from nemo_gym.collect.engine import collect
from nemo_gym.collect.files import OutputPaths, count_lines
from nemo_gym.collect.health import run_health_checks
from nemo_gym.collect.health_checks import known_checks
from nemo_gym.collect.liveness import DEFAULT_SERVERS_GONE_S
from nemo_gym.collect.plan import check_fan_out
from nemo_gym.collect.prompt_templates import PromptConfig, load_prompt_config, resolve_prompt_path
from nemo_gym.collect.sink import RolloutFiles
from nemo_gym.collect.skills import SKILLS_REF_KEY, SkillsConfig, load_skill_directory
from nemo_gym.collect.summary import CollectSummary
from nemo_gym.collect.tasks import TaskRows, read_tasks_with_lines
from nemo_gym.collect.watchdog import DEFAULT_WATCHDOG_S
from nemo_gym.common.errors import ServersGoneError
from nemo_gym.common.processes import run_interruptible
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import discover_head_url
from nemo_gym.serving.responses_params import ResponsesCreateParams
from nemo_gym.serving.retry_policy import ClientTimeouts

__all__ = ["SERVERS_GONE_EXIT", "CollectConfig", "CollectSummary", "collect_main", "collect_rollouts", "load_tasks"]

SERVERS_GONE_EXIT = 3  # collect_main's exit status when the servers stopped answering (`ServersGoneError`)
NEMO_GYM_UNSUPPORTED = {
    "disable_aggregation": "the aggregate metrics file is always written (ng_aggregate_rollouts merges shards)",
    "require_complete": "the exit status says it: 0 when every rollout has a row, 1 when some failed",
    "count_failure_classes_as_zero": "a failed rollout goes to the failures file and is never scored as reward 0",
    "count_missing_rollouts_as_zero": "a missing rollout is never scored as reward 0; rerun to collect it",
    "dispatch_budget_s": "stop with Ctrl-C (or SIGTERM): finished rollouts stay, a rerun collects the rest",
    "drain_margin_s": "stop with Ctrl-C (or SIGTERM): finished rollouts stay, a rerun collects the rest",
    "dispatch_longest_first": "rollouts start in input order (or repeat by repeat with +interleave_repeats=true)",
    "max_resident_rollout_tasks": "+num_samples_in_parallel bounds the rollouts in flight",
    "retain_results_in_memory": "rollouts are appended to the output as they finish",
    "retry_invalid_judge_responses": "a rerun retries the failures file's rows (judge failures included)",
    **dict.fromkeys(
        ("environment_routing_mode", "environment_server_name"),
        "materialized tasks go to the environment server +environment_server_routes names for their taskset; other"
        " rows to their agent, through the one environment server in front of it when their agent_ref names one",
    ),
    "upload_rollouts": "rollouts are not sent to an exporter (W&B, ...); push the output with ng_upload_dataset_to_hf",
}


class CollectConfig(BaseModel):
    """Parameters of `ng_collect_rollouts`."""

    model_config = ConfigDict(extra="forbid")
    # NeMo Gym's collector parameters that this one does not take, and why (said instead of "unknown parameter")
    nemo_gym_unsupported: ClassVar[dict[str, str]] = NEMO_GYM_UNSUPPORTED
    agent_name: str | None = Field(
        None, description="agent instance for rows without an agent_ref (a row's own agent_ref wins)"
    )
    input_jsonl_fpath: str = Field(
        description="input JSONL: one task a line, each with a responses_create_params object"
    )
    output_jsonl_fpath: str = Field(
        description=(
            "output JSONL of rollouts; side files <stem>_failures.jsonl, _materialized_inputs.jsonl,"
            " _aggregate_metrics.json, _state.json go next to it"
        )
    )
    limit: int | None = Field(None, ge=1, description="use only the first `limit` rows of the input")
    num_repeats: int | dict[str, int] = Field(
        1,
        description=(
            "rollouts per task (e.g. 4 for mean@4 or a GRPO group of 4); or NeMo Gym 0.7.0's dict {<agent, or a row's"
            " agent_ref name, taskset or task_source>: n, _default: n}: the dispatched agent's entry, else the row's,"
            " else _default (a row none matches is refused)"
        ),
    )
    fan_out: dict[str, list[str]] | None = Field(
        None,
        description=(
            "NeMo Gym 0.7.0's {<agent_ref name or task_source in the rows>: [agent, ...]}: a matching row runs through"
            " each listed agent, num_repeats times each; its rollouts are numbered on across the agents"
        ),
    )
    num_samples_in_parallel: int = Field(32, ge=1, description="most rollouts in flight at once")
    responses_create_params: ResponsesCreateParams = Field(
        default_factory=dict,
        description=(
            "merged over each row's responses_create_params, e.g. {temperature: 0.7, max_output_tokens: 512} (Responses"
            " API create parameters)"
        ),
    )
    head_server_url: str | None = Field(
        None, description="head server URL; default $NEMO_GYM_HEAD_URL or the only running ng_run"
    )
    resume: bool = Field(
        True,
        description=(
            "keep finished rollouts of an earlier run of the same command and run only the missing ones; false starts"
            " over (old files moved aside as .bak)"
        ),
    )
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one /run call, seconds")
    max_retries: int = Field(
        3,
        ge=0,
        description=(
            "retries of a /run call after a transient failure (connection error, timeout, 429, 502/503/504 without a"
            " deterministic inner failure class)"
        ),
    )
    max_rollout_attempts: int = Field(
        default_factory=max_attempts_from_env,
        ge=1,
        description=(
            f"attempts of one rollout over reruns of the command (NeMo Gym 0.7.0's ${MAX_ATTEMPTS_ENV}, read as the"
            " default, else 3): a rollout that failed this many times stays in the failures file and is not sent"
            " again; raise it to retry those"
        ),
    )
    retry_terminal_timeouts: bool = Field(
        False,
        description=(
            "NeMo Gym 0.7.0's: a rerun also retries a failure its agent stamped terminal when its class is"
            " timeout_exceeded, reference_missing, eval_missing or transport_ineligible (never `skipped`); without"
            " it, a terminal failure (_ng_failure_terminal) is not sent again"
        ),
    )
    agent_map: dict[str, str] | None = Field(
        None,
        description=(
            "NeMo Gym 0.7.0's re-routing, {<agent_ref name or task_source in the rows>: <agent>, _default: <agent>}:"
            " a row's agent_ref entry, else its task_source entry, else _default (rows without an agent_ref too) sets"
            " its agent; +agent_name then fills rows still without one"
        ),
    )
    environment_server_routes: dict[str, str] | None = Field(
        None,
        description=(
            "NeMo Gym 0.7.0's {<taskset>: <environment server instance>}: a materialized task (task_id.taskset and"
            " task_input, as its ng_prepare_data writes a dataset declared with `taskset:`) is sent to its taskset's"
            " environment server as an episode. A taskset's colon is escaped on the command line, as in NeMo Gym:"
            r" +environment_server_routes={nemo_user_sim\:example: <instance>}"
        ),
    )
    num_repeats_add_seed: bool = Field(
        False,
        description=(
            "give each rollout its repeat index as the seed, in responses_create_params.metadata.extra_body (NeMo Gym's"
            " form; vllm_model passes it to vLLM): repeats sample differently, a rerun samples the same"
        ),
    )
    observability_enabled: bool = Field(
        False,
        description=(
            "NeMo Gym 0.7.0's: each rollout row also holds its ng_trajectory (the capture record of its model calls,"
            " turns and tool calls, from agents that write one: simple_agent) and its ng_perf (turn, tool-call and"
            " token counts, wall time); the rollout health checks run after the collection (ng_health_check)"
        ),
    )
    disable_health_check: bool = Field(
        False, description="with observability_enabled: no rollout health checks after the collection"
    )
    health_check_workers: int | None = Field(
        None, ge=1, description="processes of the health checks (default: CPUs, 8 at most)"
    )
    health_check_ignored_checks: list[str] | str = Field(
        default_factory=list, description="health check ids left out of the verdicts (a list, or comma-separated)"
    )
    interleave_repeats: bool = Field(
        False,
        description=(
            "start the rollouts repeat by repeat (abcabc) instead of task by task (aabbcc), spreading a heavy task's"
            " repeats over the run"
        ),
    )
    prompt_config: str | None = Field(
        None,
        description=(
            "prompt template YAML (`user`, optional `system`: str.format over a row's fields) that builds each row's"
            " responses_create_params.input; rows must have none. Relative: under $NEMO_GYM_EXTRA_ROOTS, else the"
            " working directory"
        ),
    )
    skills: SkillsConfig | None = Field(
        None,
        description=(
            "NeMo Gym 0.7.0's Agent Skills: {path: <directory of skill directories>}; each row sent to an agent gets"
            " skills_ref {path, hash, skills} (nemo_gym.collect.skills)"
        ),
    )
    resume_from_cache: bool | None = Field(
        None, description="NeMo Gym's name of `resume` (true: resume; false: start over, old files moved aside)"
    )
    progress: bool = Field(True, description="show a progress bar")
    watchdog_s: float = Field(
        DEFAULT_WATCHDOG_S,
        ge=0,
        description=(
            "report (stderr, state file, aggregate metrics) when no rollout has completed for this many seconds, naming"
            " those in flight; 0 disables"
        ),
    )
    servers_gone_s: float = Field(
        DEFAULT_SERVERS_GONE_S,
        ge=0,
        description=(
            "stop (exit 3) when an agent has refused every connection for this many seconds, the head server answering;"
            " a head server that refuses stops it at once"
        ),
    )

    @field_validator("health_check_ignored_checks")
    @classmethod
    def _known_checks(cls, value: list[str] | str) -> list[str] | str:
        known_checks(value)  # an unknown id is refused before any rollout, naming it
        return value

    @field_validator("num_repeats")
    @classmethod
    def _at_least_one(cls, value: int | dict[str, int]) -> int | dict[str, int]:
        """Every count at least 1 (an int, or each entry of NeMo Gym 0.7.0's dict)."""
        if bad := {k: n for k, n in (value.items() if isinstance(value, dict) else [("num_repeats", value)]) if n < 1}:
            raise ValueError(f"must be at least 1, got {bad if isinstance(value, dict) else value}")
        return value

    @field_validator("fan_out")
    @classmethod
    def _lists_agents(cls, value: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        """NeMo Gym 0.7.0's checks: each entry lists agents, each once (`nemo_gym.collect.plan.check_fan_out`)."""
        check_fan_out(value or {})
        return value

    @model_validator(mode="after")
    def _resume_from_cache(self) -> CollectConfig:
        """NeMo Gym's `resume_from_cache` sets `resume`; both set, and differently, is refused."""
        if self.resume_from_cache is not None:
            if "resume" in self.model_fields_set and self.resume != self.resume_from_cache:
                raise ValueError(
                    f"resume={self.resume} and resume_from_cache={self.resume_from_cache} (NeMo Gym's name of resume)"
                    " disagree: set one"
                )
            self.resume = self.resume_from_cache
        return self

    def prompt(self) -> PromptConfig | None:
        """The prompt template of `prompt_config`, read (None without one).

        Raises:
            ConfigError: the file is missing, not YAML, or has no `user`.
        """
        return load_prompt_config(resolve_prompt_path(self.prompt_config)) if self.prompt_config else None


# -- input -----------------------------------------------------------------------------------------------
def load_tasks(cfg: CollectConfig) -> list[dict[str, Any]]:
    """The input rows of `cfg`, validated and materialized (`nemo_gym.collect.tasks.read_tasks` with the config's
    input, `agent_name`, `agent_map`, `prompt_config`, `limit`, `responses_create_params` and `skills`). Every row is
    checked before any rollout starts.

    Raises:
        DataError: a line is not a JSON object, has no `responses_create_params` object or one with a key that is
            no Responses API create parameter (`nemo_gym.serving.responses_params`), has a malformed
            `agent_ref`, or has no agent (no `agent_ref` and no `agent_name`); or the input has no rows.
        ConfigError: `+skills.path` is no directory of skills (`nemo_gym.collect.skills.load_skill_directory`).
    """
    return _read_tasks(cfg)[0]


def _read_tasks(cfg: CollectConfig) -> TaskRows:
    """The task rows of `cfg`, their line numbers and routing keys (`nemo_gym.collect.tasks.read_tasks_with_lines`)."""
    return read_tasks_with_lines(
        cfg.input_jsonl_fpath,
        agent_name=cfg.agent_name,
        limit=cfg.limit,
        responses_create_params=cfg.responses_create_params,
        prompt=cfg.prompt(),
        agent_map=cfg.agent_map,
        stamp={SKILLS_REF_KEY: load_skill_directory(cfg.skills.path).model_dump()} if cfg.skills else None,
    )


# -- the run --------------------------------------------------------------------------------------------
async def collect_rollouts(cfg: CollectConfig, client: ServerClient) -> CollectSummary:
    """Collect the rollouts of `cfg` through `client`; see the module docstring for the files and resume.

    The in-memory collector (`nemo_gym.collect.engine.collect`) with the files as its sink (`RolloutFiles`).

    Raises:
        DataError: a bad input line (before any rollout) or a corrupt earlier output.
        ConfigError: the earlier output was made from a different input.
        ServerError: an agent is not known to the head server (before any rollout).
        ServersGoneError: the head server or an agent stopped answering; finished rollouts are on disk, the others
            are not in the failures file: resume completes them.
        asyncio.CancelledError: cancelled (Ctrl-C); finished rollouts are on disk, resume completes the rest.
    """
    tasks, line_numbers, routing_keys = _read_tasks(cfg)
    files = RolloutFiles(cfg.output_jsonl_fpath, resume=cfg.resume, input_jsonl_fpath=cfg.input_jsonl_fpath)
    result = await collect(
        tasks,
        client,
        num_repeats=cfg.num_repeats,
        fan_out=cfg.fan_out,
        routing_keys=routing_keys,
        concurrency=cfg.num_samples_in_parallel,
        sinks=[files],
        where=lambda i: f"{cfg.input_jsonl_fpath}:{line_numbers[i]}",
        progress=cfg.progress,
        watchdog_s=cfg.watchdog_s,
        servers_gone_s=cfg.servers_gone_s,
        add_seed=cfg.num_repeats_add_seed,
        interleave_repeats=cfg.interleave_repeats,
        environment_server_routes=cfg.environment_server_routes,
        rerun=RerunPolicy(cfg.max_rollout_attempts, cfg.retry_terminal_timeouts),
        observability_enabled=cfg.observability_enabled,
    )
    return CollectSummary.of(result, files.paths)


# -- entry ----------------------------------------------------------------------------------------------
def collect_main(cfg: CollectConfig) -> int:
    """`ng_collect_rollouts`: collect, print the summary; returns the exit status (0, 1, 3 or 130)."""
    head_url = discover_head_url(cfg.head_server_url)
    timeouts = ClientTimeouts(read_s=cfg.request_timeout_s, max_retries=cfg.max_retries)

    async def run() -> CollectSummary:
        async with ServerClient(
            head_url, timeouts=timeouts, max_connections=max(64, 2 * cfg.num_samples_in_parallel)
        ) as client:
            return await collect_rollouts(cfg, client)

    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    try:
        summary = run_interruptible(run())  # SIGINT / SIGTERM: finished rollouts stay saved, exit 130
    except KeyboardInterrupt:
        print(
            f"\nInterrupted: {count_lines(paths.output)} finished rollouts are saved in {paths.output}. Rerun the same"
            " command to collect only the missing ones.",
            file=sys.stderr,
        )
        return 130
    except ServersGoneError as exc:
        print(
            f"\nng_collect_rollouts: {exc}. {count_lines(paths.output)} finished rollouts are saved in {paths.output};"
            " the others are not recorded as failures. Restart the servers (ng_run) and rerun the same command to"
            " collect the missing ones.",
            file=sys.stderr,
        )
        return SERVERS_GONE_EXIT
    print(summary.format())
    if cfg.observability_enabled and not cfg.disable_health_check:
        _health_check(cfg, paths.output)
    return summary.exit_status


def _health_check(cfg: CollectConfig, output: Path) -> None:
    """The rollout health checks of the collection's rollouts, as NeMo Gym 0.7.0's collector runs them after it: the
    reports next to the output, their line printed; a check run that fails is said, and the rollouts stay as they
    are (the exit status is the collection's)."""
    try:
        report = run_health_checks(
            output, workers=cfg.health_check_workers, ignored_checks=cfg.health_check_ignored_checks
        )
    except Exception as exc:  # the rollouts are collected whatever happens here
        print(f"Rollout health checks failed ({type(exc).__name__}: {exc}); run ng_health_check on {output}")
        return
    print(report.text())
