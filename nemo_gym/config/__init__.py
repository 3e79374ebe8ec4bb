"""Configuration: Hydra overrides, nested `config_paths`, `env.yaml`, interpolation, validation.

Order of merging (later wins): the YAML files of `config_paths` (each may list its own `config_paths`,
loaded before it), then `env.yaml` (local secrets and values such as `policy_base_url`), then the
command-line overrides `+key=value` / `++key=value` / `key=value` (all three set the key here, so nobody
has to know whether a key exists yet). Every error names the YAML file and the key and says what to write.
The server instances of a loaded config, checked, are `nemo_gym.config.server_instances`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT, server_tree_root
from nemo_gym.config.directives import apply_config_directives

__all__ = [
    "LoadedConfig",
    "parse_overrides",
    "load_config",
    "load_config_file",
    "config_tree_root",
    "mask_secrets",
    "is_secret_key",
    "did_you_mean",
    "closest_parameter",
    "validation_problems",
    "server_sections",
    "instance_sections",
    "has_code_to_start",
]

IMPLEMENTATION_DIR_KEY = "implementation_dir"  # a server's own folder outside this repository (see ServerInstance)
SECRET_WORDS = frozenset({"token", "key", "secret", "password", "passwd", "apikey", "credentials"})
MASK = "****"


def did_you_mean(word: str, choices: Any) -> str:
    """' (did you mean X?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def closest_parameter(key: str, known: Any) -> str:
    """' (did you mean X?)' for an unknown parameter or config key `key`: the one known name whose first word is the
    key's (given `output_jsonl_fpath`, `output_dirpath`: the same role, where the spelling is closer to
    `rollouts_jsonl_fpath`), else the closest spelling (`did_you_mean`)."""
    same_role = [str(name) for name in known if str(name).split("_")[0] == key.split("_")[0]]
    return f" (did you mean {same_role[0]!r}?)" if len(same_role) == 1 else did_you_mean(key, known)


def _section_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model at a pydantic error location's parent (`("engine", "lora", "rnak")` → LoraOptions)."""
    for part in loc[:-1]:
        field_info = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if field_info is None:
            return None
        annotation = field_info.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        found = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if found is None:
            return None
        model = found
    return model


def validation_problems(model: type[BaseModel], exc: ValidationError, key_format: str = "{key}") -> list[str]:
    """One `<key>: <message>` line per error of validating `model` (each key written with `key_format`, e.g.
    `"+{key}"`); an unknown key of a section gets a suggestion among the section's keys and the list of them:
    `trainer.num_step: not a key of trainer (did you mean 'num_steps'?); its keys: ...`."""
    problems = []
    for error in exc.errors():
        loc = error["loc"]
        key = key_format.format(key=".".join(map(str, loc)))
        section = _section_at(model, loc) if error["type"] == "extra_forbidden" else None
        if section is None:
            problems.append(f"{key}: {error['msg']}")
            continue
        keys = [info.alias or name for name, info in section.model_fields.items()]
        parent = f" of {key.rpartition('.')[0]}" if "." in key else ""
        problems.append(f"{key}: not a key{parent}{closest_parameter(str(loc[-1]), keys)}; its keys: {', '.join(keys)}")
    return problems


@dataclass
class LoadedConfig:
    """The resolved config as plain containers, and where each top-level key came from."""

    values: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)

    def origin(self, key: str) -> str:
        return self.origins.get(key.split(".")[0], "<command line>")


def parse_overrides(argv: list[str]) -> list[tuple[str, Any]]:
    """Parse Hydra overrides (`+a.b=1`, `++a=[x,y]`, `a=v`) into `(key, python value)` pairs.

    Raises:
        ConfigError: an argument that is not `key=value`, with the argument quoted.
    """
    parser = OverridesParser.create()
    pairs = []
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(f"argument {arg!r} is not a key=value override; write +{arg.lstrip('+')}=<value>")
        try:
            override = parser.parse_override(arg)
        except HydraException as exc:
            raise ConfigError(
                f"cannot parse argument {arg!r}: {exc}. Quote lists like '+config_paths=[a.yaml,b.yaml]'"
            ) from exc
        if override.is_delete():
            raise ConfigError(f"argument {arg!r}: deleting keys (~key) is not supported")
        pairs.append((override.key_or_group, override.value()))
    return pairs


def _read_yaml(path: Path, cited_from: str) -> DictConfig:
    if not path.is_file():
        siblings = [p.name for p in path.parent.glob("*.y*ml")] if path.parent.is_dir() else []
        raise ConfigError(f"{cited_from}: config file {str(path)!r} does not exist{did_you_mean(path.name, siblings)}")
    try:
        with path.open() as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def config_tree_root(yaml_path: Path) -> Path | None:
    """The root of the server tree a YAML file belongs to: of a server folder's config (`<root>/<server_type>/<name>/
    configs/<file>.yaml`, `<name>` maybe nested; `nemo_gym.common.layout.server_tree_root`), e.g. in a NeMo Gym
    checkout or wheel, or of a catalog config (`<root>/environments/<name>/config.yaml`,
    `<root>/benchmarks/<name>/.../<file>.yaml`), whose `config_paths` name files from that root; else None."""
    resolved = yaml_path.resolve()
    root = server_tree_root(resolved)
    if root is not None:
        return root
    parts = resolved.parts
    catalog = next((i for i in range(len(parts) - 3, 0, -1) if parts[i] in CATALOG_TREES), None)
    return Path(*parts[:catalog]) if catalog is not None else None


CATALOG_TREES = ("environments", "benchmarks")  # NeMo Gym 0.7.0's catalog folders (nemo_gym.datasets.catalog)


def _resolve_path(raw: str, relative_to: Path, tree_root: Path | None = None) -> Path:
    """A config path: absolute, or relative to `relative_to` (the citing file's folder, or the working directory),
    to the citing file's server tree (NeMo Gym's config files name others from its install root:
    `environment_servers/single_agent_turn_legacy/configs/single_agent_turn_legacy.yaml`), or to this repository."""
    path = Path(raw).expanduser()
    if path.is_absolute():
        return path
    for base in (relative_to, tree_root, REPO_ROOT):
        if base is not None and (base / path).exists():
            return (base / path).resolve()
    return (relative_to / path).resolve()


def _load_config_paths(
    paths: Any,
    cited_from: str,
    base_dir: Path,
    seen: tuple[Path, ...],
    origins: dict[str, str],
    tree_root: Path | None = None,
) -> DictConfig:
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, (list, tuple, ListConfig)):
        raise ConfigError(f"{cited_from}: config_paths must be a list of YAML paths, got {paths!r}")
    merged = OmegaConf.create({})
    for raw in paths:
        path = _resolve_path(str(raw), base_dir, tree_root)
        if path in seen:
            raise ConfigError(f"{cited_from}: config_paths cycle: {' -> '.join(map(str, seen + (path,)))}")
        cfg = _read_yaml(path, cited_from)
        _anchor_implementation_dirs(cfg, path.parent)
        _anchor_sibling_server_folders(cfg, path)
        nested = cfg.pop("config_paths", None)
        if nested:
            root = config_tree_root(path) or tree_root
            merged = OmegaConf.merge(
                merged, _load_config_paths(nested, f"{path}: config_paths", path.parent, seen + (path,), origins, root)
            )
        for key in cfg:
            origins[str(key)] = str(path)
        merged = OmegaConf.merge(merged, cfg)
    return merged


def _anchor_implementation_dirs(cfg: DictConfig, base_dir: Path) -> None:
    """Make each server instance's relative `implementation_dir` absolute, relative to `base_dir` (the folder of
    the YAML file that sets it), so a project's config works from any working directory. Nothing is resolved:
    `${...}` values are left as they are."""
    for name, server_type, implementation, fields in server_sections(OmegaConf.to_container(cfg, resolve=False)):
        raw = fields.get(IMPLEMENTATION_DIR_KEY)
        if isinstance(raw, str) and "${" not in raw and not Path(raw).expanduser().is_absolute():
            cfg[name][server_type][implementation][IMPLEMENTATION_DIR_KEY] = str(
                (base_dir / Path(raw).expanduser()).resolve()
            )


def _anchor_sibling_server_folders(cfg: DictConfig, yaml_path: Path) -> None:
    """A YAML file inside a server folder of another tree (`<root>/<server_type>/<name>/configs/<file>.yaml`, or
    deeper: 0.7.0's `responses_api_models/local_vllm_model/configs/Qwen/<file>.yaml`; e.g. a NeMo Gym checkout or
    the folders of NeMo Gym's wheel) names that tree's servers: each instance of it whose
    folder `<root>/<server_type>/<implementation>` exists runs from there (its `implementation_dir`, unless set),
    as NeMo Gym resolves a server folder next to its config. YAML files of this repository are left as they are."""
    root = config_tree_root(yaml_path)
    if root is None or root == REPO_ROOT:
        return
    for name, server_type, implementation, fields in instance_sections(OmegaConf.to_container(cfg, resolve=False)):
        folder = root / str(server_type) / str(implementation)
        if IMPLEMENTATION_DIR_KEY not in fields and "url" not in fields and folder.is_dir():
            cfg[name][server_type][implementation][IMPLEMENTATION_DIR_KEY] = str(folder)


def _list_index_path(config: DictConfig, key: str) -> bool:
    """Whether the dotted `key` goes through a list of `config` (`generators.0.size` with `generators` a list)."""
    node: Any = config
    for part in key.split("."):
        if isinstance(node, ListConfig):
            return True
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return False


def load_config(
    argv: list[str], *, cwd: Path | None = None, env_yaml: Path | None = None, resolve: bool = True
) -> LoadedConfig:
    """Load and merge the config for a command line.

    Args:
        argv: the override arguments (`+config_paths=[...]`, `+key=value`, ...).
        cwd: directory for relative paths and `env.yaml` (default: the current directory).
        env_yaml: explicit env.yaml path (default `<cwd>/env.yaml`, or `+env_yaml_fpath=...`).
        resolve: resolve `${...}` interpolations.

    Raises:
        ConfigError: a missing file, bad YAML, a `???` value with no override, a broken interpolation.
    """
    cwd = cwd or Path.cwd()
    overrides = parse_overrides(argv)
    cli = OmegaConf.create({})
    for key, value in overrides:
        OmegaConf.update(cli, key, value, force_add=True, merge=False)
    origins: dict[str, str] = {}
    merged = OmegaConf.create({})
    if "config_paths" in cli:
        merged = _load_config_paths(
            OmegaConf.to_container(cli.config_paths), "command line +config_paths", cwd, (), origins
        )
    env_path = Path(cli.get("env_yaml_fpath") or env_yaml or cwd / "env.yaml")
    if env_path.is_file():
        env_cfg = _read_yaml(env_path, "env.yaml")
        for key in env_cfg:
            origins[str(key)] = str(env_path)
        merged = OmegaConf.merge(merged, env_cfg)
    for key, _ in overrides:
        origins[key.split(".")[0]] = "<command line>"
    into_lists = [(key, value) for key, value in overrides if _list_index_path(merged, key)]
    if into_lists:  # `generators.0.size=5`: set inside the file's list (a merge would replace the list by a dict)
        cli = OmegaConf.create({})
        for key, value in (o for o in overrides if o not in into_lists):
            OmegaConf.update(cli, key, value, force_add=True, merge=False)
    _anchor_implementation_dirs(
        cli, cwd
    )  # a relative implementation_dir on the command line: from the working directory
    merged = OmegaConf.merge(merged, cli)
    for key, value in into_lists:
        try:
            OmegaConf.update(merged, key, value, force_add=True, merge=True)
        except (OmegaConfBaseException, IndexError, TypeError, ValueError) as exc:
            reason = str(getattr(exc, "msg", None) or exc).splitlines()[0]
            raise ConfigError(f"<command line>: key {key!r}: {reason} (a list's items are numbered from 0)") from exc
    loaded = LoadedConfig(values={}, origins=origins)
    apply_config_directives(merged, loaded.origin)  # NeMo Gym 0.7.0's _inherit_from, _copy, _delete_key
    _check_missing(merged, loaded)
    try:
        loaded.values = OmegaConf.to_container(merged, resolve=resolve)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(
            f"{loaded.origin(str(key))}: key {key!r}: {getattr(exc, 'msg', exc)}. "
            "Define the referenced key in a config file, in env.yaml, or on the command line (+name=value)."
        ) from exc
    return loaded


def load_config_file(path: Path, tree_root: Path) -> dict[str, Any]:
    """One YAML file merged with the files its `config_paths` name (relative ones found next to the citing file,
    then under `tree_root`, e.g. the root of a NeMo Gym checkout), with the `_inherit_from`/`_copy`/`_delete_key`
    directives applied; `${...}` and `???` values are left as they are, and no `env.yaml` or command line is read.

    Raises:
        ConfigError: a missing file, bad YAML, a `config_paths` cycle, a directive that names no key.
    """
    origins: dict[str, str] = {}
    merged = _load_config_paths([str(path)], f"{path}", tree_root, (), origins, tree_root)
    apply_config_directives(merged, lambda key: origins.get(key.split(".")[0], str(path)))
    return OmegaConf.to_container(merged, resolve=False)  # type: ignore[return-value]


def _check_missing(cfg: Any, loaded: LoadedConfig, prefix: str = "") -> None:
    if isinstance(cfg, DictConfig):
        for key in cfg.keys():
            full = f"{prefix}{key}"
            if OmegaConf.is_missing(cfg, key):
                raise ConfigError(
                    f"{loaded.origin(full)}: key {full!r} has no value (it is '???'). "
                    f"Set it on the command line with +{full}=<value> or in env.yaml as `{full}: <value>`."
                )
            _check_missing(cfg._get_node(key), loaded, f"{full}.")
    elif isinstance(cfg, ListConfig):
        for index in range(len(cfg)):
            _check_missing(cfg._get_node(index), loaded, f"{prefix}{index}.")


def server_sections(config: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """`(name, server_type, implementation, fields)` of each top-level key shaped as a server instance
    (`<name>: <server_type>: <implementation>: {fields}`, one key at each of the two inner levels); other keys are
    skipped.
    """
    for name, value in config.items():
        if not (isinstance(value, dict) and len(value) == 1):
            continue
        server_type, inner = next(iter(value.items()))
        if not (isinstance(inner, dict) and len(inner) == 1):
            continue
        implementation, fields = next(iter(inner.items()))
        if isinstance(fields, dict):
            yield str(name), server_type, implementation, fields


def instance_sections(config: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """The `server_sections` that are server instances (`has_code_to_start`)."""
    return ((n, t, i, f) for n, t, i, f in server_sections(config) if has_code_to_start(f))


def has_code_to_start(fields: dict[str, Any]) -> bool:
    """Whether a server section's fields make it a server instance: an `entrypoint` (code to start) or a `url` (an
    external server); without either it is a template or fields for an instance another file defines."""
    return "entrypoint" in fields or "url" in fields


def is_secret_key(key: str) -> bool:
    """True for keys naming a secret: a word of the key (split on `_`, `-`, `.`, camelCase) is token, key,
    secret, password, ... (`policy_api_key`, `hf_token`, `apiKey`; not `max_output_tokens`)."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()
    return any(word in SECRET_WORDS for word in re.split(r"[^a-z0-9]+", words))


def mask_secrets(value: Any) -> Any:
    """A copy with the value of every secret key (see `is_secret_key`) replaced by '****'."""
    if isinstance(value, dict):
        return {
            k: (
                MASK
                if is_secret_key(str(k)) and not isinstance(v, (dict, list)) and v not in (None, "")
                else mask_secrets(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    return value
