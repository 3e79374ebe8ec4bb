"""Where things are: this checkout's root, the three server folders' names, the cache folder, and the layers of
the nemo_gym package (no imports of nemo_gym: every module may use it).

The layers are folders (`LAYERS`; tests/test_import_graph.py fails on an import that crosses them upwards, on a
module that no entry holds, on a module at the top of nemo_gym/, on any import cycle, and on a cycle between the
folders):

- **cli** (`nemo_gym/cli/`): the console scripts and the mains of the commands that join a core command to the
  extras that feed it. Nothing imports it; commands are run by name through the registry `nemo_gym.config.commands`,
  which names every main and options model as a string and so sits at the bottom of the graph.
- **extras**: one folder each: the team run server (`team`), the viewer (`viewer`), the dataset registries and
  `ng_prepare_data` (`datasets`), the ART, ReinforceNow and Prime front-ends (`art`, `rnow`, `prime`), `ng_init`
  (`scaffold`, with the templates' files in `templates`), background runs and `ng_runs` (`runs`), `ng_models` and
  `ng_export` (`model_files`) and `ng_try` (`tryout`). They may import the core and each other.
- **core**: the folders of the gym's jobs: `serving` (the HTTP protocol), `env` (what an environment's author
  uses), `orchestration` (`ng_run`), `model_servers`, `upstream` (NVIDIA NeMo Gym itself), `collect`, `eval`, `rl`
  and `train`; below them `config` (loading and merging a config, NeMo Gym's config directives, the server
  instances of a resolved config, and the `ng_*` commands' registry) and `common` (what every layer uses: the
  exception tree, this module, path containment, JSONL files, process helpers). The core imports no extra and no
  cli module.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ALL_SERVER_TYPES",
    "LAYERS",
    "NEMO_GYM_ONLY_SERVER_TYPES",
    "REPO_ROOT",
    "SERVER_TYPES",
    "layer_of",
    "nemo_gym_home",
    "server_tree_root",
]

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")
# NeMo Gym 0.7.0's server type that only NeMo Gym folders have (`environment_servers/legacy_agent`, ...): run with the
# release (nemo_gym.orchestration.launch_upstream), never a folder of ours
NEMO_GYM_ONLY_SERVER_TYPES = ("environment_servers",)
# every server type a config may name: ours and NeMo Gym's own
ALL_SERVER_TYPES = (*SERVER_TYPES, *NEMO_GYM_ONLY_SERVER_TYPES)

# layer -> the folders in it, top layer first; a module may import its own layer and those below it
LAYERS: dict[str, tuple[str, ...]] = {
    "cli": ("nemo_gym.cli",),
    "extras": (
        "nemo_gym.team",
        "nemo_gym.viewer",
        "nemo_gym.datasets",
        "nemo_gym.art",
        "nemo_gym.rnow",
        "nemo_gym.prime",
        "nemo_gym.scaffold",
        "nemo_gym.templates",
        "nemo_gym.runs",
        "nemo_gym.model_files",
        "nemo_gym.tryout",
    ),
    "core": (
        "nemo_gym.serving",
        "nemo_gym.env",
        "nemo_gym.orchestration",
        "nemo_gym.model_servers",
        "nemo_gym.upstream",
        "nemo_gym.collect",
        "nemo_gym.eval",
        "nemo_gym.rl",
        "nemo_gym.train",
        "nemo_gym.config",
        "nemo_gym.common",
    ),
}


def nemo_gym_home() -> Path:
    """The cache and state folder: `$NEMO_GYM_HOME`, default `~/.cache/nemo_gym`."""
    return Path(os.environ.get("NEMO_GYM_HOME") or Path.home() / ".cache" / "nemo_gym").expanduser()


def server_tree_root(path: Path) -> Path | None:
    """The root of the server tree `path` is in (`<root>/<server type>/<name>/...`: this repository, a NeMo Gym
    checkout or the folders of its wheel), `<name>` maybe nested (NeMo Gym 0.7.0's
    `responses_api_agents/conversational_tool_use/simulation/`): the parent of the nearest ancestor of `path` named
    by a server type (ALL_SERVER_TYPES), else None."""
    for ancestor in path.parents:
        if ancestor.name in ALL_SERVER_TYPES:
            return ancestor.parent
    return None


def layer_of(module: str) -> str:
    """The layer of a module of nemo_gym (`nemo_gym.orchestration.status` → "core"): the entry of LAYERS that holds it
    or its package; the package itself (`nemo_gym`: its old import paths) is core.

    Raises:
        ValueError: no entry of LAYERS holds `module`.
    """
    if module == "nemo_gym":
        return "core"
    for layer, prefixes in LAYERS.items():
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return layer
    raise ValueError(f"{module} is in no layer of nemo_gym.common.layout.LAYERS (a new folder is placed there)")
