"""`ng_validate` (NeMo Gym 0.7.0's `gym env validate`): a config checked as `ng_run` checks it before starting
anything (files, YAML, `${...}` values, server types, implementation folders and entrypoints, references between
instances, ng_run's own keys), without starting a server.

As 0.7.0: a config that only lacks values supplied at run time (`???`, an unresolved `${...}`, typically the policy
model's) is reported with a warning and passes, unless `+strict=true`; prints `✓ Config is valid.` and exits 0.
A catalog entry's manifest (`gym env validate NAME` / `--manifest PATH`: `+onboarding_name=NAME` with
`+catalog_kind`, or `+manifest_path=PATH`; `+sync=true`, `+json=true`) is checked against its config and data instead
(`nemo_gym.datasets.manifest_checks`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config, parse_overrides
from nemo_gym.config.server_instances import server_instances
from nemo_gym.datasets.catalog import manifest_entry
from nemo_gym.datasets.manifest_checks import validate_manifest
from nemo_gym.orchestration.run import run_options

__all__ = ["MANIFEST_KEYS", "validate_main"]

# 0.7.0's options of a manifest-backed validation (its `ManifestCommandConfig`), with what each selects
MANIFEST_KEYS = ("onboarding_name", "manifest_path", "catalog_kind", "sync", "json", "update_expected")


def _strict(argv: list[str]) -> tuple[list[str], bool]:
    """`argv` without `+strict=...`, and its value."""
    strict = False
    rest = []
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "strict":
            strict = value.lower() in ("true", "1", "yes")
        else:
            rest.append(arg)
    return rest, strict


def _stand_ins(argv: list[str]) -> list[str]:
    """Overrides for the model keys the config lacks (0.7.0's `NO_MODEL_GLOBAL_CONFIG_DICT`: empty policy values and a
    `policy_model` instance; ours an external one, which starts nothing and needs no folder)."""
    values = load_config(argv, resolve=False).values  # a missing file or bad YAML is raised as is
    stand_ins = {
        "policy_base_url": "+policy_base_url=",
        "policy_api_key": "+policy_api_key=",
        "policy_model_name": "+policy_model_name=",
        "policy_model": "+policy_model.responses_api_models.openai_model.url=http://127.0.0.1:9",
    }
    return [override for key, override in stand_ins.items() if key not in values]


def _validate_manifest(given: dict[str, Any]) -> int:
    """A manifest checked against its config and data (`nemo_gym.datasets.manifest_checks`), named by its catalog
    name (`+onboarding_name`, `+catalog_kind` when both kinds have it) or its path (`+manifest_path`)."""
    extra = sorted(set(given) - {"onboarding_name", "catalog_kind", "manifest_path", "sync", "json", "strict"})
    if extra:
        raise ConfigError(f"a manifest's validation takes no config overrides: {', '.join('+' + k for k in extra)}")
    if "onboarding_name" in given and "manifest_path" in given:
        raise ConfigError("name a catalog entry or +manifest_path, not both")
    path = (
        given.get("manifest_path")
        or manifest_entry(str(given["onboarding_name"]), given.get("catalog_kind")).manifest_path
    )
    report = validate_manifest(Path(str(path)), sync=str(given.get("sync", "")).lower() == "true")
    if str(given.get("json", "")).lower() == "true":
        print(json.dumps(asdict(report)))
        return 0
    print(f"✓ Manifest: {report.name} {report.version} kind={report.kind} profile={report.profile} (declared)")
    print("✓ Components:", *(f"    {role}: {name} -> {impl}" for role, name, impl in report.components), sep="\n")
    print("✓ Datasets:", *(f"    {name}: {rows} rows ({kind})" for name, kind, rows in report.datasets), sep="\n")
    if report.synchronized:
        print(f"✓ Synchronized: {', '.join(report.synchronized)}")
    return 0


def validate_main(argv: list[str]) -> int:
    """`ng_validate`. Returns 0 when the config is valid.

    Raises:
        ConfigError: the config is invalid (the message names the file and key), or a manifest option was given.
    """
    argv, strict = _strict(argv)
    given = dict(parse_overrides(argv))
    if "onboarding_name" in given or "manifest_path" in given:
        return _validate_manifest(given)
    manifest = sorted(set(given) & set(MANIFEST_KEYS))
    if manifest:
        raise ConfigError(f"{', '.join('+' + k for k in manifest)} apply to a catalog name or +manifest_path only")
    try:
        server_instances(loaded := load_config(argv))
    except ConfigError as exc:
        stand_ins = [] if strict else _stand_ins(argv)
        if not stand_ins:
            raise
        server_instances(loaded := load_config([*argv, *stand_ins]))  # another error is raised as is
        print(
            "Warning: this config does not define model server configuration and will not start as-is (+strict=true"
            f" fails on this instead).\n{exc}",
            file=sys.stderr,
        )
    run_options(loaded)  # ng_run's own keys
    print("✓ Config is valid.")
    return 0
