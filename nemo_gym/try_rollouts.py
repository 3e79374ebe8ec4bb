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
Servers: started as ng_run starts them (a child `ng_run`, `nemo_gym.run.NgRunProcess`, its log next to the output)
and stopped on exit, Ctrl-C or SIGTERM; or `+head_server_url=URL` attaches to a running ng_run, whose servers are
used as they are (no `+model`, no `+config_paths`).
SFT data (an rnow project with `dataset_type: sft` or `+algorithm=sft`): nothing is sampled; the chosen entries are shown
as ng_train +algorithm=sft trains on them, with the model's tokenizer (`nemo_gym.try_sft`), and no server starts.
Entries: `+entries=[0,3,7]` (0-based, in file order), `+all=true`, or by default one random entry. `+seed=N` makes the
random choice reproducible and, when every model server is vllm_model, the sampling too (a vLLM seed per entry and
rollout, unless `+responses_create_params.seed` is given); without it a seed is drawn and printed.
Each rollout goes through the collector's single-rollout path (`nemo_gym.collect.run_rollout`): a failed rollout is
a failure record with its class and message, printed in red, never a reward of 0.
Output: `+output=FILE` (default `results/try/<name>-<time>.json`): `{command, created_at, source, model, seed,
entries: [{index, where}], num_rollouts, rollouts: [collector rows], failures: [failure records], summary, interrupted}`;
a rollout whose verify failed (a reward function raised) is printed with the conversation it failed on, and its
failure record keeps it: `response`, `responses_create_params` and, for an rnow project, `messages` (what the
reward functions got).
Exit status: 0 every rollout finished, 1 one failed, 130 interrupted (the finished ones are saved), 2 bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import io
import os
import random
import secrets
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.client import ClientTimeouts, ServerClient
from nemo_gym.collect import AGENT_REF_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, CollectConfig, load_tasks, run_rollout
from nemo_gym.config import load_config, parse_overrides, validation_problems
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import iter_jsonl, write_json
from nemo_gym.models import EMBEDDED_MODELS, EMBEDDED_PREFIX
from nemo_gym.openai_convert import ConversionError, input_items, input_items_to_messages
from nemo_gym.processes import run_interruptible
from nemo_gym.responses_params import ResponsesCreateParams
from nemo_gym.rnow.project import AGENT_NAME as RNOW_AGENT, RNOW_MODEL_FIX, expand_rnow_args, is_sft, load_project, split_rnow_args
from nemo_gym.rollout_console import failure_panel, new_console, rollout_panel, summary_table
from nemo_gym.run import NgRunProcess
from nemo_gym.train.prime_toml import offline_models_hint, resolve_model
from nemo_gym.try_sft import try_sft

__all__ = ["TryOptions", "TrySource", "split_arguments", "choose_entries", "model_arguments", "sampling_seed", "try_main"]

OPENAI_MODEL_YAML = "responses_api_models/openai_model/configs/openai_model.yaml"
VLLM_MODEL_YAML = "responses_api_models/vllm_model/configs/vllm_model.yaml"
POLICY = "policy_model"
RNOW_LINE = "rnow_line"  # the task rows' field with the entry's train.jsonl line
MODELS, AGENTS = "responses_api_models", "responses_api_agents"


class TryOptions(BaseModel):
    """Parameters of `ng_try` (any other `+key=value` is config, or a config.yml override of an rnow project)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    rnow_project: str | None = Field(None, description="a ReinforceNow project folder (config.yml, train.jsonl, rewards.py, tools.py)")
    config_paths: list[str] = Field(default_factory=list, description="YAML files of a nemo_gym config (with +input_jsonl_fpath); with +rnow_project: extra servers, e.g. a policy_model")
    input_jsonl_fpath: str | None = Field(None, description="task JSONL of a nemo_gym config: one row a line with responses_create_params")
    agent_name: str | None = Field(None, description="agent for rows without agent_ref (default: the config's only agent)")
    model: str | None = Field(None, description="embedded:smollm2, a local HF model folder, an OpenAI-compatible base URL (http://host:port/v1), or a model server instance of the config")
    model_name: str | None = Field(None, description="with an endpoint URL: the model name to send (default: the endpoint's only /models entry)")
    num_rollouts: int = Field(1, ge=1, description="rollouts per chosen entry")
    entries: list[int] | None = Field(None, description="0-based indices of the entries to run, e.g. [0,3,7] (default: one random entry)")
    all_entries: bool = Field(False, alias="all", description="run every entry")
    seed: int | None = Field(None, description="seed of the random entry choice and (vllm_model) of the sampling; default: drawn and printed")
    output: str | None = Field(None, description="JSON file of the rollouts (default results/try/<name>-<time>.json; the ng_run log goes next to it)")
    head_server_url: str | None = Field(None, description="use the servers of this running ng_run instead of starting them")
    responses_create_params: ResponsesCreateParams = Field(default_factory=dict, description="merged over each row's responses_create_params, e.g. {max_output_tokens: 64, temperature: 0.7} (Responses API create parameters)")
    num_samples_in_parallel: int = Field(4, ge=1, description="most rollouts in flight at once")
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one rollout (/run call), seconds")
    max_retries: int = Field(3, ge=0, description="retries of a rollout after a transient failure (connection error, timeout, 429, 502/503/504)")
    startup_timeout_s: float = Field(1800.0, gt=0, description="seconds to wait for the started servers (vLLM builds its engine on first use)")


def split_arguments(argv: list[str]) -> tuple[TryOptions, list[str]]:
    """`(ng_try's options, the other arguments as given)`: the others are config for ng_run or config.yml overrides.

    Raises:
        ConfigError: a bad option value, or an unknown top-level key that looks like a misspelt option.
    """
    names = {info.alias or name: name for name, info in TryOptions.model_fields.items()}
    values: dict[str, Any] = {}
    rest: list[str] = []
    for arg in argv:
        [(key, value)] = parse_overrides([arg])
        if key in names:
            values[key] = value
            continue
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.75) if "." not in key else []
        if close:
            raise ConfigError(f"ng_try: unknown parameter +{key} (did you mean +{close[0]}?); see +help=true")
        rest.append(arg)
    try:
        return TryOptions.model_validate(values), rest
    except ValidationError as exc:
        problems = "; ".join(validation_problems(TryOptions, exc, "+{key}"))
        raise ConfigError(f"ng_try: {problems} (see +help=true)") from exc


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
            raise ConfigError(f"ng_try: +entries: index {index} is out of range: the data has {num_entries} entries (0 to {num_entries - 1})")
    repeated = sorted({i for i in entries if entries.count(i) > 1})
    if repeated:
        raise ConfigError(f"ng_try: +entries lists {repeated} more than once; use +num_rollouts=N for several rollouts of an entry")
    return list(entries)


def sampling_seed(seed: int, entry: int, rollout: int) -> int:
    """The vLLM sampling seed of one rollout: distinct per (entry, rollout), fixed by `seed`; in [0, 2**31)."""
    return (seed * 1_000_003 + entry * 10_007 + rollout) % 2**31


# -- model -----------------------------------------------------------------------------------------------------
def _instances(values: dict[str, Any], server_type: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """`{instance name: (implementation, fields)}` of one server type in (unresolved) config values."""
    found = {}
    for name, value in values.items():
        if isinstance(value, dict) and list(value) == [server_type] and isinstance(value[server_type], dict) and len(value[server_type]) == 1:
            implementation, fields = next(iter(value[server_type].items()))
            found[name] = (str(implementation), fields if isinstance(fields, dict) else {})
    return found


def _endpoint_model_name(base_url: str, api_key: str | None) -> str:
    """The only model an OpenAI-compatible endpoint lists at `GET <base_url>/models`.

    Raises:
        ConfigError: the endpoint cannot be reached, answers no list, or lists none or several (then +model_name).
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    fix = "pass +model_name=<the endpoint's model name>"
    try:
        answer = httpx.get(f"{base_url.rstrip('/')}/models", headers=headers, timeout=10.0, trust_env=False)
        answer.raise_for_status()
        names = [m["id"] for m in answer.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"ng_try: +model={base_url}: GET {base_url.rstrip('/')}/models failed ({type(exc).__name__}: {exc}); {fix}") from None
    if len(names) != 1:
        raise ConfigError(f"ng_try: +model={base_url}: the endpoint lists {len(names)} models ({', '.join(names) or 'none'}); {fix}")
    return names[0]


def model_arguments(model: str, *, model_name: str | None, values: dict[str, Any], origin: str, rnow: bool) -> tuple[list[str], list[str]]:
    """`(extra config paths, extra overrides)` that make the agents use `model` (see the module docstring).

    `values` are the user's config (unresolved; for rnow only the user's +config_paths), `origin` says where
    `policy_model` comes from when it is defined.

    Raises:
        ConfigError: `model` is none of the accepted forms, or the config defines its own policy_model already.
    """
    models = _instances(values, MODELS)
    conflict = (f"ng_try: +model={model}: the config already defines {POLICY} ({origin}); drop that YAML from +config_paths, "
                f"or pass +model={POLICY} to use it")  # fmt: skip
    if model.startswith(("http://", "https://")):
        if POLICY in models:
            raise ConfigError(conflict)
        key = values.get("policy_api_key") if isinstance(values.get("policy_api_key"), str) and "${" not in values["policy_api_key"] else os.environ.get("OPENAI_API_KEY")
        name = model_name or _endpoint_model_name(model, key)
        overrides = [f"+policy_base_url={model}", f"+policy_model_name='{name}'"]
        if "policy_api_key" not in values:  # an interpolation, so the key itself is never on a command line
            overrides.append("+policy_api_key='${oc.env:OPENAI_API_KEY,EMPTY}'")
        return [OPENAI_MODEL_YAML], overrides
    if model in models:
        if rnow:
            if POLICY not in models:
                raise ConfigError(f"ng_try: +model={model}: with +rnow_project, name your model instance {POLICY} (the project's vllm policy is started otherwise)")
            return [], [] if model == POLICY else [f"++{RNOW_AGENT}.{AGENTS}.simple_agent.model_server.name={model}"]
        agents = _instances(values, AGENTS)
        return [], [f"++{agent}.{AGENTS}.{impl}.model_server.name={model}" for agent, (impl, fields) in agents.items() if isinstance(fields.get("model_server"), dict)]
    try:
        resolved = resolve_model(model, Path.cwd())  # embedded:<name>, an embedded model's HF name, or a local folder
    except ConfigError:
        embedded = ", ".join(EMBEDDED_PREFIX + name for name in EMBEDDED_MODELS)
        raise ConfigError(f"ng_try: +model={model!r} is not a model server instance of the config ({', '.join(models) or 'none defined'}), "
                          f"an http(s):// endpoint URL, an embedded model ({embedded}) or a local model folder. {offline_models_hint(model)}") from None  # fmt: skip
    if rnow:
        return [], [f"+model.path={resolved}"]
    if POLICY in models:
        raise ConfigError(conflict)
    return [VLLM_MODEL_YAML], [f"++{POLICY}.{MODELS}.vllm_model.model={resolved}"]


# -- data and servers -----------------------------------------------------------------------------------------
@dataclass
class TrySource:
    """What ng_try runs: the ng_run arguments (None: attach), the task file and how to name it."""

    name: str  # for the default output file
    tasks_path: Path  # the task JSONL (rnow: the translated train_tasks.jsonl)
    run_argv: list[str] | None  # ng_run's arguments; None when attaching with +head_server_url
    description: dict[str, Any] = field(default_factory=dict)
    where_key: str | None = None  # a row field giving the entry's source line (rnow: rnow_line)
    where_file: str = ""  # the file named in `where` (rnow: train.jsonl)


def _rnow_source(options: TryOptions, rest: list[str]) -> TrySource:
    paths, overrides = list(options.config_paths), list(rest)
    if options.model is not None:
        user = load_config([f"+config_paths=[{','.join(paths)}]"], resolve=False) if paths else None
        origin = user.origin(POLICY) if user else ""
        extra_paths, extra = model_arguments(options.model, model_name=options.model_name, values=user.values if user else {}, origin=origin, rnow=True)
        paths, overrides = paths + extra_paths, overrides + extra
    argv = [f"+rnow_project={options.rnow_project}", *overrides] + ([f"+config_paths=[{','.join(paths)}]"] if paths else [])
    with contextlib.redirect_stdout(io.StringIO()):  # its hint names ng_run and ng_collect_rollouts; ours follows
        [run_argv] = expand_rnow_args(argv, mode="run", caller="ng_try")
    [(_, translated)] = parse_overrides([run_argv[0]])  # `+config_paths=[<out>/config.yaml, ...]`, tasks beside it
    root = Path(options.rnow_project).expanduser().resolve()
    print(f"ng_try: rnow project {root} -> {translated[0]} (the project's servers, as ng_run +rnow_project runs them)", flush=True)
    return TrySource(name=Path(translated[0]).parent.name, tasks_path=Path(translated[0]).parent / "train_tasks.jsonl",
                     run_argv=None if options.head_server_url else run_argv, description={"rnow_project": str(root)},
                     where_key=RNOW_LINE, where_file=_rnow_train_file(root, rest))  # fmt: skip


def _rnow_train_file(root: Path, overrides: list[str]) -> str:
    """config.yml's `data.train_file` (after a `+data.train_file=` override), for the `file:line` labels."""
    given = dict(parse_overrides(overrides)).get("data.train_file")
    if given:
        return str(given)
    config = yaml.safe_load((root / "config.yml").read_text()) or {}
    return str(((config.get("data") or {}) if isinstance(config, dict) else {}).get("train_file") or "train.jsonl")


def _config_source(options: TryOptions, rest: list[str]) -> TrySource:
    if not options.input_jsonl_fpath:
        raise ConfigError("ng_try: pass +rnow_project=DIR, or +input_jsonl_fpath=<task JSONL> (with +config_paths=[...], or +head_server_url of a running ng_run)")
    tasks_path = Path(options.input_jsonl_fpath)
    description = {"input_jsonl_fpath": str(tasks_path.resolve()), "config_paths": options.config_paths}
    if options.head_server_url:
        return TrySource(tasks_path.stem, tasks_path, None, description)
    if not options.config_paths:
        raise ConfigError("ng_try: +input_jsonl_fpath needs the servers: +config_paths=[<server YAMLs>] to start them, or +head_server_url=<a running ng_run>")
    user = load_config([f"+config_paths=[{','.join(options.config_paths)}]", *rest], resolve=False)
    paths, overrides = list(options.config_paths), list(rest)
    if options.model is not None:
        extra_paths, extra = model_arguments(options.model, model_name=options.model_name, values=user.values, origin=user.origin(POLICY), rnow=False)
        paths, overrides = paths + extra_paths, overrides + extra
    elif not _instances(user.values, MODELS):
        raise ConfigError("ng_try: the config defines no model server: pass +model=embedded:smollm2, an endpoint URL (http://host:port/v1) or a local model folder")
    return TrySource(tasks_path.stem, tasks_path, [f"+config_paths=[{','.join(paths)}]", *overrides], description)


def _check_attach(options: TryOptions, rest: list[str]) -> None:
    if not options.head_server_url:
        return
    unused = [f"+{name}" for name, given in (("model", options.model), ("model_name", options.model_name)) if given]
    unused += ["+config_paths"] if options.config_paths and not options.rnow_project else []
    unused += [arg for arg in rest if not options.rnow_project]
    if unused:
        raise ConfigError(f"ng_try: {', '.join(unused)} cannot change the servers of a running ng_run (+head_server_url); drop them, or start "
                          "the servers here (without +head_server_url)")  # fmt: skip


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


async def _run(options: TryOptions, source: TrySource, head_url: str, seed: int, results: _Results, console: Any) -> None:
    timeouts = ClientTimeouts(read_s=options.request_timeout_s, max_retries=options.max_retries)
    async with ServerClient(head_url, timeouts=timeouts) as client:
        agent_name = options.agent_name or await _default_agent(client)
        collect = CollectConfig(input_jsonl_fpath=str(source.tasks_path), output_jsonl_fpath="unused.jsonl", agent_name=agent_name,
                                responses_create_params=options.responses_create_params)  # fmt: skip
        tasks = load_tasks(collect)
        lines = [line for line, _ in iter_jsonl(source.tasks_path)]
        chosen = choose_entries(len(tasks), options.entries, options.all_entries, seed)
        where = {i: f"{source.where_file}:{tasks[i][source.where_key]}" if source.where_key else f"{source.tasks_path}:{lines[i]}" for i in chosen}
        results.chosen, results.where = chosen, where
        for name in sorted({tasks[i][AGENT_REF_KEY]["name"] for i in chosen}):
            await client.server_url(name)  # an unknown agent is an error before any rollout
        seeded = "seed" not in options.responses_create_params and (await _model_implementations(client)) == {"vllm_model"}
        picked = "every entry" if options.all_entries else "entries " + ", ".join(f"{i} ({where[i]})" for i in chosen)
        console.print(f"ng_try: {options.num_rollouts} rollout(s) each of {picked}; seed {seed} (+seed={seed} repeats this"
                      f"{' choice and the sampling' if seeded else ' choice'})")  # fmt: skip
        semaphore = asyncio.Semaphore(options.num_samples_in_parallel)

        async def one(entry: int, rollout: int) -> None:
            row = {**tasks[entry], TASK_INDEX_KEY: entry, ROLLOUT_INDEX_KEY: rollout}
            if seeded:
                row["responses_create_params"] = {**row["responses_create_params"], "seed": sampling_seed(seed, entry, rollout)}
            async with semaphore:
                output, failure = await run_rollout(client, row)
            if output is not None:
                results.rows.append(output)
                console.print(rollout_panel(output, row, _title(row, where, options.num_rollouts)))
            else:
                failure = _with_conversation(failure, row, rnow=source.where_key == RNOW_LINE)
                results.failures.append(failure)
                console.print(failure_panel(failure, _title(row, where, options.num_rollouts), row))

        await asyncio.gather(*(one(entry, rollout) for entry in chosen for rollout in range(options.num_rollouts)))


def _with_conversation(failure: dict[str, Any], row: dict[str, Any], *, rnow: bool) -> dict[str, Any]:
    """A failure record that carries the trajectory its failed verify got (`response`) with the prompt
    (`responses_create_params`) and, for an rnow project, `messages`: the conversation as the reward functions got it
    (rnow's chat messages), to call a failing reward with."""
    if not isinstance(failure.get("response"), dict):
        return failure
    failure = {**failure, "responses_create_params": row["responses_create_params"]}
    if rnow:
        try:
            failure["messages"] = input_items_to_messages([*input_items(row["responses_create_params"]), *(failure["response"].get("output") or [])])
        except ConversionError:
            pass  # the verifier refused it the same way (malformed output): the response shows it
    return failure


def _summary(results: _Results) -> dict[str, Any]:
    rewards = [float(r["reward"]) for r in results.rows]
    classes: dict[str, int] = {}
    for failure in results.failures:
        classes[failure["failure_class"]] = classes.get(failure["failure_class"], 0) + 1
    return {"rollouts_ok": len(results.rows), "rollouts_failed": len(results.failures), "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "failures_by_class": classes}  # fmt: skip


def _sft_arguments(options: TryOptions, rest: list[str]) -> tuple[str, list[tuple[str, Any]]] | None:
    """(project dir, config.yml overrides) when the rnow project is SFT data, else None."""
    project_dir, overrides, _, _ = split_rnow_args([f"+rnow_project={options.rnow_project}", *rest])
    return (str(project_dir), overrides) if is_sft(str(project_dir), overrides) else None


def _try_sft(options: TryOptions, rest: list[str], seed: int, stamp: str) -> int:
    """ng_try on an SFT project: its entries as the trainer tokenizes them (nemo_gym.try_sft); no servers."""
    project_dir, overrides = _sft_arguments(options, rest) or ("", [])
    if options.head_server_url or options.config_paths:
        raise ConfigError("ng_try: SFT entries need no servers: drop +head_server_url / +config_paths")
    if options.model is not None:
        try:
            overrides = [*overrides, ("model.path", resolve_model(options.model, Path.cwd(), fix=RNOW_MODEL_FIX))]
        except ConfigError as exc:
            raise ConfigError(f"ng_try: +model={options.model}: SFT entries are shown with a model's tokenizer: {str(exc).removeprefix('key ' + repr('model') + ': ')}") from None
    project = load_project(project_dir, overrides)
    chosen = choose_entries(len(project.entries), options.entries, options.all_entries, seed)
    output = Path(options.output or f"results/try/{project.output_name}-{stamp}.json")
    train = f"ng_train +rnow_project={project.root}" + (f" +model={options.model}" if options.model else "") + ("" if is_sft(project.root) else " +algorithm=sft")
    return try_sft(project, project.models[0], chosen, seed=seed, output=output, console=new_console(), train_command=train)


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
    _check_attach(options, rest)
    seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if options.rnow_project and _sft_arguments(options, rest) is not None:
        return _try_sft(options, rest, seed, stamp)
    source = _rnow_source(options, rest) if options.rnow_project else _config_source(options, rest)
    output = Path(options.output or f"results/try/{source.name}-{stamp}.json")
    console, results = new_console(), _Results()
    interrupted = False
    # Ctrl-C and `kill` stop the servers too, also when SIGINT was ignored at start (a background job of a script)
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    servers = None
    try:
        servers = NgRunProcess(source.run_argv or [], options.head_server_url, output.with_suffix(".ng_run.log"), options.startup_timeout_s, caller="ng_try")
        run_interruptible(_run(options, source, servers.head_url, seed, results, console))
    except KeyboardInterrupt:
        interrupted = True
        console.print(f"ng_try: interrupted; {len(results.rows) + len(results.failures)} rollout(s) had finished")
    finally:
        if servers is not None:
            servers.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not results.chosen:  # interrupted before any rollout started
        return 130
    record = {"command": "ng_try", "created_at": datetime.now(UTC).isoformat(timespec="seconds"), "source": source.description,
              "model": options.model, "head_server_url": options.head_server_url, "seed": seed,
              "entries": [{"index": i, "where": results.where[i]} for i in results.chosen], "num_rollouts": options.num_rollouts,
              "rollouts": sorted(results.rows, key=_order), "failures": sorted(results.failures, key=_order),
              "summary": _summary(results), "interrupted": interrupted}  # fmt: skip
    write_json(output, record)
    console.print(summary_table(results.where, results.rows, results.failures, options.num_rollouts))
    summary = record["summary"]
    console.print(f"ng_try: {summary['rollouts_ok']} rollout(s) finished, {summary['rollouts_failed']} failed; saved to {output}")
    return 130 if interrupted else 1 if results.failures else 0


def _order(row: dict[str, Any]) -> tuple[int, int]:
    return row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]
