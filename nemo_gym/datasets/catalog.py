"""The catalog of environments and benchmarks (`ng_list_environments`; NeMo Gym 0.7.0's `gym list environments`,
`gym list benchmarks`, `gym search [environments|benchmarks] QUERY`), found as 0.7.0's
`registry.discover_environment_catalog` finds them, under each search root in turn (`--search-dir` /
`$NEMO_GYM_EXTRA_ROOTS`, the working directory, then this repository; a name an earlier root has is kept from it):

- `environments/<name>/`: a `manifest.yaml` of `kind: environment` (its fields listed, status `experimental` unless it
  says `experimental: false`), else a bare `config.yaml` (status `no-manifest`); a folder holding a
  `.nemo_gym_tombstone` is left out;
- `benchmarks/**/`: a `manifest.yaml` of `kind: benchmark`, else each YAML file declaring exactly one `type:
  benchmark` dataset (`benchmarks/<name>/config.yaml` is `<name>`, another file its path without `.yaml`);
- `resources_servers/<folder>/configs/<file>.yaml` whose agents declare datasets: an environment (a benchmark when one
  of them is `type: benchmark`) named `resources_servers/<folder>` (`.../<file>` for a file not named after the folder),
  unless an earlier root or tree has its last name; `gym env start --resources-server <folder>[/<file>]` runs it.

A manifest names itself by its folder (`name` is its path under the tree, `kind` the tree's) and follows 0.7.0's
schema (`nemo_gym.datasets.manifest`). Departure from 0.7.0: a manifest that breaks a rule is left out with a warning
naming the file and the rule on standard error (0.7.0 leaves a bad schema out silently and stops the whole listing for
a wrong name, kind or config path). A config without a manifest shows the first `domain` and `description` its servers
declare, else the ones it inherits through `config_paths` and `_inherit_from`.
"""

from __future__ import annotations

import difflib
import glob
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.prompt_templates import search_roots
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import load_config_file
from nemo_gym.datasets.environments import config_servers, first_metadata, fuzzy_matches, start_command
from nemo_gym.datasets.manifest import load_manifest, manifest_config_path

__all__ = [
    "CatalogEntry",
    "ListBenchmarksOptions",
    "ListEnvironmentsOptions",
    "catalog_entries",
    "list_environments_main",
    "manifest_entry",
    "select_entry",
]

CatalogKind = Literal["environment", "benchmark"]
TOMBSTONE = ".nemo_gym_tombstone"
# the `+key=value` filters, each an exact match on the entry's field (`catalog_kind` is `kind`)
FILTERS = ("domain", "catalog_kind", "modality", "licensing", "status", "lifecycle")


class ListEnvironmentsOptions(BaseModel):
    """Parameters of `ng_list_environments` (0.7.0's `gym list environments` flags)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="show this entry only: its config, manifest fields, servers, datasets")
    query: str | None = Field(None, description="only entries whose name, domain or description match this")
    domain: str | None = Field(None, description="only entries of this domain")
    catalog_kind: CatalogKind | None = Field(None, description="only environments, or only benchmarks")
    modality: str | None = Field(None, description="only entries of this modality (manifest field)")
    licensing: str | None = Field(None, description="only entries of this licensing (manifest field)")
    status: Literal["experimental", "no-manifest"] | None = Field(None, description="only entries of this status")
    lifecycle: Literal["active", "deprecated"] | None = Field(None, description="only entries of this lifecycle")
    json_output: bool = Field(False, alias="json", description="print NeMo Gym 0.7.0's --json payload")


class ListBenchmarksOptions(ListEnvironmentsOptions):
    """Parameters of `ng_list_benchmarks` (0.7.0's `gym list benchmarks`: the catalog's benchmarks)."""

    catalog_kind: Literal["benchmark"] = Field("benchmark", description="benchmarks only")


@dataclass(frozen=True)
class CatalogEntry:
    """One runnable environment or benchmark (0.7.0's `EnvironmentCatalogEntry`, same fields)."""

    name: str
    config_path: Path
    path: Path
    description: str | None = None
    domain: str | None = None
    kind: CatalogKind = "environment"
    status: str | None = "no-manifest"
    manifest_path: Path | None = None
    version: str | None = None
    integration_profile: str | None = None
    modality: str | None = None
    licensing: str | None = None
    lifecycle: str | None = None
    resources_server_selector: str | None = None
    root: Path | None = None  # the search root it was found under (not 0.7.0's: for what its config inherits)

    def listed(self) -> dict[str, Any]:
        """0.7.0's `gym list environments --json` row (no `status` key for a manifest that is not experimental)."""
        fields = ("name", "kind", "status", "domain", "description", "version", "integration_profile")
        row = {key: getattr(self, key) for key in (*fields, "modality", "licensing", "lifecycle")}
        return row if self.status is not None else {k: v for k, v in row.items() if k != "status"}


def config_metadata(config_path: Path, root: Path) -> tuple[str | None, str | None]:
    """(domain, description) of a config: the first its servers declare, each completed from the config merged with
    its `config_paths` (under `root`) and directives when the file declares none (0.7.0's `read_config_metadata`).
    Never raises: an unreadable config gives (None, None)."""
    domain, description = first_metadata(config_servers(config_path))
    if domain is None or description is None:
        try:
            inherited = first_metadata(config_servers(load_config_file(config_path, root)))
        except ConfigError:
            return domain, description
        domain, description = domain or inherited[0], description or inherited[1]
    return domain, description


def _warn(problem: str) -> None:
    print(f"warning: left out of the catalog: {problem}", file=sys.stderr)


def _manifest_entry(tree: Path, manifest_path: Path, kind: CatalogKind) -> CatalogEntry:
    """Raises: ConfigError (a ManifestError for the schema): the manifest's problem, naming it."""
    name = manifest_path.parent.relative_to(tree).as_posix()
    manifest = load_manifest(manifest_path)
    if name == ".":
        raise ConfigError(f"{manifest_path}: a manifest sits in a named folder of {tree}")
    if manifest.kind != kind or manifest.name != name:
        raise ConfigError(
            f"{manifest_path}: declares {manifest.kind} {manifest.name!r}; its folder makes it {kind} {name!r}"
        )
    config_path = manifest_config_path(manifest_path, manifest)
    if not config_path.is_file():
        raise ConfigError(f"{manifest_path}: its config_path {manifest.config_path!r} is no file ({config_path})")
    return CatalogEntry(
        name,
        config_path,
        manifest_path.parent,
        manifest.description,
        manifest.domain.value,
        kind,
        "experimental" if manifest.experimental else None,
        manifest_path,
        manifest.version,
        manifest.integration_profile.value,
        manifest.modality,
        manifest.licensing,
        manifest.lifecycle.value,
        root=tree.parent,
    )


def _benchmark_count(node: Any) -> int:
    if isinstance(node, dict):
        return (node.get("type") == "benchmark") + sum(_benchmark_count(v) for v in node.values())
    return sum(_benchmark_count(v) for v in node) if isinstance(node, list) else 0


def _is_benchmark_config(path: Path) -> bool:
    """A YAML file declaring exactly one `type: benchmark` dataset (an unparseable one counts, as in 0.7.0)."""
    try:
        return path.name != "manifest.yaml" and _benchmark_count(yaml.safe_load(path.read_text(errors="ignore"))) == 1
    except yaml.YAMLError:
        return True


def _bare_configs(tree: Path, kind: CatalogKind) -> list[tuple[str, Path]]:
    """(name, config) of the configs without a manifest of a tree."""
    if kind == "benchmark":
        found = glob.glob("**/*.yaml", root_dir=tree, recursive=True)  # as 0.7.0 finds them: no hidden files
        paths = sorted(tree / p for p in found if _is_benchmark_config(tree / p))
        names = [p.relative_to(tree).with_suffix("").as_posix() for p in paths]
        return [(n.removesuffix("/config") if n.count("/") == 1 else n, p) for n, p in zip(names, paths, strict=True)]
    return [
        (child.name, child / "config.yaml")
        for child in sorted(tree.iterdir())
        if child.is_dir() and (child / "config.yaml").is_file() and not (child / TOMBSTONE).is_file()
    ]


def _tree_entries(root: Path, kind: CatalogKind, claimed: set[tuple[str, str]]) -> dict[tuple[str, str], CatalogEntry]:
    """The entries of `<root>/environments` or `<root>/benchmarks`: manifests first, then bare configs."""
    tree = root / f"{kind}s"
    if not tree.is_dir():
        return {}
    entries: dict[tuple[str, str], CatalogEntry] = {}
    for manifest_path in sorted(tree.rglob("manifest.yaml")):
        relative = manifest_path.relative_to(tree)
        key = (kind, relative.parent.as_posix())
        if key in claimed or (kind == "environment" and (tree / relative.parts[0] / TOMBSTONE).is_file()):
            continue
        try:
            entries[key] = _manifest_entry(tree, manifest_path, kind)
        except ConfigError as exc:  # ManifestError included
            _warn(str(exc))
    with_manifest = {entry.config_path.resolve() for entry in entries.values()}
    for name, config_path in _bare_configs(tree, kind):
        key = (kind, name)
        if key not in claimed and key not in entries and config_path.resolve() not in with_manifest:
            domain, description = config_metadata(config_path, root)
            entries[key] = CatalogEntry(name, config_path, config_path.parent, description, domain, kind, root=root)
    return entries


def _workload(folder: Path, config_path: Path) -> tuple[CatalogKind, str | None, str | None] | None:
    """(kind, domain, description) of a resources server config whose agents declare datasets, else None."""
    servers = config_servers(config_path)
    if not any(group == "resources_servers" for group, _, _ in servers):
        return None
    datasets = [
        d
        for group, _, s in servers
        if group == "responses_api_agents"
        for d in (s.get("datasets") or [])
        if isinstance(d, dict)
    ]
    if not datasets:
        return None
    kind: CatalogKind = "benchmark" if any(d.get("type") == "benchmark" for d in datasets) else "environment"
    return (kind, *first_metadata(servers))


def _workload_entries(root: Path, claimed: set[tuple[str, str]]) -> dict[tuple[str, str], CatalogEntry]:
    """The runnable configs of `<root>/resources_servers/*/configs/` (0.7.0's resource workloads)."""
    tree = root / "resources_servers"
    entries: dict[tuple[str, str], CatalogEntry] = {}
    for config_path in sorted(tree.glob("*/configs/*.yaml")) if tree.is_dir() else ():
        folder = config_path.relative_to(tree).parts[0]
        if (found := _workload(tree / folder, config_path)) is None:
            continue
        kind, domain, description = found
        selector = folder + ("" if config_path.stem == folder else f"/{config_path.stem}")
        key = (kind, f"resources_servers/{selector}")
        if (kind, selector.rsplit("/", 1)[-1]) in claimed or key in claimed or key in entries:
            continue
        entries[key] = CatalogEntry(
            key[1], config_path, tree / folder, description, domain, kind, resources_server_selector=selector, root=root
        )
    return entries


def catalog_entries(roots: list[Path] | None = None) -> tuple[CatalogEntry, ...]:
    """Every environment and benchmark under `roots` (default: the search roots, then this repository), sorted by
    name (ignoring case) then kind, as 0.7.0 sorts its catalog."""
    entries: dict[tuple[str, str], CatalogEntry] = {}
    seen: set[Path] = set()
    for root in roots if roots is not None else [*search_roots(), REPO_ROOT]:
        if root.resolve() in seen:
            continue
        seen.add(root.resolve())
        for kind in ("environment", "benchmark"):
            entries |= _tree_entries(root, kind, set(entries))
        entries |= _workload_entries(root, set(entries))
    return tuple(sorted(entries.values(), key=lambda e: (e.name.casefold(), e.name, e.kind)))


def _details(entry: CatalogEntry) -> tuple[dict[str, str], str | None, str | None]:
    """(details, domain, description) of the inspect view (0.7.0's `_inspect_environment`)."""
    servers = config_servers(entry.config_path)
    details = {"config": str(entry.config_path.resolve())}
    details |= {"status": entry.status} if entry.status is not None else {}
    details |= {"manifest": str(entry.manifest_path.resolve())} if entry.manifest_path is not None else {}
    labels = ("version", "profile", "modality", "licensing", "lifecycle")
    values = (entry.version, entry.integration_profile, entry.modality, entry.licensing, entry.lifecycle)
    details |= {label: value for label, value in zip(labels, values, strict=True) if value}
    resources = [name for group, name, _ in servers if group == "resources_servers"]
    agents = [(name, s) for group, name, s in servers if group == "responses_api_agents"]
    datasets = [
        str(d["name"]) for _, s in agents for d in s.get("datasets") or [] if isinstance(d, dict) and d.get("name")
    ]
    details |= {"resources servers": ", ".join(resources)} if resources else {}
    details |= {"agent": agents[0][0]} if agents else {}
    details |= {"datasets": ", ".join(datasets)} if datasets else {}
    domain, description = config_metadata(entry.config_path, entry.root or entry.config_path.parent)
    value = next((str(s["value"]) for group, _, s in servers if group == "resources_servers" and s.get("value")), None)
    description = entry.description or description
    if value:
        description = f"{description}\nValue: {value}" if description else f"Value: {value}"
    return details, entry.domain or domain, description


def _show(entry: CatalogEntry, as_json: bool) -> None:
    details, domain, description = _details(entry)
    usage = (
        f"gym env start --resources-server {entry.resources_server_selector} --model-type vllm_model"
        if entry.resources_server_selector
        else f"gym env start --{entry.kind} {entry.name} --model-type vllm_model"
    )
    if as_json:
        shown = {"name": entry.name, "type": entry.kind, "domain": domain, "description": description}
        print(json.dumps({**shown, "details": details, "usage_example": usage}))
        return
    print(f"The {entry.name} {entry.kind}" + (f" (domain: {domain})" if domain else ""))
    print(*[description] if description else [], *(f"{label}: {value}" for label, value in details.items()), sep="\n")
    print(f"start it: {start_command(entry.config_path)}", f"      or: {usage}", sep="\n")


def select_entry(name: str, entries: tuple[CatalogEntry, ...], kind: str | None, *, key: str = "+name") -> CatalogEntry:
    """The entry of `entries` named `name` (of `kind`, when given); errors name the parameter `key`.

    Raises:
        ConfigError: no entry of that name and kind (naming the other kind's, or the closest names), or the name is
            both an environment and a benchmark and no kind was given.
    """
    matches = [e for e in entries if e.name == name and kind in (None, e.kind)]
    if len(matches) > 1:
        raise ConfigError(f"{key}: {name!r} is an environment and a benchmark; add +catalog_kind=environment|benchmark")
    if matches:
        return matches[0]
    if other := next((e for e in entries if e.name == name), None):
        shown = f"ng_list_environments +name={name} shows it"
        article = "an" if other.kind == "environment" else "a"
        raise ConfigError(f"{key}: {name!r} is {article} {other.kind}, not a {kind}; {shown}")
    names = [e.name for e in entries if kind in (None, e.kind)]
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"{key}: unknown {kind or 'environment'} {name!r}{hint}; ng_list_environments lists them")


def manifest_entry(name: str, kind: str | None = None) -> CatalogEntry:
    """The catalog entry `name` (of `kind`, when both kinds have the name) that has a manifest; a misspelt name gets
    the closest names of entries with one.

    Raises:
        ConfigError: no such entry (as `select_entry`), or one without a manifest.
    """
    entries = catalog_entries()
    try:
        return select_entry(name, tuple(e for e in entries if e.manifest_path), kind, key="+onboarding_name")
    except ConfigError:
        if any(e.name == name and kind in (None, e.kind) for e in entries):
            raise ConfigError(
                f"{name!r} has no manifest; validate its config: ng_validate +config_paths=[...]"
            ) from None
        raise


def list_environments_main(options: ListEnvironmentsOptions) -> int:
    """`ng_list_environments`: the catalog filtered by the options, as a table or JSON, or one entry. Returns 0.

    Raises:
        ConfigError: `+name` names no entry (see `select_entry`).
    """
    catalog = catalog_entries()
    if options.name is not None:
        _show(select_entry(options.name, catalog, options.catalog_kind), options.json_output)
        return 0
    entries = list(catalog)
    if options.query:
        entries = [e for e in entries if fuzzy_matches(options.query, e.name, e.domain, e.description)]
    for field in FILTERS:
        if (wanted := getattr(options, field)) is not None:
            attribute = "kind" if field == "catalog_kind" else field
            if field != "status" and (missing := sum(getattr(e, attribute) is None for e in entries)):
                print(f"warning: {missing} catalog entries have no {attribute} and cannot match it", file=sys.stderr)
            entries = [e for e in entries if getattr(e, attribute) == wanted]
    if options.json_output:
        print(json.dumps([e.listed() for e in entries]))
        return 0
    noun = {"environment": "environments", "benchmark": "benchmarks"}.get(options.catalog_kind or "", "entries")
    if not entries:
        matching = f" matching {options.query!r}" if options.query else ""
        print(f"No {noun} found{matching} (environments/, benchmarks/ and resources_servers/ under the search roots)")
        return 0
    manifests = sum(e.manifest_path is not None for e in catalog)
    print(f"Catalog {noun} ({len(entries)}; manifests {manifests}/{len(catalog)}); +name=<name> shows one")
    rows = [(e.name, e.kind, e.status or "", e.lifecycle or "", e.domain or "", e.description or "") for e in entries]
    widths = [max(len(r[i]) for r in [("Name", "Kind", "Status", "Lifecycle", "Domain", ""), *rows]) for i in range(5)]
    for row in [("Name", "Kind", "Status", "Lifecycle", "Domain", "Description"), *rows]:
        print("  ".join([*(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False)), row[5]]))
    return 0
