"""Where things are: this checkout's root, the three server folders' names, the cache folder, and the layers of
the nemo_gym package (no imports of nemo_gym: every module may use it).

The layers (`LAYERS`; tests/test_import_graph.py fails on an import that crosses them upwards, and on any import
cycle):

- **cli** (`nemo_gym.cli`): the console scripts and the mains of the commands that join a core command to the
  extras that feed it. Nothing imports it; commands are run by name through the registry `nemo_gym.commands`,
  which names every main and options model as a string and so sits at the bottom of the graph.
- **extras**: the team run server and its client, the viewer, the dataset registries and `ng_prepare_data`, the
  ART, ReinforceNow and Prime front-ends (`art`, `rnow`, `train.prime_toml`, `train.prime_envs`), the project
  templates, background runs (`background`, `runs`), `ng_export`, `ng_models` and `ng_try`. They may import the
  core and each other.
- **core**: everything else: the config, the server base classes and their client, the head server, `ng_run`,
  rollout collection, profiling, the RL math and the training loop, with their helpers. The core imports no
  extra and no cli module.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LAYERS", "REPO_ROOT", "SERVER_TYPES", "layer_of", "nemo_gym_home"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")

# layer -> the modules and packages in it, top layer first; a module may import its own layer and those below it
LAYERS: dict[str, tuple[str, ...]] = {
    "cli": ("nemo_gym.cli",),
    "extras": (
        "nemo_gym.team", "nemo_gym.viewer", "nemo_gym.datasets", "nemo_gym.prepare_data",
        "nemo_gym.art", "nemo_gym.rnow", "nemo_gym.train.prime_toml", "nemo_gym.train.prime_envs",
        "nemo_gym.project_templates", "nemo_gym.templates", "nemo_gym.background", "nemo_gym.runs",
        "nemo_gym.export", "nemo_gym.model_list", "nemo_gym.try_rollouts", "nemo_gym.try_sft",
    ),  # fmt: skip
    "core": ("nemo_gym",),
}


def nemo_gym_home() -> Path:
    """The cache and state folder: `$NEMO_GYM_HOME`, default `~/.cache/nemo_gym`."""
    return Path(os.environ.get("NEMO_GYM_HOME") or Path.home() / ".cache" / "nemo_gym").expanduser()


def layer_of(module: str) -> str:
    """The layer of a module of nemo_gym (`nemo_gym.status` → "core"): the first of LAYERS that holds it or its package.

    Raises:
        ValueError: `module` is not in nemo_gym.
    """
    for layer, prefixes in LAYERS.items():
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return layer
    raise ValueError(f"{module} is not a module of nemo_gym")
