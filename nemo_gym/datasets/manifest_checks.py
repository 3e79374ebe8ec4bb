"""A manifest checked against what it describes (NeMo Gym 0.7.0's `gym env validate NAME` / `--manifest PATH`,
`environment.validation.validate_environment`), without starting anything:

1. the manifest follows the schema (`nemo_gym.datasets.manifest`), and its folder gives its name and kind;
2. its config loads (`config_paths` from its tree's root; a missing policy model stood in for, as `ng_validate`
   does), and the composition the manifest mirrors is the config's: the agent that runs the datasets (the one
   agent instance declaring datasets, or the agent of the one resources server declaring them, or of
   `dataset_owner`), its resources server and model server, the datasets (name, type, file, prepare script, prompt
   config, repeats), `grading_mode` and `rollout_collection_driver`; with `sync`, a stale mirror is rewritten from
   the config (the config is authoritative), else each difference is named;
3. each dataset's file has rows, each a JSON object with `responses_create_params.input` (a benchmark's prepare
   script and prompt config exist; its template applies to every row).

Departures from 0.7.0: the integration profile is not inferred from the servers' code (0.7.0 reads its own base
classes' methods there), so it is reported as declared; datasets routed by taskset through an environment server
(0.7.0's decoupled layout) are not resolved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nemo_gym.collect.prompt_templates import apply_prompt, load_prompt_config
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import iter_jsonl
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import IMPLEMENTATION_DIR_KEY, instance_sections, load_config
from nemo_gym.datasets.manifest import EnvironmentManifest, ManifestDataset, load_manifest, manifest_config_path

__all__ = ["ManifestReport", "validate_manifest"]

MIRRORED = ("resources_server", "agent_server", "model_server", "datasets", "rollout_driver", "grading_mode")
DATASET_FIELDS = ("name", "type", "jsonl_fpath", "prepare_script", "prompt_config", "num_repeats")
# a stand-in policy model for a config that names none (as ng_validate and 0.7.0's NO_MODEL_GLOBAL_CONFIG_DICT)
POLICY_STAND_IN = "+policy_model.responses_api_models.openai_model.url=http://127.0.0.1:9"


@dataclass
class ManifestReport:
    """What was checked: the manifest, the components of its composition (role, instance, implementation), its
    datasets (name, type, rows) and the manifest fields rewritten from the config (`sync`)."""

    name: str
    version: str
    kind: str
    profile: str
    manifest_path: str
    config_path: str
    components: list[tuple[str, str, str]] = field(default_factory=list)
    datasets: list[tuple[str, str, int]] = field(default_factory=list)
    synchronized: list[str] = field(default_factory=list)
    resources_server_dir: str | None = None  # the folder of the resources server's code


def _location(path: Path, manifest: EnvironmentManifest) -> None:
    tree = next((p for p in path.parents if p.name in ("environments", "benchmarks")), None)
    name = path.parent.relative_to(tree).as_posix() if tree is not None else path.parent.name
    if manifest.name != name:
        raise ConfigError(f"{path}: name {manifest.name!r} is not its catalog path {name!r}")
    if tree is not None and manifest.kind.value != tree.name.removesuffix("s"):
        raise ConfigError(f"{path}: kind {manifest.kind.value!r} does not match its place under {tree.name}/")


def _instances(config_path: Path, root: Path) -> tuple[dict[str, tuple[str, str, dict[str, Any]]], dict[str, Any]]:
    """name -> (server type, implementation, fields) of the config's instances, and the config's values."""
    argv = [f"+config_paths=[{config_path}]"]
    try:
        values = load_config(argv, cwd=root, resolve=False).values
    except ConfigError:
        values = load_config([*argv, POLICY_STAND_IN], cwd=root, resolve=False).values  # another error is raised
    return {name: (kind, impl, fields) for name, kind, impl, fields in instance_sections(values)}, values


def _owner_and_agent(instances: dict[str, tuple[str, str, dict[str, Any]]], owner: str | None) -> tuple[str, str]:
    """(the instance declaring the datasets, the agent instance that runs them).

    Raises:
        ConfigError: no single such instance or agent, naming those found.
    """
    with_data = {n: kind for n, (kind, _, fields) in instances.items() if fields.get("datasets")}
    if owner is not None and owner not in with_data:
        raise ConfigError(f"dataset_owner {owner!r} is no instance of the config that declares datasets")
    servers = [n for n, kind in with_data.items() if kind == "resources_servers"]
    agents = [n for n, kind in with_data.items() if kind == "responses_api_agents"]
    if owner is None and len(servers) > 1:
        raise ConfigError(f"the config declares datasets on several resources servers: {', '.join(servers)}")
    if owner is None and not servers and len(agents) != 1:
        raise ConfigError(
            f"the config needs exactly one agent declaring datasets; found: {', '.join(agents) or 'none'}"
        )
    owner = owner or (servers or agents)[0]
    if with_data[owner] == "responses_api_agents":
        return owner, owner
    pins = {d["agent"] for d in instances[owner][2]["datasets"] if isinstance(d, dict) and d.get("agent")}
    users = [
        n
        for n, (kind, _, fields) in instances.items()
        if kind == "responses_api_agents" and (fields.get("resources_server") or {}).get("name") == owner
    ]
    chosen = sorted(pins) if pins else users
    if len(chosen) != 1:
        raise ConfigError(f"the datasets of {owner!r} go to no single agent (found: {', '.join(chosen) or 'none'})")
    return owner, chosen[0]


def _composition(config_path: Path, root: Path, owner_name: str | None) -> tuple[dict[str, Any], list[tuple]]:
    """The mirrored fields (MIRRORED) as the config has them, and the components (role, instance, implementation)."""
    instances, values = _instances(config_path, root)
    owner, agent = _owner_and_agent(instances, owner_name)
    agent_fields = instances[agent][2]
    resources = owner if instances[owner][0] == "resources_servers" else None
    resources = resources or (agent_fields.get("resources_server") or {}).get("name")
    model = (agent_fields.get("model_server") or {}).get("name")
    try:
        datasets = [
            ManifestDataset.model_validate({k: d[k] for k in DATASET_FIELDS if d.get(k) is not None})
            for d in instances[owner][2]["datasets"]
        ]
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        raise ConfigError(f"{config_path}: a dataset of {owner!r}: {problem['loc'][0]}: {problem['msg']}") from None
    resources_fields = instances[resources][2] if resources in instances else {}
    mirrored = {
        "resources_server": instances[resources][1] if resources in instances else None,
        "agent_server": instances[agent][1],
        "model_server": model,
        "datasets": datasets or None,
        "rollout_driver": values.get("rollout_collection_driver"),
        "grading_mode": str(resources_fields["grading_mode"]) if resources_fields.get("grading_mode") else None,
    }
    components = [("agent_server", agent, instances[agent][1])]
    if resources in instances:
        components.insert(0, ("resources_server", resources, instances[resources][1]))
        mirrored["_folder"] = _folder(resources_fields, instances[resources][1], root)
    if model:
        components.append(("model_server", model, instances[model][1] if model in instances else "runtime-selected"))
    return mirrored, components


def _folder(fields: dict[str, Any], implementation: str, root: Path) -> str:
    """A resources server's folder: its `implementation_dir`, else `resources_servers/<implementation>` of the
    manifest's tree, else of this repository."""
    if fields.get(IMPLEMENTATION_DIR_KEY):
        return str(Path(fields[IMPLEMENTATION_DIR_KEY]).expanduser().resolve())
    own = root / "resources_servers" / implementation
    return str(own if own.is_dir() else REPO_ROOT / "resources_servers" / implementation)


def _file(raw: str, root: Path) -> Path:
    path = Path(raw).expanduser()
    return (
        path if path.is_absolute() else next((r / path for r in (root, Path.cwd()) if (r / path).exists()), root / path)
    )


def _dataset_rows(dataset: ManifestDataset, manifest: EnvironmentManifest, root: Path) -> int:
    """The number of rows of a dataset, each checked (module docstring). Raises DataError, ConfigError."""
    path = _file(dataset.jsonl_fpath, root)
    if not path.is_file():
        raise DataError(f"dataset {dataset.name!r}: its file {path} does not exist")
    prompt = None
    if dataset.type.value == "benchmark":
        prepare = _file(str(dataset.prepare_script), root)
        if not prepare.is_file():
            raise DataError(f"dataset {dataset.name!r}: its prepare script {prepare} does not exist")
        template = dataset.prompt_config or manifest.standard_prompt_config
        if manifest.prompt_source.value == "template" and template:
            prompt = load_prompt_config(_file(template, root))
    count = 0
    for number, row in iter_jsonl(path):
        count += 1
        try:
            row = apply_prompt(row, prompt) if prompt is not None else row
        except (KeyError, ValueError) as exc:
            raise DataError(f"{path}:{number}: dataset {dataset.name!r}: the prompt does not apply: {exc}") from None
        params = row.get("responses_create_params")
        if not isinstance(params, dict) or not isinstance(params.get("input"), (str, list)) or not params["input"]:
            raise DataError(f"{path}:{number}: dataset {dataset.name!r}: no responses_create_params.input")
    if not count:
        raise DataError(f"dataset {dataset.name!r}: {path} has no rows")
    return count


def validate_manifest(manifest_path: Path, *, sync: bool = False) -> ManifestReport:
    """Check a manifest (module docstring); with `sync`, rewrite its stale mirrored fields from the config.

    Raises:
        ConfigError (ManifestError for the schema): the first problem, naming the file and the field.
        DataError: a dataset file that is missing, empty or has bad rows (`file:line`).
    """
    path = manifest_path.expanduser().resolve()
    manifest = load_manifest(path)
    _location(path, manifest)
    config_path = manifest_config_path(path, manifest)
    if not config_path.is_file():
        raise ConfigError(f"{path}: its config {config_path} does not exist")
    tree = next((p for p in path.parents if p.name in ("environments", "benchmarks")), None)
    root = tree.parent if tree is not None else path.parent
    mirrored, components = _composition(config_path, root, manifest.dataset_owner)
    folder = mirrored.pop("_folder", None)
    stale = {key: value for key, value in mirrored.items() if getattr(manifest, key) != value}
    if stale and not sync:
        lines = [
            f"  - {key}: manifest={_shown(getattr(manifest, key))}, config={_shown(v)}" for key, v in stale.items()
        ]
        raise ConfigError(
            f"{path}: the manifest's composition is stale (the config is authoritative):\n" + "\n".join(lines) + "\n"
            "+sync=true rewrites these fields from the config"
        )
    if stale:
        updated = {**manifest.model_dump(mode="json"), **{k: _plain(v) for k, v in stale.items()}}
        try:
            manifest = EnvironmentManifest.model_validate(updated)
        except ValidationError as exc:
            raise ConfigError(f"{path}: the config cannot satisfy the manifest: {exc.errors()[0]['msg']}") from None
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        path.write_text(yaml.safe_dump({**raw, **{k: _plain(v) for k, v in stale.items()}}, sort_keys=False))
    datasets = [(d.name, d.type.value, _dataset_rows(d, manifest, root)) for d in manifest.datasets]
    return ManifestReport(
        manifest.name, manifest.version, manifest.kind.value, manifest.integration_profile.value, str(path),
        str(config_path), components, datasets, sorted(stale), folder,
    )  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [v.model_dump(mode="json", exclude_none=True) for v in value]
    return value


def _shown(value: Any) -> str:
    return json.dumps(_plain(value), sort_keys=True) if isinstance(value, list) else json.dumps(value)
