"""Importing a project's `rewards.py` and `tools.py` by path and collecting their `@reward` / `@tool` functions.

Files written for ReinforceNow import `from rnow.core import reward, RewardArgs` (or `rnow.core.tool`,
`rnow.core.reward`, `rnow.models`). When the real `rnow` package is not installed, those names are aliases
of `nemo_gym.rnow` while the files load, so such a project runs unchanged.

A project's files may import packages of its own `requirements.txt`, which the project's server gets in its
environment (ng_run's `extra_requirements`) but the command reading the project (ng_run, ng_try, ng_train) may
lack: then the functions are read in that same environment, built first (`python -m nemo_gym.rnow.loading DIR`
prints their descriptions as JSON), and the command gets their names, options and tool schemas; their code runs
only in the server.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.orchestration.venvs import VenvBuildError, ensure_venv
from nemo_gym.rnow import decorators
from nemo_gym.rnow.decorators import RewardSpec, ToolSpec
from nemo_gym.serving.module_loading import import_file

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
    try:
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
    except _MissingPackage as missing:
        if _IN_PROJECT_ENVIRONMENT or not (project / "requirements.txt").is_file():
            raise ConfigError(str(missing)) from None
        return _load_in_project_environment(project, require_rewards, missing)
    return functions


_IN_PROJECT_ENVIRONMENT = False  # set when this module runs as the describer inside the project's environment


class _MissingPackage(ConfigError):
    """A project file imports a package this process lacks."""


def project_environment_requirements(project_dir: Path) -> tuple[Path, list[Path]]:
    """The requirements of a project's server environment: the rnow_project server's requirements.txt and the
    project's own (the files ng_run installs for it, `extra_requirements`)."""
    own = project_dir / "requirements.txt"
    return REPO_ROOT / "resources_servers" / "rnow_project" / "requirements.txt", [own] if own.is_file() else []


def _load_in_project_environment(project: Path, require_rewards: bool, missing: ConfigError) -> ProjectFunctions:
    """Describe the project's functions from inside its server's environment (built if needed)."""
    import asyncio
    import json
    import subprocess

    print(
        f"{missing.args[0].split(':')[0]} imports a package of the project's requirements.txt: reading its rewards and"
        " tools in the project's environment (built once, then reused)...",
        file=sys.stderr,
        flush=True,
    )
    requirements, extra = project_environment_requirements(project)
    try:
        python = asyncio.run(ensure_venv(requirements, extra_requirements=extra))
    except VenvBuildError as exc:
        raise ConfigError(f"{project / 'requirements.txt'}: the project's requirements do not install: {exc}") from None
    done = subprocess.run(
        [
            str(python),
            "-m",
            "nemo_gym.rnow.loading",
            str(project),
            "--rewards-optional" if not require_rewards else "--",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise ConfigError(
            done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"{project}: reading its functions failed (exit {done.returncode})"
        )
    described = json.loads(done.stdout)
    functions = ProjectFunctions()
    for item in described["rewards"]:
        functions.rewards[item["name"]] = RewardSpec(
            item["name"], _runs_in_server(item["name"]), item["precondition"], item["sandbox"], item["timeout_s"]
        )
    for item in described["tools"]:
        functions.tools[item["name"]] = ToolSpec(
            item["name"],
            _runs_in_server(item["name"]),
            item["schema"],
            item["sandbox"],
            item["timeout_s"],
            item["takes_args"],
        )
    return functions


def _runs_in_server(name: str):
    """The `fn` of a function described from the project's environment: its code runs in the project's server only."""

    def run_elsewhere(*args, **kwargs):
        raise RuntimeError(
            f"{name!r} imports packages of the project's requirements.txt: it runs in the project's server, not in this"
            " process"
        )

    return run_elsewhere


def describe(project_dir: Path, require_rewards: bool = True) -> dict:
    """The project's functions as JSON-able descriptions (names, options, tool schemas)."""
    functions = load_functions(project_dir, require_rewards=require_rewards)
    return {
        "rewards": [
            {"name": s.name, "precondition": s.precondition, "sandbox": s.sandbox, "timeout_s": s.timeout_s}
            for s in functions.rewards.values()
        ],
        "tools": [
            {
                "name": s.name,
                "schema": s.schema,
                "sandbox": s.sandbox,
                "timeout_s": s.timeout_s,
                "takes_args": s.takes_args,
            }
            for s in functions.tools.values()
        ],
    }


def _add(table: dict, spec: RewardSpec | ToolSpec, path: Path, kind: str) -> None:
    known = table.get(spec.name)
    if known is not None and known.fn is not spec.fn:
        raise ConfigError(f"{path}: {kind} {spec.name!r} is defined twice in the project; rename one")
    table[spec.name] = spec


def _import(path: Path) -> types.ModuleType:
    try:
        return import_file(path)
    except ModuleNotFoundError as exc:
        raise _MissingPackage(
            f"{path}: cannot import {exc.name!r}: list it in the project's requirements.txt (ng_run installs that file"
            f" into the project's server environment) ({exc})"
        ) from exc
    except Exception as exc:
        raise ConfigError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc


if __name__ == "__main__":  # python -m nemo_gym.rnow.loading DIR [--rewards-optional]: the descriptions as JSON
    import json

    _IN_PROJECT_ENVIRONMENT = True
    try:
        print(json.dumps(describe(Path(sys.argv[1]), require_rewards="--rewards-optional" not in sys.argv[2:])))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
