"""Start `ng_run` as a real process for tests and stop it by PID (`NgRun` lives in `nemo_gym.testing`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nemo_gym.testing import NgRun

__all__ = ["BIN", "REPO", "NgRun", "LAUNCHER_ENV", "clean_env"]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# the torch.distributed variables a one-rank engine of the test process sets (engine.set_single_process_env)
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env() -> dict[str, str]:
    """This process's environment without LAUNCHER_ENV, one OpenMP thread: for a child that starts its own ranks."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV} | {"OMP_NUM_THREADS": "1"}
