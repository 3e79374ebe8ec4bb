"""The flags of NeMo Gym 0.7.0's `gym` subcommands (its `nemo_gym/cli/main.py`), each registered on an argparse
parser and translated into our `+key=value` overrides, as 0.7.0 translates them into its Hydra overrides.

A flag 0.7.0 has and we do not honour is registered as `refused`: using it is an error naming the flag and why
(never silently dropped). The subcommands themselves are in `nemo_gym.cli.gym_router`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import did_you_mean

__all__ = [
    "ALLOW_UNSUPPORTED_PAIRING",
    "Route",
    "CATALOG_KIND",
    "CONFIG",
    "JSON",
    "MODEL_FLAGS",
    "SEARCH_DIR",
    "SELECTORS",
    "Flag",
    "GymUsageError",
    "bool_flag",
    "merge_config_paths",
    "quoted",
    "refused",
    "value_flag",
]


class GymUsageError(Exception):
    """A flag or subcommand we do not support, or a bad flag value: argparse reports it (exit status 2)."""


@dataclass(frozen=True)
class Route:
    """A supported subcommand: the command it runs (a name, or chosen from the parsed flags) and its flags."""

    summary: str
    command: str | Callable[[argparse.Namespace], str]
    flags: tuple[Flag, ...] = ()


@dataclass(frozen=True)
class Flag:
    register: Callable[[argparse.ArgumentParser], object]  # add the argument(s) to a subcommand's parser
    translate: Callable[[argparse.Namespace], list[str]] = lambda args: []  # -> our `+key=value` overrides


def quoted(text: str) -> str:
    """`text` as one quoted override value (backslashes and quotes escaped): it stays the text given."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def value_flag(
    name: str, key: str, help_text: str, *, aliases: tuple[str, ...] = (), choices=None, quote: bool = False
) -> Flag:
    """`--name VALUE` -> `+key=VALUE` (nothing when not given); with `quote`, VALUE quoted, so that it stays the
    text given (`1.10` a string, not the number 1.1), as 0.7.0's `quote=True` flags."""
    dest = name.replace("-", "_")

    def translate(args: argparse.Namespace) -> list[str]:
        value = getattr(args, dest)
        if value is None:
            return []
        return [f"+{key}=" + (quoted(value) if quote else value)]

    return Flag(lambda p: p.add_argument(f"--{name}", *aliases, dest=dest, choices=choices, help=help_text), translate)


def bool_flag(name: str, key: str, help_text: str) -> Flag:
    """`--name` -> `+key=true`."""
    dest = name.replace("-", "_")
    return Flag(
        lambda p: p.add_argument(f"--{name}", dest=dest, action="store_true", help=help_text),
        lambda a: [f"+{key}=true"] if getattr(a, dest) else [],
    )


def refused(name: str, why: str, *, takes_value: bool = True, aliases: tuple[str, ...] = ()) -> Flag:
    """A 0.7.0 flag we do not support: accepted by the parser so that using it names it and says `why`."""
    dest = "refused_" + name.replace("-", "_")

    def translate(args: argparse.Namespace) -> list[str]:
        if getattr(args, dest) not in (None, False):
            raise GymUsageError(f"--{name} is not supported: {why}")
        return []

    def register(p: argparse.ArgumentParser) -> None:
        kwargs = {"metavar": "VALUE"} if takes_value else {"action": "store_true"}
        p.add_argument(f"--{name}", *aliases, dest=dest, help=f"(not supported: {why})", **kwargs)

    return Flag(register, translate)


CONFIG = Flag(
    lambda p: p.add_argument(
        "--config", action="append", metavar="PATH", help="Config file to load; repeatable (+config_paths=[...])."
    ),
    lambda a: [f"+config_paths=[{','.join(a.config)}]"] if a.config else [],
)
# SUPPRESS: a `--json` given before the subcommand (`gym --json list benchmarks`) is kept, as in 0.7.0
JSON = Flag(
    lambda p: p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="Output as machine-readable JSON."
    ),
    lambda a: ["+json=true"] if getattr(a, "json", False) else [],
)
ALLOW_UNSUPPORTED_PAIRING = refused(
    "allow-unsupported-pairing", "nemo_gym has no agent/model pairing guards", takes_value=False
)
# `--kind environment|benchmark` of a catalog entry (0.7.0's CATALOG_KIND): `+catalog_kind=`
CATALOG_KIND = value_flag("kind", "catalog_kind", "Workload kind.", choices=("environment", "benchmark"))
SEARCH_DIR = Flag(
    lambda p: p.add_argument(
        "--search-dir", action="append", metavar="DIR", help="Extra root to search for components; repeatable."
    )
)
MODEL_FLAGS = (
    value_flag("model", "policy_model_name", "Model name (+policy_model_name).", aliases=("-m",)),
    value_flag("model-url", "policy_base_url", "Model server base URL (+policy_base_url)."),
    value_flag("model-api-key", "policy_api_key", "Model server API key (+policy_api_key)."),
)

# selector -> (parent folder, configs subfolder, default flavor; None: the name), as 0.7.0's `_ASSETS`
_ASSETS = {
    "benchmark": ("benchmarks", "", "config"),
    "environment": ("environments", "", "config"),
    "resources-server": ("resources_servers", "configs", None),
    "model-type": ("responses_api_models", "configs", None),
    "agent-type": ("responses_api_agents", "configs", None),
}


def search_roots(args: argparse.Namespace) -> list[Path]:
    """`--search-dir`s, then `$NEMO_GYM_EXTRA_ROOTS`, then the current directory, then this repository (its
    resources servers and model servers; first match wins, as in 0.7.0, whose last root is its install root)."""
    extra = [p for p in os.environ.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if p]
    roots = [Path(p).resolve() for p in [*(getattr(args, "search_dir", None) or []), *extra]] + [Path.cwd()]
    return roots + ([REPO_ROOT] if REPO_ROOT.resolve() not in {r.resolve() for r in roots} else [])


def asset_config_path(flag: str, value: str, roots: list[Path]) -> str:
    """The config a `--<flag> NAME[/FLAVOR]` selector names: `<parent>/<name>/[<subdir>/]<flavor>.yaml` under the
    first root that has it.

    Raises:
        GymUsageError: no root has it.
    """
    parent, subdir, default_flavor = _ASSETS[flag]
    name, _, flavor = value.partition("/")
    relative = Path(parent, name, subdir, f"{flavor or default_flavor or name}.yaml")
    nested = Path(parent, value, "config.yaml") if "/" in value and flag in ("benchmark", "environment") else None
    for candidate in [c for c in (nested, relative) if c is not None]:
        for root in roots:
            if (root / candidate).is_file():
                return str((root / candidate).resolve())
    known = {folder.name for root in roots if (root / parent).is_dir() for folder in (root / parent).iterdir()}
    raise GymUsageError(
        f"--{flag} {value} names {relative}, which is in none of {', '.join(str(r) for r in roots)}"
        f"{did_you_mean(name, known)} (add a root with --search-dir, or pass --config PATH)"
    )


def selector(flag: str, *, repeatable: bool = True) -> Flag:
    dest = flag.replace("-", "_")

    def translate(args: argparse.Namespace) -> list[str]:
        chosen = getattr(args, dest)
        names = chosen if isinstance(chosen, list) else [chosen] if chosen else []
        roots = search_roots(args)
        return [f"+config_paths=[{','.join(asset_config_path(flag, n, roots) for n in names)}]"] if names else []

    return Flag(
        lambda p: p.add_argument(
            f"--{flag}",
            metavar="NAME",
            action="append" if repeatable else "store",
            help=f"Load the named {flag} config.",
        ),
        translate,
    )


SELECTORS = (
    selector("benchmark"),
    selector("environment"),
    selector("resources-server"),
    selector("model-type", repeatable=False),
    selector("agent-type", repeatable=False),
)


def merge_config_paths(overrides: list[str]) -> list[str]:
    """All `+config_paths=[...]` of the flags in one (a key given twice is an error), first."""
    prefix, paths, rest = "+config_paths=[", [], []
    for token in overrides:
        if token.startswith(prefix) and token.endswith("]"):
            paths += [p for p in token[len(prefix) : -1].split(",") if p]
        else:
            rest.append(token)
    return ([f"+config_paths=[{','.join(paths)}]"] if paths else []) + rest
