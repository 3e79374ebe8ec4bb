"""Small process helpers shared by the launchers (vLLM engines, ART's server processes, Ray-placed servers)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent", "signal_group"]

_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent() -> None:
    """In a child before exec (`Popen(preexec_fn=die_with_parent)`): ask Linux to send SIGTERM when the parent
    thread dies, so a server never outlives the process that started it (no-op on other systems)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group led by `pid` (a child started with `start_new_session=True`); a group
    that is gone already, or not ours, is ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
