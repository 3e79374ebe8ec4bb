"""`ng_try`: a few rollouts on chosen entries of a project's data, printed readably and saved as JSON: the smoke
test before a training run (ReinforceNow's `rnow test`).

Data (one of):
  +rnow_project=DIR                  a ReinforceNow project, translated as `ng_run +rnow_project=DIR` does
                                     (nemo_gym.rnow.project; `+rollout.max_turns=3` and other config.yml overrides
                                     apply); the entries are train.jsonl's, the per-reward scores come from its verify
  +config_paths=[...] +input_jsonl_fpath=FILE   a nemo_gym config and a task JSONL; rows without `agent_ref` use
                                     +agent_name, else the config's only agent
Model (`+model=`):
  embedded:smollm2, a local HF folder   served by vllm_model as `policy_model`
  http(s)://host:port/v1                any OpenAI-compatible endpoint through openai_model (`+model_name=`, else the
                                        endpoint's only `/models` entry; the key: env.yaml's `policy_api_key`, else
                                        `$OPENAI_API_KEY`, else none; it never goes on a command line)
  <instance name>                       a model server instance of the config: every agent is pointed to it
  (not given)                           rnow: config.yml's `model.path`; a config: its own model servers
Servers: started as ng_run starts them (a child `ng_run`, `nemo_gym.orchestration.run.NgRunProcess`, its log next to the
output) and stopped on exit, Ctrl-C or SIGTERM; or `+head_server_url=URL` attaches to a running ng_run, whose servers
are used as they are (no `+model`, no `+config_paths`). SFT data (an rnow project with `dataset_type: sft` or
`+algorithm=sft`): nothing is sampled; the chosen entries are shown as ng_train +algorithm=sft trains on them, with the
model's tokenizer (`nemo_gym.tryout.sft`), and no server starts. Entries: `+entries=[0,3,7]` (0-based, in file order),
`+all=true`, or by default one random entry. `+seed=N` makes the random choice reproducible and, when every model server
is vllm_model, the sampling too (a vLLM seed per entry and rollout, unless `+responses_create_params.seed` is given);
without it a seed is drawn and printed. The rollouts go through the collection engine
(`nemo_gym.collect.engine.collect`, as ng_collect_rollouts and
ng_train's):
the chosen rows are checked against their environment's row schema first, and a failed rollout is a failure record
with its class and message, printed in red, never a reward of 0.
Output: `+output=FILE` (default `results/try/<name>-<time>.json`): `{command, created_at, source, model, seed,
entries: [{index, where}], num_rollouts, rollouts: [collector rows], failures: [failure records], summary,
interrupted}`;
a rollout whose verify failed (a reward function raised) is printed with the conversation it failed on, and its
failure record keeps it: `response`, `responses_create_params` and, for an rnow project, `messages` (what the
reward functions got).
Exit status: 0 every rollout finished, 1 one failed or the servers went away (`ServersGoneError`: the finished ones are
saved), 130 interrupted (the finished ones are saved), 2 bad input.
The parameters: `nemo_gym.tryout.options`; the data, servers and model: `nemo_gym.tryout.sources`.
"""

from __future__ import annotations

import random
import secrets
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nemo_gym.collect.engine import CollectResult, collect
from nemo_gym.collect.plan import RolloutPlan
from nemo_gym.collect.tasks import read_tasks_with_lines
from nemo_gym.common.errors import ConfigError, ServersGoneError
from nemo_gym.common.jsonl import AGENT_REF_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, write_json
from nemo_gym.common.processes import run_interruptible
from nemo_gym.eval.console import failure_panel, new_console, rollout_panel, summary_table
from nemo_gym.orchestration.server_processes import NgRunProcess
from nemo_gym.prime.config import resolve_model
from nemo_gym.rnow.project import (
    RNOW_MODEL_FIX,
    is_sft,
    load_project,
    split_rnow_args,
)
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.openai_convert import ConversionError, input_items, input_items_to_messages
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.tryout.options import TryOptions, split_arguments
from nemo_gym.tryout.sft import try_sft
from nemo_gym.tryout.sources import AGENTS, MODELS, RNOW_LINE, TrySource, check_attach, config_source, rnow_source

__all__ = ["choose_entries", "sampling_seed", "try_main"]


# -- entries ---------------------------------------------------------------------------------------------------
def choose_entries(num_entries: int, entries: list[int] | None, all_entries: bool, seed: int) -> list[int]:
    """The 0-based entry indices to run: `entries` as given, every one with `all_entries`, else one drawn with
    `random.Random(seed)`.

    Raises:
        ConfigError: both `entries` and `all_entries`, an empty list, an index out of range or listed twice.
    """
    if entries is not None and all_entries:
        raise ConfigError("ng_try: +entries and +all=true exclude each other; pass one")
    if all_entries:
        return list(range(num_entries))
    if entries is None:
        return [random.Random(seed).randrange(num_entries)]
    if not entries:
        raise ConfigError("ng_try: +entries is empty; list indices like +entries=[0,3] or pass +all=true")
    for index in entries:
        if not 0 <= index < num_entries:
            raise ConfigError(
                f"ng_try: +entries: index {index} is out of range: the data has {num_entries} entries (0 to"
                f" {num_entries - 1})"
            )
    repeated = sorted({i for i in entries if entries.count(i) > 1})
    if repeated:
        raise ConfigError(
            f"ng_try: +entries lists {repeated} more than once; use +num_rollouts=N for several rollouts of an entry"
        )
    return list(entries)


def sampling_seed(seed: int, entry: int, rollout: int) -> int:
    """The vLLM sampling seed of one rollout: distinct per (entry, rollout), fixed by `seed`; in [0, 2**31)."""
    return (seed * 1_000_003 + entry * 10_007 + rollout) % 2**31


# -- running ---------------------------------------------------------------------------------------------------
@dataclass
class _Results:
    """What a run has done so far (kept when Ctrl-C ends it)."""

    chosen: list[int] = field(default_factory=list)  # entry indices
    where: dict[int, str] = field(default_factory=dict)  # entry index -> `file:line`
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


async def _default_agent(client: ServerClient) -> str | None:
    agents = sorted({s["name"] for s in await client.list_servers() if s.get("server_type") == AGENTS})
    return agents[0] if len(agents) == 1 else None


async def _model_implementations(client: ServerClient) -> set[str]:
    return {str(s.get("implementation")) for s in await client.list_servers() if s.get("server_type") == MODELS}


def _title(row: dict[str, Any], where: dict[int, str], num_rollouts: int) -> str:
    entry, rollout = row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]
    return f"entry {entry} ({where[entry]}) · rollout {rollout + 1}/{num_rollouts} · agent {row[AGENT_REF_KEY]['name']}"


class _Printer:
    """ng_try's sink of the collection (a `nemo_gym.collect.engine.CollectSink`). The collector runs each chosen
    (entry, rollout) pair as one task row of its own (`num_repeats` 1, so that each can carry its own sampling seed),
    numbered 0, 1, ... in `pairs` order: each finished one is named back by its entry and rollout, printed and kept
    in `results`, as it finishes (a Ctrl-C keeps what finished)."""

    def __init__(
        self,
        pairs: list[tuple[int, int]],
        rows: list[dict[str, Any]],
        results: _Results,
        console: Any,
        *,
        num_rollouts: int,
        rnow: bool,
    ):
        self.pairs, self.rows, self.results, self.console = pairs, rows, results, console
        self.num_rollouts, self.rnow = num_rollouts, rnow

    def open(self, plan: RolloutPlan, *, add_seed: bool = False) -> tuple[dict, dict]:
        return {}, {}  # nothing to resume

    def add(self, rollout: dict[str, Any] | None, failure: dict[str, Any] | None) -> None:
        index = (rollout if rollout is not None else failure)[TASK_INDEX_KEY]
        entry, repeat = self.pairs[index]
        keys = {TASK_INDEX_KEY: entry, ROLLOUT_INDEX_KEY: repeat}
        row = {**self.rows[index], **keys}  # as dispatched, named by its entry
        title = _title(row, self.results.where, self.num_rollouts)
        if rollout is not None:
            self.results.rows.append({**rollout, **keys})
            self.console.print(rollout_panel(self.results.rows[-1], row, title))
        else:
            self.results.failures.append(_with_conversation({**failure, **keys}, row, rnow=self.rnow))
            self.console.print(failure_panel(self.results.failures[-1], title, row))

    def stalled(self, stall: dict[str, Any]) -> None:
        """No watchdog runs (`watchdog_s` 0)."""

    def close(self, failures: dict) -> None:
        """Everything was kept as it finished."""

    async def finish(self, result: CollectResult, client: ServerClient) -> None:
        """The summary is ng_try's own (`_summary`)."""


async def _run(
    options: TryOptions, source: TrySource, head_url: str, seed: int, results: _Results, console: Any
) -> None:
    timeouts = ClientTimeouts(read_s=options.request_timeout_s, max_retries=options.max_retries)
    async with ServerClient(head_url, timeouts=timeouts) as client:
        agent_name = options.agent_name or await _default_agent(client)
        tasks, lines, _ = read_tasks_with_lines(
            str(source.tasks_path), agent_name=agent_name, responses_create_params=options.responses_create_params
        )
        chosen = choose_entries(len(tasks), options.entries, options.all_entries, seed)
        where = {
            i: (
                f"{source.where_file}:{tasks[i][source.where_key]}"
                if source.where_key
                else f"{source.tasks_path}:{lines[i]}"
            )
            for i in chosen
        }
        results.chosen, results.where = chosen, where
        seeded = "seed" not in options.responses_create_params and (await _model_implementations(client)) == {
            "vllm_model"
        }
        picked = "every entry" if options.all_entries else "entries " + ", ".join(f"{i} ({where[i]})" for i in chosen)
        console.print(
            f"ng_try: {options.num_rollouts} rollout(s) each of {picked}; seed {seed} (+seed={seed} repeats this"
            f"{' choice and the sampling' if seeded else ' choice'})"
        )
        pairs = [(entry, rollout) for entry in chosen for rollout in range(options.num_rollouts)]
        rows = [
            _seeded(tasks[entry], sampling_seed(seed, entry, rollout)) if seeded else tasks[entry]
            for entry, rollout in pairs
        ]
        printer = _Printer(
            pairs, rows, results, console, num_rollouts=options.num_rollouts, rnow=source.where_key == RNOW_LINE
        )
        # an unknown agent, or a row its environment's schema refuses, is an error before any rollout
        await collect(
            rows,
            client,
            concurrency=options.num_samples_in_parallel,
            sinks=[printer],
            where=lambda index: where[pairs[index][0]],
        )


def _seeded(task: dict[str, Any], seed: int) -> dict[str, Any]:
    """`task` with a vLLM sampling `seed` in its `responses_create_params`."""
    return {**task, "responses_create_params": {**task["responses_create_params"], "seed": seed}}


def _with_conversation(failure: dict[str, Any], row: dict[str, Any], *, rnow: bool) -> dict[str, Any]:
    """A failure record that carries the trajectory its failed verify got (`response`) with the prompt
    (`responses_create_params`) and, for an rnow project, `messages`: the conversation as the reward functions got it
    (rnow's chat messages), to call a failing reward with."""
    if not isinstance(failure.get("response"), dict):
        return failure
    failure = {**failure, "responses_create_params": row["responses_create_params"]}
    if rnow:
        try:
            failure["messages"] = input_items_to_messages(
                [*input_items(row["responses_create_params"]), *(failure["response"].get("output") or [])]
            )
        except ConversionError:
            pass  # the verifier refused it the same way (malformed output): the response shows it
    return failure


def _summary(results: _Results) -> dict[str, Any]:
    rewards = [float(r["reward"]) for r in results.rows]
    classes: dict[str, int] = {}
    for failure in results.failures:
        classes[failure["failure_class"]] = classes.get(failure["failure_class"], 0) + 1
    return {
        "rollouts_ok": len(results.rows),
        "rollouts_failed": len(results.failures),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "failures_by_class": classes,
    }


def _sft_arguments(options: TryOptions, rest: list[str]) -> tuple[str, list[tuple[str, Any]]] | None:
    """(project dir, config.yml overrides) when the rnow project is SFT data, else None."""
    project_dir, overrides, _, _ = split_rnow_args([f"+rnow_project={options.rnow_project}", *rest])
    return (str(project_dir), overrides) if is_sft(str(project_dir), overrides) else None


def _try_sft(options: TryOptions, rest: list[str], seed: int, stamp: str) -> int:
    """ng_try on an SFT project: its entries as the trainer tokenizes them (nemo_gym.tryout.sft); no servers."""
    project_dir, overrides = _sft_arguments(options, rest) or ("", [])
    if options.head_server_url or options.config_paths:
        raise ConfigError("ng_try: SFT entries need no servers: drop +head_server_url / +config_paths")
    if options.model is not None:
        try:
            overrides = [*overrides, ("model.path", resolve_model(options.model, Path.cwd(), fix=RNOW_MODEL_FIX))]
        except ConfigError as exc:
            raise ConfigError(
                f"ng_try: +model={options.model}: SFT entries are shown with a model's tokenizer:"
                f" {str(exc).removeprefix('key ' + repr('model') + ': ')}"
            ) from None
    project = load_project(project_dir, overrides)
    chosen = choose_entries(len(project.entries), options.entries, options.all_entries, seed)
    output = Path(options.output or f"results/try/{project.output_name}-{stamp}.json")
    train = (
        f"ng_train +rnow_project={project.root}"
        + (f" +model={options.model}" if options.model else "")
        + ("" if is_sft(project.root) else " +algorithm=sft")
    )
    return try_sft(
        project, project.models[0], chosen, seed=seed, output=output, console=new_console(), train_command=train
    )


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def try_main(argv: list[str]) -> int:
    """`ng_try`: returns the exit status (see the module docstring).

    Raises:
        NemoGymError: bad parameters, project or data (before any rollout: ConfigError, DataError), an unknown agent
            (ServerError), or servers that did not start (ServerStartError); the servers started are stopped first.
    """
    options, rest = split_arguments(argv)
    if options.rnow_project and options.input_jsonl_fpath:
        raise ConfigError("ng_try: pass +rnow_project=DIR or +input_jsonl_fpath=FILE, not both")
    check_attach(options, rest)
    seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if options.rnow_project and _sft_arguments(options, rest) is not None:
        return _try_sft(options, rest, seed, stamp)
    source = rnow_source(options, rest) if options.rnow_project else config_source(options, rest)
    output = Path(options.output or f"results/try/{source.name}-{stamp}.json")
    console, results = new_console(), _Results()
    interrupted = gone = False
    # Ctrl-C and `kill` stop the servers too, also when SIGINT was ignored at start (a background job of a script)
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    servers = None
    try:
        servers = NgRunProcess(
            source.run_argv or [],
            options.head_server_url,
            output.with_suffix(".ng_run.log"),
            options.startup_timeout_s,
            caller="ng_try",
        )
        run_interruptible(_run(options, source, servers.head_url, seed, results, console))
    except KeyboardInterrupt:
        interrupted = True
        console.print(f"ng_try: interrupted; {len(results.rows) + len(results.failures)} rollout(s) had finished")
    except ServersGoneError as exc:
        gone = True
        console.print(
            f"ng_try: {exc}; {len(results.rows) + len(results.failures)} rollout(s) had finished, the others were"
            " cut off"
        )
    finally:
        if servers is not None:
            servers.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not results.chosen:  # interrupted before any rollout started
        return 130
    record = _output_record(options, source, seed, results, interrupted=interrupted)
    write_json(output, record)
    console.print(summary_table(results.where, results.rows, results.failures, options.num_rollouts))
    summary = record["summary"]
    console.print(
        f"ng_try: {summary['rollouts_ok']} rollout(s) finished, {summary['rollouts_failed']} failed; saved to {output}"
    )
    return 130 if interrupted else 1 if results.failures or gone else 0


def _output_record(
    options: TryOptions, source: TrySource, seed: int, results: _Results, *, interrupted: bool
) -> dict[str, Any]:
    """What ng_try saves to `+output` (see the module docstring): the command's parameters, the chosen entries, the
    rollouts and failure records in (entry, rollout) order, and their summary."""
    return {
        "command": "ng_try",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": source.description,
        "model": options.model,
        "head_server_url": options.head_server_url,
        "seed": seed,
        "entries": [{"index": i, "where": results.where[i]} for i in results.chosen],
        "num_rollouts": options.num_rollouts,
        "rollouts": sorted(results.rows, key=_order),
        "failures": sorted(results.failures, key=_order),
        "summary": _summary(results),
        "interrupted": interrupted,
    }


def _order(row: dict[str, Any]) -> tuple[int, int]:
    return row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]
