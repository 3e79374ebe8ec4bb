"""nemo_gym: reinforcement learning of language models on verifiable environments (docs/architecture.md).

The modules an environment's, agent's or project's code imported before the folders of 2026-11 (`nemo_gym.server`,
`nemo_gym.tools`, ...) still import, with a DeprecationWarning naming the new module, until release 0.3: `MOVED`
lists them (docs/architecture.md, "Old import paths"); `nemo_gym.collect`, a package now, answers its old names
itself. Nothing in this repository uses them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ["MOVED"]

# old module -> the modules that hold its public names now, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "nemo_gym.server": (
        "nemo_gym.env",
        "nemo_gym.serving.server",
        "nemo_gym.env.agent_server",
        "nemo_gym.model_servers.model_server",
    ),
    "nemo_gym.tools": ("nemo_gym.env.tools", "nemo_gym.serving.server"),
    "nemo_gym.trajectory": ("nemo_gym.env.trajectory",),
    "nemo_gym.answers": ("nemo_gym.env.answers",),
    "nemo_gym.gymnasium_env": ("nemo_gym.env.gymnasium",),
    "nemo_gym.agent_steps": ("nemo_gym.env.episode",),
    "nemo_gym.server_testing": ("nemo_gym.env.testing",),
    "nemo_gym.checks": ("nemo_gym.env.conformance",),
    "nemo_gym.validation": ("nemo_gym.env.validation",),
    "nemo_gym.client": ("nemo_gym.serving.client",),
    "nemo_gym.limits": ("nemo_gym.serving.limits",),
    "nemo_gym.openai_convert": ("nemo_gym.serving.openai_convert",),
    "nemo_gym.module_loading": ("nemo_gym.serving.module_loading",),
    "nemo_gym.profile": ("nemo_gym.collect.profile", "nemo_gym.env.metrics"),
    # the top modules of 2026-11-29, now in folders
    "nemo_gym.errors": ("nemo_gym.common.errors",),
    "nemo_gym.layout": ("nemo_gym.common.layout",),
    "nemo_gym.paths": ("nemo_gym.common.paths",),
    "nemo_gym.processes": ("nemo_gym.common.processes",),
    "nemo_gym.jsonl": ("nemo_gym.common.jsonl",),
    "nemo_gym.commands": ("nemo_gym.config.commands",),
    "nemo_gym.server_instances": ("nemo_gym.config.server_instances",),
}


def _moved_module(old: str) -> types.ModuleType:
    """A module named `old` whose attributes are looked up in its new modules (`MOVED[old]`), in order."""
    homes = MOVED[old]
    module = types.ModuleType(old, f"Moved: {', '.join(homes)}.")

    def __getattr__(name: str) -> object:
        for home in homes:
            found = importlib.import_module(home)
            if hasattr(found, name):
                return getattr(found, name)
        raise AttributeError(f"module {old!r} (moved to {homes[0]}) has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path of `MOVED`, with a DeprecationWarning."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name][0]
        warnings.warn(
            f"{spec.name} moved to {new} (docs/architecture.md, 'Old import paths'); the old name goes in nemo_gym 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        return _moved_module(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
