"""`ng_run`'s main: a config, or a ReinforceNow project translated into one (`+rnow_project=DIR`), run until Ctrl-C."""

from __future__ import annotations

from nemo_gym.config import load_config
from nemo_gym.orchestration.run import run_main
from nemo_gym.rnow.project import expand_rnow_args

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Start the servers of the config `argv` names. Returns the exit status."""
    [argv] = expand_rnow_args(argv, mode="run")  # +rnow_project=DIR (a ReinforceNow project) → its translated config
    return run_main(load_config(argv))
