"""The server instances of a resolved config: each `<name>: <server_type>: <implementation>: {fields}` section
with code to start (`entrypoint`) or a URL (`url`), as a `ServerInstance` whose properties read and check its
fields, and `server_instances`, which checks them all (their folders, entrypoints and the `{type, name}` references
between them) before anything starts. Loading and merging the config is `nemo_gym.config`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import ALL_SERVER_TYPES, NEMO_GYM_ONLY_SERVER_TYPES, REPO_ROOT, SERVER_TYPES
from nemo_gym.common.paths import PathEscapeError, resolve_inside
from nemo_gym.config import IMPLEMENTATION_DIR_KEY, LoadedConfig, did_you_mean, has_code_to_start, instance_sections

__all__ = ["FRAMEWORKS", "ServerInstance", "server_instances"]

FRAMEWORKS = ("nemo_gym",)  # `framework:` values: a folder written against NVIDIA NeMo Gym's base classes


@dataclass
class ServerInstance:
    """One server of the resolved config: `<name>: <server_type>: <implementation>: {fields}`."""

    name: str
    server_type: str
    implementation: str
    fields: dict[str, Any]
    source: str = "<command line>"

    @property
    def implementation_dir(self) -> Path:
        """The folder of the server's code: the field `implementation_dir` when set (a project of the user's, e.g.
        made by `ng_init`; made absolute when its YAML is loaded), else `<server_type>/<implementation>` of this
        repository."""
        own = self.fields.get(IMPLEMENTATION_DIR_KEY)
        if own:
            return Path(own).expanduser().resolve()
        return REPO_ROOT / self.server_type / self.implementation

    @property
    def extra_requirement_files(self) -> list[Path]:
        """Field `extra_requirements`: requirements files installed into the server's environment besides its
        folder's requirements.txt (e.g. a ReinforceNow project's own); a relative path is from the server's folder."""
        return [
            self.implementation_dir / Path(str(p)).expanduser() for p in self.fields.get("extra_requirements") or []
        ]

    @property
    def entrypoint(self) -> str:
        return str(self.fields.get("entrypoint", "app.py"))

    @property
    def entrypoint_path(self) -> Path:
        """The entrypoint file, which must lie inside `implementation_dir` (symlinks resolved).

        Raises:
            ConfigError: `entrypoint` (or the implementation name) leads outside its folder, e.g. `../other/app.py`.
        """
        where = f"{self.name}.{self.server_type}.{self.implementation}"
        try:
            if (
                self.implementation_dir == REPO_ROOT / self.server_type / self.implementation
            ):  # a folder of this repository
                resolve_inside(
                    REPO_ROOT / self.server_type, self.implementation, what=f"'{where}': implementation name"
                )
            return resolve_inside(self.implementation_dir, self.entrypoint, what=f"'{where}.entrypoint'")
        except PathEscapeError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def key(self) -> str:
        """`<name>.<server_type>.<implementation>`: the YAML key of the instance's fields, for messages."""
        return f"{self.name}.{self.server_type}.{self.implementation}"

    @property
    def external_urls(self) -> list[str] | None:
        """The base URLs of an external server (field `url`: one URL, or a list, one per replica): a server
        running elsewhere, which `ng_run` checks and registers but never starts. None for a server ng_run starts.

        Raises:
            ConfigError: not an http(s) URL (or a non-empty list of them), naming the YAML key.
        """
        value = self.fields.get("url")
        if value is None:
            return None
        urls = [value] if isinstance(value, str) else value
        where = f"{self.source}: key '{self.key}.url'"
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ConfigError(f"{where}: must be a URL or a non-empty list of URLs (one per replica), got {value!r}")
        for url in urls:
            if not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
                raise ConfigError(f"{where}: {url!r} is not an http(s) URL; write e.g. url: http://127.0.0.1:8000")
        return [u.rstrip("/") for u in urls]

    @property
    def health_path(self) -> str | None:
        """Field `health_path`: the route that tells an external server is up (None: `/health`, or NeMo Gym's
        liveness route `/` when `/health` answers 404)."""
        value = self.fields.get("health_path")
        return None if value is None else "/" + str(value).lstrip("/")

    @property
    def send_run_token(self) -> bool:
        """Field `send_run_token` (default false): whether calls to this external server carry the run's token."""
        return bool(self.fields.get("send_run_token", False))

    @property
    def framework(self) -> str | None:
        """Field `framework`: `'nemo_gym'` for a server folder written for NVIDIA NeMo Gym, None when not set (what
        an unset field means is read from the folder's entrypoint: `nemo_gym.upstream.detect.framework_of`). Another
        value is the server's own field, not ours (NeMo Gym 0.7.0's tales server: `framework: textworld`), so also
        None, unless it is close to one of FRAMEWORKS (a typo).

        Raises:
            ConfigError: a `framework` value close to one of FRAMEWORKS but not it (`nemo-gym`).
        """
        value = self.fields.get("framework")
        if value is not None and value not in FRAMEWORKS:
            close = did_you_mean(str(value), FRAMEWORKS)
            if not close:
                return None
            raise ConfigError(
                f"{self.source}: key '{self.key}.framework': unknown framework"
                f" {value!r}{close}; use one of {', '.join(FRAMEWORKS)} (nemo_gym: a"
                " folder written for NVIDIA NeMo Gym)"
            )
        return value

    @property
    def num_replicas(self) -> int:
        """How many processes `ng_run` starts for this instance (field `num_replicas`, default 1); for an external
        server, the number of its URLs.

        Raises:
            ConfigError: not an integer >= 1, or several replicas with one fixed `port`.
        """
        urls = self.external_urls
        if urls is not None:
            return len(urls)
        value = self.fields.get("num_replicas", 1)
        where = f"{self.source}: key '{self.name}.{self.server_type}.{self.implementation}.num_replicas'"
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: must be an integer >= 1, got {value!r}")
        if value > 1 and self.fields.get("port") not in (None, 0):
            raise ConfigError(
                f"{where}: {value} replicas cannot share the fixed port {self.fields['port']}; set port: 0 (a free port"
                " each)"
            )
        return value


def server_instances(loaded: LoadedConfig, *, check_dirs: bool = True) -> list[ServerInstance]:
    """The server instances of a resolved config, checked.

    Raises:
        ConfigError: an unknown server type, a missing implementation folder or entrypoint, a `{type, name}`
            reference to an instance that does not exist, or a key with code to start that holds several servers.
    """
    _check_one_implementation_each(loaded)
    instances = []
    for name, server_type, implementation, fields in instance_sections(loaded.values):
        where = f"{loaded.origin(name)}: key '{name}.{server_type}'"
        if server_type not in ALL_SERVER_TYPES:
            raise ConfigError(
                f"{where}: unknown server type {server_type!r}{did_you_mean(server_type, SERVER_TYPES)}; use one of"
                f" {', '.join(SERVER_TYPES)} (a NeMo Gym 0.7.0 folder also {', '.join(NEMO_GYM_ONLY_SERVER_TYPES)})"
            )
        instance = ServerInstance(name, server_type, str(implementation), dict(fields), loaded.origin(name))
        if instance.fields.get(
            IMPLEMENTATION_DIR_KEY
        ):  # absolute from here on (a command-line value: from the working directory)
            instance.fields[IMPLEMENTATION_DIR_KEY] = str(instance.implementation_dir)
        if (
            instance.external_urls is None and check_dirs
        ):  # validates `url` too: a bad one is an error before anything starts
            _check_implementation_dir(instance)
            instance.framework  # noqa: B018 (validates the field)
        instance.num_replicas  # noqa: B018 (validates the field: a bad value is a config error before anything starts)
        instances.append(instance)
    names = {i.name: i for i in instances}
    for instance in instances:
        for key_path, ref in _references(instance.fields):
            where = (
                f"{instance.source}: key '{instance.name}.{instance.server_type}.{instance.implementation}.{key_path}'"
            )
            target = names.get(ref["name"])
            if target is None:
                raise ConfigError(
                    f"{where}: refers to server instance {ref['name']!r}, which is not in the"
                    f" config{did_you_mean(ref['name'], names)}. Defined instances:"
                    f" {', '.join(sorted(names)) or 'none'}; add its YAML to config_paths."
                )
            if target.server_type != ref["type"]:
                raise ConfigError(f"{where}: {ref['name']!r} is a {target.server_type} server, not {ref['type']}")
    return instances


def _check_one_implementation_each(loaded: LoadedConfig) -> None:
    """Raises ConfigError, naming the key and its file, for a top-level key with code to start (an `entrypoint` or a
    `url`) that holds several server types, or several implementations of one (`policy_model: responses_api_models:
    {openai_model: ..., vllm_model: ...}`, as when two files of config_paths each define `policy_model`, or one
    overrides fields of another implementation): not one server instance, it was skipped, leaving only an error about
    a reference to a missing instance (NeMo Gym 0.7.0 reports it as an "almost-server")."""
    for name, value in loaded.values.items():
        if not isinstance(value, dict):
            continue
        sections = {
            f"{server_type}.{implementation}": fields
            for server_type, implementations in value.items()
            if server_type in ALL_SERVER_TYPES and isinstance(implementations, dict)
            for implementation, fields in implementations.items()
            if isinstance(fields, dict)
        }
        if len(sections) > 1 and any(has_code_to_start(fields) for fields in sections.values()):
            raise ConfigError(
                f"{loaded.origin(name)}: key '{name}' holds {len(sections)} servers ({', '.join(sections)}); a server"
                " instance has one server type and one implementation. Did two files of config_paths each define"
                f" '{name}'? Keep one, or give the other server another name."
            )


def _check_implementation_dir(instance: ServerInstance) -> None:
    """Raises ConfigError, naming the YAML file and key, when the instance's folder or its entrypoint file is
    missing."""
    folder, impl = instance.implementation_dir, instance.implementation
    key = f"{instance.source}: key '{instance.name}.{instance.server_type}.{impl}"
    if instance.fields.get(IMPLEMENTATION_DIR_KEY):  # the user's own folder (e.g. a project made by ng_init)
        if not folder.is_dir():
            raise ConfigError(
                f"{key}.{IMPLEMENTATION_DIR_KEY}': folder {folder} does not exist (a relative path is relative to the"
                " YAML file that sets it)"
            )
        shown = str(folder)
    else:
        if not folder.is_dir():
            parent = REPO_ROOT / instance.server_type
            existing = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
            raise ConfigError(
                f"{key}': no folder {instance.server_type}/{impl}{did_you_mean(impl, existing)}; "
                f"for a server folder outside this repository set {IMPLEMENTATION_DIR_KEY}: <folder>"
            )
        shown = f"{instance.server_type}/{impl}"
    if not instance.entrypoint_path.is_file():  # inside its folder, else ConfigError
        raise ConfigError(f"{key}.entrypoint': file {shown}/{instance.entrypoint} does not exist")


def references(fields: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The server instances a config section names, by dotted field path: `{"resources_server": {"type":
    "resources_servers", "name": "weather"}, ...}` (every `{type: <server type>, name}` value, nested ones too).
    Instance names only, nothing else of the config: what the head server may tell its clients."""
    return {path: {"type": ref["type"], "name": str(ref["name"])} for path, ref in _references(fields)}


def _references(value: Any, path: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    if isinstance(value, dict):
        if set(value) == {"type", "name"} and value["type"] in ALL_SERVER_TYPES:
            yield path.rstrip("."), value
            return
        for key, inner in value.items():
            yield from _references(inner, f"{path}{key}.")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _references(inner, f"{path}{index}.")
