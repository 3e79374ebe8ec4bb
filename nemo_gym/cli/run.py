"""The mains of `ng_run` and `ng_prefetch`: a config, or a ReinforceNow project translated into one
(`+rnow_project=DIR`), run until Ctrl-C, or its environments and engines built without starting it."""

from __future__ import annotations

from nemo_gym.config import load_config
from nemo_gym.orchestration.prefetch import prefetch_main
from nemo_gym.orchestration.run import run_main
from nemo_gym.rnow.project import expand_rnow_args

__all__ = ["main", "prefetch"]


def main(argv: list[str]) -> int:
    """Start the servers of the config `argv` names. Returns the exit status."""
    [argv] = expand_rnow_args(argv, mode="run")  # +rnow_project=DIR (a ReinforceNow project) → its translated config
    return run_main(load_config(argv))


def prefetch(argv: list[str]) -> int:
    """Build what `ng_run` of the config `argv` names would build, starting nothing. Returns the exit status."""
    [argv] = expand_rnow_args(argv, mode="run")
    return prefetch_main(argv)
