"""What `ng_try` runs (`TrySource`): the data (an rnow project, translated as `ng_run +rnow_project=DIR` does, or a
config and a task JSONL), the servers (the `ng_run` arguments that start them, or none when attaching to a running
ng_run) and the model the agents use (`+model=`: `model_arguments`). See `nemo_gym.tryout.rollouts` for the forms.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config, parse_overrides
from nemo_gym.model_servers.embedded import EMBEDDED_MODELS, EMBEDDED_PREFIX
from nemo_gym.prime.config import offline_models_hint, resolve_model
from nemo_gym.rnow.project import AGENT_NAME as RNOW_AGENT
from nemo_gym.rnow.project import expand_rnow_args
from nemo_gym.tryout.options import TryOptions

__all__ = [
    "OPENAI_MODEL_YAML",
    "VLLM_MODEL_YAML",
    "POLICY",
    "RNOW_LINE",
    "MODELS",
    "AGENTS",
    "TrySource",
    "model_arguments",
    "rnow_source",
    "config_source",
    "check_attach",
]

OPENAI_MODEL_YAML = "responses_api_models/openai_model/configs/openai_model.yaml"
VLLM_MODEL_YAML = "responses_api_models/vllm_model/configs/vllm_model.yaml"
POLICY = "policy_model"
RNOW_LINE = "rnow_line"  # the task rows' field with the entry's train.jsonl line
MODELS, AGENTS = "responses_api_models", "responses_api_agents"


# -- model -----------------------------------------------------------------------------------------------------
def _instances(values: dict[str, Any], server_type: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """`{instance name: (implementation, fields)}` of one server type in (unresolved) config values."""
    found = {}
    for name, value in values.items():
        if (
            isinstance(value, dict)
            and list(value) == [server_type]
            and isinstance(value[server_type], dict)
            and len(value[server_type]) == 1
        ):
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
        raise ConfigError(
            f"ng_try: +model={base_url}: GET {base_url.rstrip('/')}/models failed ({type(exc).__name__}: {exc}); {fix}"
        ) from None
    if len(names) != 1:
        raise ConfigError(
            f"ng_try: +model={base_url}: the endpoint lists {len(names)} models ({', '.join(names) or 'none'}); {fix}"
        )
    return names[0]


def model_arguments(
    model: str, *, model_name: str | None, values: dict[str, Any], origin: str, rnow: bool
) -> tuple[list[str], list[str]]:
    """`(extra config paths, extra overrides)` that make the agents use `model` (see the module docstring).

    `values` are the user's config (unresolved; for rnow only the user's +config_paths), `origin` says where
    `policy_model` comes from when it is defined.

    Raises:
        ConfigError: `model` is none of the accepted forms, or the config defines its own policy_model already.
    """
    models = _instances(values, MODELS)
    conflict = (
        f"ng_try: +model={model}: the config already defines {POLICY} ({origin}); drop that YAML from +config_paths, "
        f"or pass +model={POLICY} to use it"
    )
    if model.startswith(("http://", "https://")):
        if POLICY in models:
            raise ConfigError(conflict)
        key = (
            values.get("policy_api_key")
            if isinstance(values.get("policy_api_key"), str) and "${" not in values["policy_api_key"]
            else os.environ.get("OPENAI_API_KEY")
        )
        name = model_name or _endpoint_model_name(model, key)
        overrides = [f"+policy_base_url={model}", f"+policy_model_name='{name}'"]
        if "policy_api_key" not in values:  # an interpolation, so the key itself is never on a command line
            overrides.append("+policy_api_key='${oc.env:OPENAI_API_KEY,EMPTY}'")
        return [OPENAI_MODEL_YAML], overrides
    if model in models:
        if rnow:
            if POLICY not in models:
                raise ConfigError(
                    f"ng_try: +model={model}: with +rnow_project, name your model instance {POLICY} (the project's vllm"
                    " policy is started otherwise)"
                )
            return [], [] if model == POLICY else [f"++{RNOW_AGENT}.{AGENTS}.simple_agent.model_server.name={model}"]
        agents = _instances(values, AGENTS)
        return [], [
            f"++{agent}.{AGENTS}.{impl}.model_server.name={model}"
            for agent, (impl, fields) in agents.items()
            if isinstance(fields.get("model_server"), dict)
        ]
    try:
        resolved = resolve_model(model, Path.cwd())  # embedded:<name>, an embedded model's HF name, or a local folder
    except ConfigError:
        embedded = ", ".join(EMBEDDED_PREFIX + name for name in EMBEDDED_MODELS)
        raise ConfigError(
            f"ng_try: +model={model!r} is not a model server instance of the config"
            f" ({', '.join(models) or 'none defined'}), an http(s):// endpoint URL, an embedded model ({embedded}) or a"
            f" local model folder. {offline_models_hint(model)}"
        ) from None
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


def rnow_source(options: TryOptions, rest: list[str]) -> TrySource:
    paths, overrides = list(options.config_paths), list(rest)
    if options.model is not None:
        user = load_config([f"+config_paths=[{','.join(paths)}]"], resolve=False) if paths else None
        origin = user.origin(POLICY) if user else ""
        extra_paths, extra = model_arguments(
            options.model, model_name=options.model_name, values=user.values if user else {}, origin=origin, rnow=True
        )
        paths, overrides = paths + extra_paths, overrides + extra
    argv = [f"+rnow_project={options.rnow_project}", *overrides] + (
        [f"+config_paths=[{','.join(paths)}]"] if paths else []
    )
    with contextlib.redirect_stdout(io.StringIO()):  # its hint names ng_run and ng_collect_rollouts; ours follows
        [run_argv] = expand_rnow_args(argv, mode="run", caller="ng_try")
    [(_, translated)] = parse_overrides([run_argv[0]])  # `+config_paths=[<out>/config.yaml, ...]`, tasks beside it
    root = Path(options.rnow_project).expanduser().resolve()
    print(
        f"ng_try: rnow project {root} -> {translated[0]} (the project's servers, as ng_run +rnow_project runs them)",
        flush=True,
    )
    return TrySource(
        name=Path(translated[0]).parent.name,
        tasks_path=Path(translated[0]).parent / "train_tasks.jsonl",
        run_argv=None if options.head_server_url else run_argv,
        description={"rnow_project": str(root)},
        where_key=RNOW_LINE,
        where_file=_rnow_train_file(root, rest),
    )


def _rnow_train_file(root: Path, overrides: list[str]) -> str:
    """config.yml's `data.train_file` (after a `+data.train_file=` override), for the `file:line` labels."""
    given = dict(parse_overrides(overrides)).get("data.train_file")
    if given:
        return str(given)
    config = yaml.safe_load((root / "config.yml").read_text()) or {}
    return str(((config.get("data") or {}) if isinstance(config, dict) else {}).get("train_file") or "train.jsonl")


def config_source(options: TryOptions, rest: list[str]) -> TrySource:
    if not options.input_jsonl_fpath:
        raise ConfigError(
            "ng_try: pass +rnow_project=DIR, or +input_jsonl_fpath=<task JSONL> (with +config_paths=[...], or"
            " +head_server_url of a running ng_run)"
        )
    tasks_path = Path(options.input_jsonl_fpath)
    description = {"input_jsonl_fpath": str(tasks_path.resolve()), "config_paths": options.config_paths}
    if options.head_server_url:
        return TrySource(tasks_path.stem, tasks_path, None, description)
    if not options.config_paths:
        raise ConfigError(
            "ng_try: +input_jsonl_fpath needs the servers: +config_paths=[<server YAMLs>] to start them, or"
            " +head_server_url=<a running ng_run>"
        )
    user = load_config([f"+config_paths=[{','.join(options.config_paths)}]", *rest], resolve=False)
    paths, overrides = list(options.config_paths), list(rest)
    if options.model is not None:
        extra_paths, extra = model_arguments(
            options.model, model_name=options.model_name, values=user.values, origin=user.origin(POLICY), rnow=False
        )
        paths, overrides = paths + extra_paths, overrides + extra
    elif not _instances(user.values, MODELS):
        raise ConfigError(
            "ng_try: the config defines no model server: pass +model=embedded:smollm2, an endpoint URL"
            " (http://host:port/v1) or a local model folder"
        )
    return TrySource(tasks_path.stem, tasks_path, [f"+config_paths=[{','.join(paths)}]", *overrides], description)


def check_attach(options: TryOptions, rest: list[str]) -> None:
    if not options.head_server_url:
        return
    unused = [f"+{name}" for name, given in (("model", options.model), ("model_name", options.model_name)) if given]
    unused += ["+config_paths"] if options.config_paths and not options.rnow_project else []
    unused += [arg for arg in rest if not options.rnow_project]
    if unused:
        raise ConfigError(
            f"ng_try: {', '.join(unused)} cannot change the servers of a running ng_run (+head_server_url); drop them,"
            " or start the servers here (without +head_server_url)"
        )
