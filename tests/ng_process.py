"""Start `ng_run` as a real process for tests and stop it by PID (`NgRun` lives in `nemo_gym.testing`)."""

from __future__ import annotations

import sys
from pathlib import Path

from nemo_gym.testing import NgRun

__all__ = ["BIN", "REPO", "NgRun"]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
