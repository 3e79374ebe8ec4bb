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
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.prompt_templates import search_roots
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT

__all__ = ["EnvironmentsOptions", "ResourcesServerEntry", "environments_main", "resources_server_entries"]

# where a server's metadata may sit (0.7.0's discovery._SERVER_GROUP_KEYS)
SERVER_GROUPS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")


class EnvironmentsOptions(BaseModel):
    """Parameters of `ng_environments`."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="show this environment only (its config file and how to start it)")
    query: str | None = Field(
        None, description="only environments whose name, domain or description match this (0.7.0's gym search)"
    )
    json_output: bool = Field(False, alias="json", description="print JSON (NeMo Gym 0.7.0's --json payload)")


@dataclass(frozen=True)
class ResourcesServerEntry:
    name: str
    config_path: Path
    domain: str | None
    description: str | None

    def listed(self) -> dict[str, Any]:
        return {"name": self.name, "domain": self.domain, "description": self.description}


def _servers(config: Any) -> list[tuple[str, dict[str, Any]]]:
    """(group, server section) of every server of every instance of a config file's mapping."""
    found = []
    for instance in config.values() if isinstance(config, dict) else ():
        for group in SERVER_GROUPS if isinstance(instance, dict) else ():
            sections = instance.get(group)
            found += [
                (group, s) for s in (sections.values() if isinstance(sections, dict) else ()) if isinstance(s, dict)
            ]
    return found


def _entry(folder: Path, config_path: Path) -> ResourcesServerEntry | None:
    """The entry of one config file, or None when it declares no resources server (or is no YAML mapping)."""
    try:
        servers = _servers(yaml.safe_load(config_path.read_text(encoding="utf-8")))
    except (OSError, UnicodeError, yaml.YAMLError):
        return None
    if not any(group == "resources_servers" for group, _ in servers):
        return None
    domain = next((str(s["domain"]) for _, s in servers if s.get("domain")), None)
    description = next((str(s["description"]) for _, s in servers if s.get("description")), None)
    name = folder.name if config_path.stem == folder.name else f"{folder.name}/{config_path.stem}"
    return ResourcesServerEntry(name, config_path, domain, description)


def resources_server_entries(roots: list[Path] | None = None) -> dict[str, ResourcesServerEntry]:
    """name -> entry of every environment under `roots` (default: the search roots, then this repository), in each
    root's folder order; a name an earlier root has is kept from it."""
    entries: dict[str, ResourcesServerEntry] = {}
    for root in roots if roots is not None else [*search_roots(), REPO_ROOT]:
        tree = root / "resources_servers"
        for folder in sorted(tree.iterdir()) if tree.is_dir() else ():
            for config_path in sorted((folder / "configs").glob("*.yaml")) if folder.is_dir() else ():
                entry = _entry(folder, config_path)
                if entry is not None:
                    entries.setdefault(entry.name, entry)
    return entries


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


def _show_one(entry: ResourcesServerEntry, as_json: bool) -> None:
    usage = f"gym env start --resources-server {entry.name} --model-type vllm_model"
    config = str(entry.config_path.resolve())
    if as_json:  # 0.7.0's render_component_inspection payload
        payload = {"name": entry.name, "type": "resources server", **entry.listed(), "details": {"config": config}}
        print(json.dumps({**payload, "usage_example": usage}))
        return
    print(f"The {entry.name} resources server" + (f" (domain: {entry.domain})" if entry.domain else ""))
    if entry.description:
        print(entry.description)
    print(f"config: {config}")
    model = REPO_ROOT / "responses_api_models" / "vllm_model" / "configs" / "vllm_model.yaml"
    print(f"start it: ng_run +config_paths=[{config},{model}]")
    print(f"      or: {usage}")


def environments_main(options: EnvironmentsOptions) -> int:
    """`ng_environments`: the environments as a table (or JSON), or one of them. Returns 0.

    Raises:
        ConfigError: `+name` names no environment (the closest names are suggested).
    """
    entries = resources_server_entries()
    if options.name is not None:
        if options.name not in entries:
            close = difflib.get_close_matches(options.name, list(entries), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"+name: unknown environment {options.name!r}{hint}; ng_environments lists them")
        _show_one(entries[options.name], options.json_output)
        return 0
    if options.query:
        entries = {n: e for n, e in entries.items() if fuzzy_matches(options.query, n, e.domain, e.description)}
    if options.json_output:
        print(json.dumps([e.listed() for e in entries.values()]))
        return 0
    if not entries:
        matching = f" matching {options.query!r}" if options.query else ""
        print(f"No environments found{matching} (resources_servers/*/configs/*.yaml under the search roots)")
        return 0
    width = max(len(name) for name in entries)
    print(f"Environments ({len(entries)}); +name=<name> shows one")
    print(f"{'Name':<{width}}  {'Domain':<22}  Description")
    for name, e in entries.items():
        print(f"{name:<{width}}  {e.domain or '':<22}  {e.description or ''}")
    return 0
