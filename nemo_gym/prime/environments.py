"""Environments of a Prime-style TOML (`[[env]] id, args`), resolved to what nemo_gym runs.

An id is either one of our environments (`resources_servers/<id>/configs/<id>.yaml`: its resources server, the
agent that uses it, that agent's datasets; `args` are fields of the server's Config, checked against it) or an
installed `verifiers` environment package (classic `load_environment(**args)` API), served by
`resources_servers/verifiers_env` through simple_agent, its rows written by that server's prepare step
(`vf_adapter.task_rows`, run in this process, where the package is installed).
Errors name the TOML key (`env[0].id`, `env[0].args.<name>`, `eval.env[1].id`) and suggest a close name.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import did_you_mean, load_config
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.module_loading import import_file

__all__ = ["ADAPTER", "ResolvedEnv", "our_environments", "resolve_env", "key_path"]

RESOURCES_DIR = REPO_ROOT / "resources_servers"
ADAPTER = "verifiers_env"


def key_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a TOML key path: ("env", 0, "id") → `env[0].id`."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


RowsFn = Callable[[str, int | None], list[dict[str, Any]]]


@dataclass
class ResolvedEnv:
    """An environment of the TOML as nemo_gym runs it."""

    env_id: str
    agent_name: str
    config_paths: list[str]  # YAML of our environment (repo-relative); none for a verifiers package
    instances: dict[str, Any]  # config merged after config_paths: server field overrides, or the adapter's servers
    rows: RowsFn  # (split "train" | "eval", limit) -> task rows without agent_ref


def _vf_adapter() -> ModuleType:
    return import_file(RESOURCES_DIR / ADAPTER / "vf_adapter.py")


def our_environments() -> list[str]:
    """Our environment ids: folders of resources_servers with `configs/<folder>.yaml`."""
    return sorted(
        p.parent.parent.name
        for p in RESOURCES_DIR.glob("*/configs/*.yaml")
        if p.stem == p.parent.parent.name and p.stem != ADAPTER
    )


def _dataset_path(datasets: list[dict[str, Any]], types: tuple[str, ...], env_id: str, key: str) -> Path:
    for kind in types:
        for dataset in datasets:
            if dataset.get("type") == kind and dataset.get("jsonl_fpath"):
                raw = Path(dataset["jsonl_fpath"])
                path = raw if raw.is_absolute() or raw.is_file() else REPO_ROOT / raw
                if not path.is_file():
                    raise ConfigError(
                        f"key '{key}': the {kind} dataset of {env_id!r} ({raw}) is not there; download it with "
                        f'ng_prepare_data "+config_paths=[resources_servers/{env_id}/configs/{env_id}.yaml]"'
                        " +mode=train_preparation +should_download=true"
                    )
                return path
    raise ConfigError(
        f"key '{key}': environment {env_id!r} declares no {' or '.join(types)} dataset in its agent's `datasets`"
    )


@functools.cache
def _server_config_class(env_id: str) -> type[BaseModel]:
    return load_server_class(RESOURCES_DIR / env_id / "app.py").Config


def _check_server_args(env_id: str, fields: dict[str, Any], args: dict[str, Any], key: str) -> None:
    """Validate `args` as fields of the resources server's Config (skipped when its app cannot be imported here)."""
    try:
        config_class = _server_config_class(env_id)
    except ModuleNotFoundError as exc:
        print(
            f"ng_train: warning: cannot check {key} here ({exc}); the server checks them when it starts",
            file=sys.stderr,
        )
        return
    for name in args:
        if name not in config_class.model_fields:
            raise ConfigError(
                f"key '{key}.{name}': resources server {env_id!r} has no field"
                f" {name!r}{did_you_mean(name, config_class.model_fields)}; see resources_servers/{env_id}/README.md"
                " (Arguments)"
            )
    try:
        config_class.model_validate({**fields, **args})
    except ValidationError as exc:
        problems = [
            f"key '{key}.{key_path(e['loc'])}': {e['msg']} (got {e.get('input')!r})"
            for e in exc.errors()
            if e["loc"] and e["loc"][0] in args
        ]
        if problems:
            raise ConfigError("; ".join(problems)) from exc


def _servers_by_type(values: dict[str, Any]) -> dict[str, dict[str, tuple[str, dict[str, Any]]]]:
    """{server type: {instance name: (implementation, fields)}} of a loaded config's server instances."""
    found: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
        "resources_servers": {},
        "responses_api_agents": {},
        "responses_api_models": {},
    }
    for name, value in values.items():
        if (
            isinstance(value, dict)
            and len(value) == 1
            and next(iter(value)) in found
            and isinstance(next(iter(value.values())), dict)
        ):
            server_type, inner = next(iter(value.items()))
            if len(inner) == 1:
                found[server_type][name] = next(iter(inner.items()))
    return found


def _our_env(env_id: str, args: dict[str, Any], key: str) -> ResolvedEnv | None:
    yaml_path = RESOURCES_DIR / env_id / "configs" / f"{env_id}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9_]+", env_id) or env_id == ADAPTER or not yaml_path.is_file():
        return None
    values = load_config([f"+config_paths=[{yaml_path}]"], resolve=False).values
    servers = _servers_by_type(values)
    resources = [name for name, (impl, _) in servers["resources_servers"].items() if impl == env_id]
    if not resources:
        raise ConfigError(f"key '{key}.id': {yaml_path} defines no resources server {env_id!r}")
    agents = [
        name
        for name, (_, f) in servers["responses_api_agents"].items()
        if (f.get("resources_server") or {}).get("name") == resources[0]
    ]
    if not agents:
        raise ConfigError(f"key '{key}.id': {yaml_path} defines no agent for {resources[0]!r}")
    if args:
        _check_server_args(env_id, servers["resources_servers"][resources[0]][1], args, f"{key}.args")
    datasets = servers["responses_api_agents"][agents[0]][1].get("datasets") or []

    def rows(split: str, limit: int | None) -> list[dict[str, Any]]:
        types = ("train", "example") if split == "train" else ("validation", "example", "train")
        return read_jsonl(_dataset_path(datasets, types, env_id, key), limit=limit)

    overrides = {resources[0]: {"resources_servers": {env_id: dict(args)}}} if args else {}
    return ResolvedEnv(env_id, agents[0], [str(yaml_path.relative_to(REPO_ROOT))], overrides, rows)


def _verifiers_env(env_id: str, args: dict[str, Any], key: str) -> ResolvedEnv | None:
    adapter = _vf_adapter()
    folder = adapter.module_folder(env_id)
    if folder is None:
        return None
    try:
        adapter.check_args(env_id, args, key=f"{key}.args")
        env = adapter.load_env(env_id, args)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith("key '") else f"key '{key}.id': {message}") from exc
    instance = "vf_" + adapter.module_for(env_id)
    agent = f"{instance}_simple_agent"
    instances = {
        instance: {
            "resources_servers": {
                ADAPTER: {
                    "entrypoint": "app.py",
                    "domain": "other",
                    "description": f"verifiers environment {env_id}",
                    "env_id": env_id,
                    "env_args": dict(args),
                    "python_path": [str(folder)],
                }
            }
        },
        agent: {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": instance},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                }
            }
        },
    }
    return ResolvedEnv(env_id, agent, [], instances, lambda split, limit: adapter.task_rows(env, split, limit))


def _our_spelling(env_id: str) -> str | None:
    """Our environment that `env_id` names in another spelling (`reasoning-gym`, `Reasoning_Gym`, `owner/math-verify`:
    a PyPI or Prime Hub name), else None."""
    name = env_id.strip().split("/")[-1].replace("-", "_").lower()
    return name if name != env_id and name in our_environments() else None


def resolve_env(env_id: str, args: dict[str, Any], key: str) -> ResolvedEnv:
    """Our environment `env_id`, else the installed verifiers package of that id.

    Raises:
        ConfigError: neither exists (with a suggestion among ours), or its `args` are not accepted. An id that is
            one of ours in another spelling (`reasoning-gym`) and no verifiers environment (the PyPI package
            reasoning-gym has no load_environment()) names ours.
    """
    resolved = _our_env(env_id, args, key)
    ours = _our_spelling(env_id)
    try:
        resolved = resolved or _verifiers_env(env_id, args, key)
    except (
        ConfigError
    ) as exc:  # e.g. `reasoning-gym`: the installed PyPI package reasoning_gym, not a verifiers environment
        if ours is None:
            raise
        raise ConfigError(f'{exc}; did you mean our environment {ours!r}? Write id = "{ours}"') from exc
    if resolved is None and ours is not None:
        raise ConfigError(
            f"key '{key}.id': {env_id!r} is not an environment here; did you mean our environment {ours!r}? Write id ="
            f' "{ours}"'
        )
    if resolved is None:
        ours = our_environments()
        raise ConfigError(
            f"key '{key}.id': {env_id!r} is neither one of our environments{did_you_mean(env_id, ours)}"
            f" ({', '.join(ours)}) nor an installed verifiers environment package (no module"
            f" {_vf_adapter().module_for(env_id)!r}; install it, e.g. `uv pip install -e environments/<name>` or `prime"
            f" env install {env_id}`)"
        )
    return resolved
