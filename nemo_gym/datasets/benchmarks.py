"""NeMo Gym 0.7.0's benchmark folders read by `ng_list_benchmarks` (`gym list benchmarks`) and refused, with the
reason, by `ng_prepare_benchmark` (`gym eval prepare`).

A benchmark is a folder `benchmarks/<name>/` (or nested, `benchmarks/<name>/<flavor>/`) holding a `manifest.yaml` of
`kind: benchmark` whose `name` is that relative path and whose `config_path` (default `config.yaml`, next to it)
exists, under the search roots (`--search-dir` / `$NEMO_GYM_EXTRA_ROOTS`, then the current directory; the first root
that has a name wins). Each is listed with the fields 0.7.0's `gym list benchmarks --json` prints for it.

Departures from 0.7.0: we ship no benchmark folders (0.7.0 also searches its install root, where its 122 are), so
point `--search-dir` at a NeMo Gym checkout or wheel; the catalog entries 0.7.0 makes without a manifest (a bare
`config.yaml`, status `no-manifest`, and benchmark datasets of `resources_servers/*/configs/*.yaml`) and its
inspect view (`gym list benchmarks <name>`) are not offered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.prompt_templates import search_roots
from nemo_gym.common.errors import ConfigError

__all__ = ["ListBenchmarksOptions", "PrepareBenchmarkOptions", "benchmark_entries", "list_benchmarks_main"]

PAYLOAD_FIELDS = (
    "name",
    "kind",
    "status",
    "domain",
    "description",
    "version",
    "integration_profile",
    "modality",
    "licensing",
    "lifecycle",
)


class ListBenchmarksOptions(BaseModel):
    """Parameters of `ng_list_benchmarks`."""

    model_config = ConfigDict(extra="forbid")
    json_output: bool = Field(False, alias="json", description="print the entries as JSON (0.7.0's --json)")
    query: str | None = Field(None, description="only entries whose name, domain or description contain this text")


class PrepareBenchmarkOptions(BaseModel):
    """Parameters of `ng_prepare_benchmark` (it runs nothing: see `prepare_benchmark_main`)."""

    model_config = ConfigDict(extra="allow")
    config_paths: list[str] = Field(
        default_factory=list, description="the benchmark's config (benchmarks/<name>/config.yaml)"
    )


def _manifest_entry(tree: Path, manifest_path: Path) -> dict[str, Any] | None:
    """The catalog entry of one manifest, or None where 0.7.0 skips it (unreadable, another kind, a name that is not
    its path, a missing config)."""
    try:
        manifest = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, yaml.YAMLError):
        return None
    name = manifest_path.parent.relative_to(tree).as_posix()
    if not isinstance(manifest, dict) or manifest.get("kind") != "benchmark" or manifest.get("name") != name:
        return None
    config = manifest_path.parent / str(manifest.get("config_path") or "config.yaml")
    if not config.is_file():
        return None
    entry = {key: manifest.get(key) for key in PAYLOAD_FIELDS}
    entry["status"] = "experimental" if manifest.get("experimental") else None
    if entry["status"] is None:
        del entry["status"]
    return entry


def benchmark_entries(roots: list[Path] | None = None) -> list[dict[str, Any]]:
    """Every manifest-backed benchmark under `roots` (default `search_roots()`), sorted by name as 0.7.0 sorts."""
    entries: dict[str, dict[str, Any]] = {}
    for root in search_roots() if roots is None else roots:
        tree = root / "benchmarks"
        if not tree.is_dir():
            continue
        for manifest_path in sorted(tree.rglob("manifest.yaml")):
            entry = _manifest_entry(tree, manifest_path)
            if entry is not None:
                entries.setdefault(entry["name"], entry)
    return sorted(entries.values(), key=lambda e: (e["name"].casefold(), e["name"]))


def _matches(entry: dict[str, Any], query: str) -> bool:
    text = " ".join(str(entry.get(k) or "") for k in ("name", "domain", "description")).casefold()
    return query.casefold() in text


def list_benchmarks_main(options: ListBenchmarksOptions) -> int:
    """`ng_list_benchmarks`: the benchmarks as a table, or as 0.7.0's JSON with `+json=true`. Returns 0."""
    entries = benchmark_entries()
    if options.query:
        entries = [e for e in entries if _matches(e, options.query)]
    if options.json_output:
        print(json.dumps(entries))
        return 0
    if not entries:
        roots = ", ".join(str(r / "benchmarks") for r in search_roots())
        print(f"No benchmarks found (looked for benchmarks/**/manifest.yaml in {roots}; add roots with --search-dir)")
        return 0
    width = max(len(e["name"]) for e in entries)
    print(f"Available benchmarks ({len(entries)})")
    print(f"{'Name':<{width}}  {'Status':<12}  {'Lifecycle':<10}  {'Domain':<22}  Description")
    for e in entries:
        print(
            f"{e['name']:<{width}}  {e.get('status') or '':<12}  {e.get('lifecycle') or '':<10}  "
            f"{e.get('domain') or '':<22}  {e.get('description') or ''}"
        )
    return 0


def prepare_benchmark_main(argv: list[str]) -> int:
    """`ng_prepare_benchmark`: not supported; always raises.

    Raises:
        ConfigError: naming what 0.7.0 does here and why we do not.
    """
    raise ConfigError(
        "not supported: NeMo Gym 0.7.0's prepare_benchmark runs the benchmark's own prepare.py, which imports NeMo Gym"
        " 0.7.0's internals and downloads the data from the network (Hugging Face and others); nemo_gym ships no"
        " benchmark folders and runs no third-party prepare scripts. Prepare the data with NeMo Gym 0.7.0"
        " (`gym eval prepare --benchmark NAME`), then use the JSONL it writes with ng_collect_rollouts or ng_eval."
    )
