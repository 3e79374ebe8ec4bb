"""Rollout collection (`ng_collect_rollouts`: `command`; the engine the trainer and `ng_eval` call: `engine`), its files
and resume (`files`, `sink`), its `<out>_aggregate_metrics.json` (`aggregate_metrics`), watchdog and liveness, reward
profiles (`ng_profile`: `profile`) and group verification (`ng_group_verify`).

The names `nemo_gym.collect` held when it was one module (`collect_rollouts`, `CollectConfig`, ...) still import from
here, with a DeprecationWarning, until nemo_gym 0.3.
"""

from __future__ import annotations

import importlib
import warnings

_OLD_HOMES = (
    "nemo_gym.collect.command",
    "nemo_gym.collect.engine",
    "nemo_gym.collect.files",
    "nemo_gym.collect.sink",
    "nemo_gym.collect.tasks",
    "nemo_gym.common.jsonl",
)


def __getattr__(name: str) -> object:
    for home in _OLD_HOMES:
        module = importlib.import_module(home)
        if not name.startswith("_") and hasattr(module, name):
            warnings.warn(
                f"nemo_gym.collect.{name} moved to {home}.{name}; the old name goes in nemo_gym 0.3",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(module, name)
    raise AttributeError(f"module 'nemo_gym.collect' has no attribute {name!r}")
