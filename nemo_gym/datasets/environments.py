"""The environments a run can use (`ng_environments`; NeMo Gym 0.7.0's `gym list resources-servers`): one entry per
config file `resources_servers/<folder>/configs/<file>.yaml` that declares a `resources_servers` section, named
`<folder>` for `<folder>.yaml` and `<folder>/<file>` for the others (0.7.0's names: `gym env start
--resources-server <name>` takes them), with the `domain` and `description` its server sections declare (the first
of each, as 0.7.0 reads them), under the search roots (`--search-dir` / `$NEMO_GYM_EXTRA_ROOTS`, the working
directory) and then this repository; the first root that has a name wins, so a project's environment shadows ours.

`+name=<environment>` shows one (its config file and how to start it); `+query=<text>` keeps those whose name, domain
or description match it as 0.7.0's `gym search resources-servers` matches (a substring, or a close word); `+json=true`
prints 0.7.0's JSON (the list:
`[{name, domain, description}]`; one: `{name, type, domain, description, details: {config}, usage_example}`).
Departure from 0.7.0: a config that inherits its domain or description (`config_paths`, `_inherit_from`) shows what
it declares itself (0.7.0 resolves the config for them); our environments declare theirs.

`+kind=agents` lists the agents instead (0.7.0's `gym list agents`, `agent_registry`): one per folder
`responses_api_agents/<name>/` with an `app.py` or a config declaring `responses_api_agents`, its configs' stems as
variants, composable (it names a `resources_server` and no `agent_framework` or `anthropic_api_key`: wired to a
resources server) or self-contained, and its first `description`. `+kind=models` lists the model servers (0.7.0's
`gym list models`, `model_registry`): one per `responses_api_models/<group>/configs/<flavor>.yaml`, named `<group>`
for `<group>.yaml` and `<group>/<flavor>` for the others (what `gym env start --model-type` takes).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.prompt_templates import search_roots
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT

__all__ = [
    "AgentEntry",
    "EnvironmentsOptions",
    "ModelEntry",
    "ResourcesServerEntry",
    "agent_entries",
    "config_servers",
    "environments_main",
    "first_metadata",
    "start_command",
    "fuzzy_matches",
    "model_entries",
    "resources_server_entries",
]

# where a server's metadata may sit (0.7.0's discovery._SERVER_GROUP_KEYS)
SERVER_GROUPS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
Kind = Literal["resources_servers", "agents", "models"]


class EnvironmentsOptions(BaseModel):
    """Parameters of `ng_environments`."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="show this one only (its config file and how to start it)")
    query: str | None = Field(
        None, description="only those whose name, domain or description match this (0.7.0's gym search)"
    )
    json_output: bool = Field(False, alias="json", description="print JSON (NeMo Gym 0.7.0's --json payload)")
    kind: Kind = Field(
        "resources_servers",
        description="what to list: the environments (resources servers), the agents or the model servers",
    )


def _inspection(
    name: str, noun: str, details: dict[str, str], *, domain: str | None = None, description: str | None = None
) -> dict[str, Any]:
    """0.7.0's `render_component_inspection` JSON payload (`gym list <kind> NAME --json`), without its usage."""
    return {
        "name": name,
        "type": noun,
        "domain": domain,
        "description": description,
        "details": details,
        "usage_example": None,
    }


@dataclass(frozen=True)
class ResourcesServerEntry:
    name: str
    config_path: Path
    domain: str | None
    description: str | None

    columns = ("Name", "Domain", "Description")

    def listed(self) -> dict[str, Any]:  # 0.7.0's `gym list resources-servers --json` row
        return {"name": self.name, "domain": self.domain, "description": self.description}

    def row(self) -> tuple[str, ...]:
        return self.name, self.domain or "", self.description or ""

    def searched(self) -> tuple[str | None, ...]:
        return self.name, self.domain, self.description

    def shown(self) -> dict[str, Any]:
        details = {"config": str(self.config_path.resolve())}
        shown = _inspection(self.name, "resources server", details, domain=self.domain, description=self.description)
        return {**shown, "usage_example": f"gym env start --resources-server {self.name} --model-type vllm_model"}

    def start_with(self) -> str:
        return start_command(self.config_path)


@dataclass(frozen=True)
class AgentEntry:
    name: str
    path: Path
    variants: tuple[str, ...]
    self_contained: bool
    description: str | None

    columns = ("Agent", "Composition", "Variants", "Description")

    @property
    def composition(self) -> str:
        return "self-contained (B)" if self.self_contained else "composable (A)"

    def listed(self) -> dict[str, Any]:  # 0.7.0's `gym list agents --json` row
        return {
            "name": self.name,
            "pattern": "B (self-contained)" if self.self_contained else "A (composable)",
            "self_contained": self.self_contained,
            "variants": sorted(self.variants),
            "description": self.description,
        }

    def row(self) -> tuple[str, ...]:
        return self.name, self.composition, ", ".join(sorted(self.variants)) or "-", self.description or ""

    def searched(self) -> tuple[str | None, ...]:
        return self.name, self.description, *self.variants

    def shown(self) -> dict[str, Any]:
        details = {"path": str(self.path.resolve()), "composition": self.composition}
        details |= {"variants": ", ".join(sorted(self.variants))} if self.variants else {}
        return _inspection(self.name, "agent", details, description=self.description)

    def start_with(self) -> str | None:
        return None


@dataclass(frozen=True)
class ModelEntry:
    name: str
    model_group: str
    config_path: Path

    columns = ("Model", "Model group")

    def listed(self) -> dict[str, Any]:  # 0.7.0's `gym list models --json` row
        return {"name": self.name, "model": self.name, "model_group": self.model_group}

    def row(self) -> tuple[str, ...]:
        return self.name, self.model_group

    def searched(self) -> tuple[str | None, ...]:
        return self.name, self.model_group

    def shown(self) -> dict[str, Any]:
        shown = _inspection(self.name, "model", {"config": str(self.config_path.resolve())})
        usage = f"gym env start --resources-server example_single_tool_call --model-type {self.name}"
        return {**shown, "usage_example": usage}

    def start_with(self) -> str | None:
        return None


Entry = ResourcesServerEntry | AgentEntry | ModelEntry


def start_command(config_path: Path) -> str:
    """The `ng_run` command that starts a config with this repository's vLLM model server."""
    model = REPO_ROOT / "responses_api_models" / "vllm_model" / "configs" / "vllm_model.yaml"
    return f"ng_run +config_paths=[{config_path.resolve()},{model}]"


def config_servers(config: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(group, server name, server section) of every server of every instance of a parsed config, or of the config
    file at a `Path` (none when it is no YAML mapping), as 0.7.0's `discovery.iter_server_configs` walks them."""
    if isinstance(config, Path):
        try:
            config = yaml.safe_load(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeError, yaml.YAMLError):
            return []
    found = []
    for instance in config.values() if isinstance(config, dict) else ():
        for group in SERVER_GROUPS if isinstance(instance, dict) else ():
            sections = instance.get(group)
            found += [
                (group, str(name), s)
                for name, s in (sections.items() if isinstance(sections, dict) else ())
                if isinstance(s, dict)
            ]
    return found


def first_metadata(servers: list[tuple[str, str, dict[str, Any]]]) -> tuple[str | None, str | None]:
    """(domain, description): the first non-empty of each among `servers` (0.7.0's `_scan_servers_for_metadata`)."""
    domain = next((str(s["domain"]) for _, _, s in servers if s.get("domain")), None)
    description = next((str(s["description"]) for _, _, s in servers if s.get("description")), None)
    return domain, description


def _folders(subdir: str, roots: Sequence[Path] | None) -> list[Path]:
    """The folders of `<root>/<subdir>/` under `roots` (default: the search roots, then this repository), in order."""
    return [
        folder
        for root in (roots if roots is not None else [*search_roots(), REPO_ROOT])
        if (root / subdir).is_dir()
        for folder in sorted((root / subdir).iterdir())
        if folder.is_dir()
    ]


def _config_name(folder: Path, config_path: Path) -> str:
    """0.7.0's name of a folder's config: `<folder>` for `<folder>.yaml`, `<folder>/<file>` for the others."""
    return folder.name if config_path.stem == folder.name else f"{folder.name}/{config_path.stem}"


def _resources_server(folder: Path, config_path: Path) -> ResourcesServerEntry | None:
    """The entry of one config file, or None when it declares no resources server."""
    servers = config_servers(config_path)
    if not any(group == "resources_servers" for group, _, _ in servers):
        return None
    domain, description = first_metadata(servers)
    return ResourcesServerEntry(_config_name(folder, config_path), config_path, domain, description)


def _agent(folder: Path) -> AgentEntry | None:
    """The agent of one `responses_api_agents/<name>/` folder, or None when it has neither `app.py` nor a config
    declaring `responses_api_agents` (as 0.7.0's `agent_registry` decides)."""
    blocks: dict[Path, list[dict[str, Any]]] = {}
    for config_path in sorted((folder / "configs").glob("*.yaml")):
        if found := [s for group, _, s in config_servers(config_path) if group == "responses_api_agents"]:
            blocks[config_path] = found
    if not (folder / "app.py").is_file() and not blocks:
        return None
    every = [block for found in blocks.values() for block in found]
    composable = any("resources_server" in b for b in every) and not any(
        key in b for b in every for key in ("agent_framework", "anthropic_api_key")
    )
    description = next((b["description"] for b in every if isinstance(b.get("description"), str)), None)
    return AgentEntry(folder.name, folder, tuple(p.stem for p in blocks), bool(every) and not composable, description)


def resources_server_entries(roots: Sequence[Path] | None = None) -> dict[str, ResourcesServerEntry]:
    """name -> entry of every environment under `roots` (default: the search roots, then this repository), in each
    root's folder order; a name an earlier root has is kept from it."""
    entries: dict[str, ResourcesServerEntry] = {}
    for folder in _folders("resources_servers", roots):
        for config_path in sorted((folder / "configs").glob("*.yaml")):
            if (entry := _resources_server(folder, config_path)) is not None:
                entries.setdefault(entry.name, entry)
    return entries


def agent_entries(roots: Sequence[Path] | None = None) -> dict[str, AgentEntry]:
    """name -> entry of every agent under `roots` (as `resources_server_entries`); an earlier root's name wins."""
    entries: dict[str, AgentEntry] = {}
    for folder in _folders("responses_api_agents", roots):
        if (entry := _agent(folder)) is not None:
            entries.setdefault(entry.name, entry)
    return entries


def model_entries(roots: Sequence[Path] | None = None) -> dict[str, ModelEntry]:
    """name -> entry of every model server config under `roots`; an earlier root's name wins."""
    entries: dict[str, ModelEntry] = {}
    for folder in _folders("responses_api_models", roots):
        for config_path in sorted((folder / "configs").glob("*.yaml")):
            entries.setdefault(
                _config_name(folder, config_path),
                ModelEntry(_config_name(folder, config_path), folder.name, config_path),
            )
    return entries


# kind -> (its entries, its noun, where they are found)
KINDS: dict[str, tuple[Callable[[], dict[str, Any]], str, str]] = {
    "resources_servers": (resources_server_entries, "environment", "resources_servers/*/configs/*.yaml"),
    "agents": (agent_entries, "agent", "responses_api_agents/*/"),
    "models": (model_entries, "model", "responses_api_models/*/configs/*.yaml"),
}


def fuzzy_matches(query: str, *fields: str | None) -> bool:
    """Whether `query` matches one of `fields` as NeMo Gym 0.7.0's `gym search` matches (`cli.utils.fuzzy_matches`):
    a substring of it, ignoring case, or a close match (difflib, cutoff 0.7) to it or to one of its words."""
    needle = query.lower()
    for text in filter(None, fields):
        haystack = text.lower()
        words = haystack.replace("_", " ").replace("-", " ").split()
        if needle in haystack or difflib.get_close_matches(needle, [haystack, *words], n=1, cutoff=0.70):
            return True
    return False


def _show_one(entry: Entry, as_json: bool) -> None:
    shown = entry.shown()
    if as_json:
        print(json.dumps(shown))
        return
    print(f"The {entry.name} {shown['type']}" + (f" (domain: {shown['domain']})" if shown["domain"] else ""))
    if shown["description"]:
        print(shown["description"])
    for label, value in shown["details"].items():
        print(f"{label}: {value}")
    if start := entry.start_with():
        print(f"start it: {start}")
    if shown["usage_example"]:
        print(f"{'      or' if start else 'use it'}: {shown['usage_example']}")


def _table(entries: dict[str, Entry], title: str) -> None:
    rows = [entry.row() for entry in entries.values()]
    columns = next(iter(entries.values())).columns
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows, strict=False)][:-1]
    print(title)
    for cells in (columns, *rows):
        print("  ".join([*(f"{cell:<{width}}" for cell, width in zip(cells, widths, strict=False)), cells[-1]]))


def environments_main(options: EnvironmentsOptions) -> int:
    """`ng_environments`: the environments (or `+kind`'s agents or model servers) as a table (or JSON), or one of
    them. Returns 0.

    Raises:
        ConfigError: `+name` names none of them (the closest names are suggested).
    """
    find, noun, where = KINDS[options.kind]
    entries = find()
    command = "ng_environments" + ("" if options.kind == "resources_servers" else f" +kind={options.kind}")
    if options.name is not None:
        if options.name not in entries:
            close = difflib.get_close_matches(options.name, list(entries), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"+name: unknown {noun} {options.name!r}{hint}; {command} lists them")
        _show_one(entries[options.name], options.json_output)
        return 0
    if options.query:
        entries = {n: e for n, e in entries.items() if fuzzy_matches(options.query, *e.searched())}
    if options.json_output:
        print(json.dumps([e.listed() for e in entries.values()]))
        return 0
    if not entries:
        matching = f" matching {options.query!r}" if options.query else ""
        print(f"No {noun}s found{matching} ({where} under the search roots)")
        return 0
    _table(entries, f"{noun.capitalize()}s ({len(entries)}); {command} +name=<name> shows one")
    return 0
