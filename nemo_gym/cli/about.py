"""The commands about nemo_gym itself: `ng_help` (the commands), `ng_version` (its version and its main
dependencies'), `ng_dump_config` (a config as `ng_run` would resolve it)."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.config import load_config, mask_secrets
from nemo_gym.config.commands import COMMANDS, NoOptions

__all__ = ["DumpConfigOptions", "VersionOptions", "dump_config_main", "help_main", "version_main"]


class VersionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    json_output: bool = Field(False, alias="json", description="print JSON instead of text")


class DumpConfigOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    config_paths: list[str] = Field(
        default_factory=list, description="YAML files merged in order (then env.yaml, then overrides)"
    )


def help_main(options: NoOptions) -> int:
    """`ng_help`: one line a command."""
    print("nemo_gym commands (each also as nemo_gym_<name>; +help=true for parameters):")
    width = max(len(name) for name in COMMANDS) + 1
    for c in COMMANDS.values():
        print(f"  ng_{c.name:<{width}} {c.summary}")
    return 0


def version_main(options: VersionOptions) -> int:
    """`ng_version`: nemo_gym's version, Python's and the main dependencies' (+json=true for JSON)."""
    packages = {
        name: _installed(name)
        for name in ("fastapi", "uvicorn", "httpx", "pydantic", "openai", "hydra-core", "omegaconf")
    }
    info = {
        "nemo_gym": _installed("nemo-gym"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dependencies": packages,
    }
    print(
        json.dumps(info, indent=2) if options.json_output else f"nemo_gym {info['nemo_gym']} (Python {info['python']})"
    )
    return 0


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def dump_config_main(argv: list[str]) -> int:
    """`ng_dump_config`: the resolved config, secrets masked, as YAML."""
    loaded = load_config(argv)
    print(yaml.safe_dump(mask_secrets(loaded.values), sort_keys=False), end="")
    return 0
