"""Importing a project's `rewards.py` and `tools.py` by path and collecting their `@reward` / `@tool` functions.

Files written for ReinforceNow import `from rnow.core import reward, RewardArgs` (or `rnow.core.tool`,
`rnow.core.reward`, `rnow.models`). When the real `rnow` package is not installed, those names are aliases
of `nemo_gym.rnow` while the files load, so such a project runs unchanged.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym.errors import ConfigError
from nemo_gym.module_loading import import_file
from nemo_gym.rnow import decorators
from nemo_gym.rnow.decorators import RewardSpec, ToolSpec

__all__ = ["ProjectFunctions", "load_functions", "install_rnow_aliases"]

RNOW_MODULES = ("rnow", "rnow.core", "rnow.core.reward", "rnow.core.tool", "rnow.models")


@dataclass
class ProjectFunctions:
    """The `@reward` and `@tool` functions of a project, by name."""

    rewards: dict[str, RewardSpec] = field(default_factory=dict)
    tools: dict[str, ToolSpec] = field(default_factory=dict)


def install_rnow_aliases() -> None:
    """Make `import rnow.core` (and its submodules) give `nemo_gym.rnow`'s decorators, unless the real rnow is
    installed. Idempotent."""
    if "rnow" in sys.modules or importlib.util.find_spec("rnow") is not None:
        return
    for name in RNOW_MODULES:
        module = types.ModuleType(name, "alias of nemo_gym.rnow (the rnow package is not installed)")
        for attr in ("reward", "tool", "RewardArgs", "ToolArgs", "get_response"):
            setattr(module, attr, getattr(decorators, attr))
        sys.modules[name] = module
    sys.modules["rnow"].core = sys.modules["rnow.core"]  # type: ignore[attr-defined]
    sys.modules["rnow"].models = sys.modules["rnow.models"]  # type: ignore[attr-defined]
    sys.modules["rnow.core"].reward = decorators.reward  # the function, as `from rnow.core import reward` expects
    sys.modules["rnow.core"].tool = decorators.tool


def load_functions(project_dir: str | Path, *, require_rewards: bool = True) -> ProjectFunctions:
    """The rewards of `<project_dir>/rewards.py` and the tools of `<project_dir>/tools.py` (optional; rnow's
    older name `env.py` is read too). `require_rewards=False` (SFT projects, which have no rewards): rewards.py is
    optional too.

    Raises:
        ConfigError: a missing rewards.py (when required), a file that fails to import (with the error and a hint
            about requirements.txt), or a name defined twice.
    """
    project = Path(project_dir)
    functions = ProjectFunctions()
    if require_rewards and not (project / "rewards.py").is_file():
        raise ConfigError(f"{project}: no rewards.py (the @reward functions that train.jsonl's `rewards` name)")
    install_rnow_aliases()
    for filename in ("rewards.py", "tools.py", "env.py"):
        path = project / filename
        if not path.is_file():
            continue
        module = _import(path)
        for value in vars(module).values():
            if isinstance(spec := getattr(value, "__rnow_reward__", None), RewardSpec):
                _add(functions.rewards, spec, path, "reward")
            if isinstance(spec := getattr(value, "__rnow_tool__", None), ToolSpec):
                _add(functions.tools, spec, path, "tool")
    return functions


def _add(table: dict, spec: RewardSpec | ToolSpec, path: Path, kind: str) -> None:
    known = table.get(spec.name)
    if known is not None and known.fn is not spec.fn:
        raise ConfigError(f"{path}: {kind} {spec.name!r} is defined twice in the project; rename one")
    table[spec.name] = spec


def _import(path: Path) -> types.ModuleType:
    try:
        return import_file(path)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{path}: cannot import {exc.name!r}: list it in the project's requirements.txt and install it ({exc})") from exc
    except Exception as exc:
        raise ConfigError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc
