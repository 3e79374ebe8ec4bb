"""Whether a server folder was written for NVIDIA NeMo Gym (`detect_framework`), read from its entrypoint's imports
without running it; `framework_of(instance)` is an instance's `framework` field, else that. `ng_run` asks it of every
instance it starts (`nemo_gym.orchestration.run`). How such a folder runs: `nemo_gym.orchestration.upstream_servers`."""

from __future__ import annotations

import ast
from pathlib import Path

from nemo_gym import MOVED
from nemo_gym.layout import REPO_ROOT, SERVER_TYPES
from nemo_gym.server_instances import ServerInstance

__all__ = ["FRAMEWORK", "detect_framework", "framework_of"]

FRAMEWORK = "nemo_gym"


def framework_of(instance: ServerInstance) -> str | None:
    """`'nemo_gym'` for an instance whose folder was written for NVIDIA NeMo Gym (its `framework` field, else
    `detect_framework` of its folder), None for one of ours or an external server.

    Raises:
        ConfigError: an unknown `framework` value.
    """
    if instance.external_urls is not None:
        return None
    if instance.framework is not None:
        return instance.framework
    return (
        detect_framework(instance.implementation_dir, instance.entrypoint)
        if instance.implementation_dir.is_dir()
        else None
    )


def detect_framework(folder: Path, entrypoint: str) -> str | None:
    """`'nemo_gym'` when the entrypoint file imports a module of NeMo Gym's package that ours lacks (so it was
    written for NeMo Gym), or a module of another server folder of its tree (`<tree>/<server type>/<name>/`,
    e.g. `from resources_servers.mcqa.app import ...`) that does, else None. A file that does not parse is left to
    the server's own start to report."""
    return FRAMEWORK if _imports_nemo_gym(folder / entrypoint, folder.parent.parent, set()) else None


def _imports_nemo_gym(path: Path, tree_root: Path, seen: set[Path]) -> bool:
    """Whether the Python file `path` imports a NeMo Gym module ours lacks, itself or through the server folders of
    `tree_root` it imports (each file read once)."""
    if path in seen:
        return False
    seen.add(path)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        ):  # `from a.b import c`: a.b, or the module a.b.c
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            names = []
        for name in names:
            parts = name.split(".")
            if parts[0] == "nemo_gym" and len(parts) > 1 and not _ours(parts[1]):
                return True
            if parts[0] in SERVER_TYPES and len(parts) > 2:
                module = tree_root.joinpath(*parts)
                for candidate in (module.with_suffix(".py"), module / "__init__.py"):
                    if candidate.is_file() and _imports_nemo_gym(candidate, tree_root, seen):
                        return True
    return False


def _ours(module: str) -> bool:
    """Whether `nemo_gym.<module>` is a module or package of this repository's nemo_gym, or one of its old paths
    (`nemo_gym.MOVED`, e.g. `nemo_gym.server`)."""
    package = REPO_ROOT / "nemo_gym"
    return (
        (package / f"{module}.py").is_file()
        or (package / module / "__init__.py").is_file()
        or f"nemo_gym.{module}" in MOVED
    )
