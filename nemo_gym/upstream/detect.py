"""Whether a server folder was written for NVIDIA NeMo Gym (`detect_framework`), read from its entrypoint's imports
without running it; `framework_of(instance)` is an instance's `framework` field, else that. `ng_run` asks it of every
instance it starts (`nemo_gym.orchestration.run`). How such a folder runs: `nemo_gym.orchestration.upstream_servers`."""

from __future__ import annotations

import ast
from pathlib import Path

from nemo_gym import MOVED
from nemo_gym.common.layout import ALL_SERVER_TYPES, NEMO_GYM_ONLY_SERVER_TYPES, REPO_ROOT, server_tree_root
from nemo_gym.config.server_instances import ServerInstance

__all__ = ["FRAMEWORK", "NEWEST_RELEASE", "detect_framework", "detect_release", "framework_of"]

FRAMEWORK = "nemo_gym"
NEWEST_RELEASE = "0.7.0"  # the newest NeMo Gym release this project runs folders with
# the modules of NeMo Gym 0.4.0's package (its wheel's nemo_gym/): a folder that imports another needs a later release
RELEASE_0_4_0_MODULES = frozenset(
    "__init__ agent_registry anthropic_converter anthropic_utils base_resources_server base_responses_api_agent"
    " base_responses_api_model benchmarks cli cli_setup_command config_types dataset_orchestrator gitlab_utils"
    " global_config hf_utils openai_utils package_info profiling prompt registry resources responses_converter"
    " reward_profile rollout_collection sandbox server_metadata server_status server_utils skills"
    " train_data_utils".split()
)


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
    return FRAMEWORK if _imports_nemo_gym(folder / entrypoint, server_tree(folder)) else None


def server_tree(folder: Path) -> Path:
    """The root of the server tree a server folder is in (`nemo_gym.common.layout.server_tree_root`); the folder's
    grandparent when no ancestor is named by a server type."""
    return server_tree_root(folder) or folder.parent.parent


def detect_release(instance: ServerInstance) -> str | None:
    """The NeMo Gym release a NeMo Gym folder needs, when it says so, else None (the run's default, 0.4.0):

    1. the release of the tree the folder is in (`<tree>/<server type>/<name>/`): the version of an unpacked wheel's
       `nemo_gym-<version>.dist-info`, else of a checkout's `nemo_gym/package_info.py` (`MAJOR`, `MINOR`, `PATCH`,
       `PRE_RELEASE`): the folder's code was written for it;
    2. NEWEST_RELEASE for an environment server (a server type 0.7.0 introduced) or a folder whose entrypoint
       imports a module of NeMo Gym's package that 0.4.0 lacks (e.g. `nemo_gym.judge`), itself or through the server
       folders of its tree it imports.
    """
    tree = server_tree(instance.implementation_dir)
    found = sorted(tree.glob("nemo_gym-*.dist-info"))
    if found:
        return found[-1].name.removeprefix("nemo_gym-").removesuffix(".dist-info")
    version = _package_info_version(tree / "nemo_gym" / "package_info.py")
    if version:
        return version
    if instance.server_type in NEMO_GYM_ONLY_SERVER_TYPES:
        return NEWEST_RELEASE
    newer = _imported_nemo_gym_modules(instance.entrypoint_path, tree, set()) - RELEASE_0_4_0_MODULES
    return NEWEST_RELEASE if newer else None


def _package_info_version(path: Path) -> str | None:
    """`MAJOR.MINOR.PATCH[PRE_RELEASE]` of a NeMo Gym checkout's package_info.py, read without running it."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant):
                values[node.targets[0].id] = node.value.value
    parts = [values.get(key) for key in ("MAJOR", "MINOR", "PATCH")]
    if not all(isinstance(part, int) for part in parts):
        return None
    pre = values.get("PRE_RELEASE")
    return ".".join(map(str, parts)) + (pre if isinstance(pre, str) else "")


def _imported_nemo_gym_modules(path: Path, tree_root: Path, seen: set[Path]) -> set[str]:
    """The `nemo_gym.<module>` names (second part) the Python file `path` imports, itself or through the server
    folders of `tree_root` it imports (each file read once)."""
    if path in seen:
        return set()
    seen.add(path)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    modules: set[str] = set()
    for name in _imported_names(tree):
        parts = name.split(".")
        if parts[0] == "nemo_gym" and len(parts) > 1:
            modules.add(parts[1])
        if parts[0] in ALL_SERVER_TYPES and len(parts) > 2:
            module = tree_root.joinpath(*parts)
            for candidate in (module.with_suffix(".py"), module / "__init__.py"):
                if candidate.is_file():
                    modules |= _imported_nemo_gym_modules(candidate, tree_root, seen)
    return modules


def _imported_names(tree: ast.AST) -> list[str]:
    """Every module name an import of `tree` may name: `import a.b` -> a.b; `from a.b import c` -> a.b and a.b.c
    (c may be a module); relative imports are skipped."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def _imports_nemo_gym(path: Path, tree_root: Path) -> bool:
    """Whether the Python file `path` imports a NeMo Gym module ours lacks, itself or through the server folders of
    `tree_root` it imports."""
    return any(not _ours(module) for module in _imported_nemo_gym_modules(path, tree_root, set()))


def _ours(module: str) -> bool:
    """Whether `nemo_gym.<module>` is a module or package of this repository's nemo_gym, or one of its old paths
    (`nemo_gym.MOVED`, e.g. `nemo_gym.server`)."""
    package = REPO_ROOT / "nemo_gym"
    return (
        (package / f"{module}.py").is_file()
        or (package / module / "__init__.py").is_file()
        or f"nemo_gym.{module}" in MOVED
    )
