"""`ng_validate` (NeMo Gym 0.7.0's `gym env validate`): a config checked as `ng_run` checks it before starting
anything (files, YAML, `${...}` values, server types, implementation folders and entrypoints, references between
instances, ng_run's own keys), without starting a server.

As 0.7.0: a config that only lacks values supplied at run time (`???`, an unresolved `${...}`, typically the policy
model's) is reported with a warning and passes, unless `+strict=true`; prints `✓ Config is valid.` and exits 0.
Departure: 0.7.0's manifest-backed workloads (`gym env validate NAME`, `--manifest`, `--kind`, `--sync`, `--json`)
need its environment catalog and manifest schema, which we do not have: those options are refused by name.
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config, parse_overrides, validation_problems
from nemo_gym.config.server_instances import server_instances
from nemo_gym.orchestration.run import RunOptions

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


def validate_main(argv: list[str]) -> int:
    """`ng_validate`. Returns 0 when the config is valid.

    Raises:
        ConfigError: the config is invalid (the message names the file and key), or a manifest option was given.
    """
    argv, strict = _strict(argv)
    manifest = sorted({key.lstrip("+") for key, _ in parse_overrides(argv)} & set(MANIFEST_KEYS))
    if manifest:
        raise ConfigError(
            f"not supported: {', '.join('+' + k for k in manifest)} select NeMo Gym 0.7.0's manifest validation (the"
            " manifest checked against its resolved composition, datasets and profile), which nemo_gym does not"
            " offer; ng_list_environments +name=NAME shows a catalog entry's config: validate it with"
            " +config_paths=[...]"
        )
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
    try:
        RunOptions.model_validate(loaded.values)
    except ValidationError as exc:
        raise ConfigError("; ".join(validation_problems(RunOptions, exc, "+{key}"))) from exc
    print("✓ Config is valid.")
    return 0
