"""Small process helpers shared by the launchers (vLLM engines, ART's server processes, Ray-placed servers) and the
commands that stop on a signal (ng_try, ng_collect_rollouts)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["die_with_parent", "signal_group", "run_interruptible", "free_port", "free_ports"]

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1  # prctl(2)
# libc loaded here, in the parent: the forked child then only calls prctl, and never dlopen (whose lock another
# thread of the parent may have held at the fork; preexec_fn code must stay that small)
_PRCTL = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl


def die_with_parent() -> None:
    """In a child before exec (`Popen(preexec_fn=die_with_parent)`): ask Linux to send SIGTERM when the parent
    thread dies, so a server never outlives the process that started it (no-op on other systems)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now on `host`, for a process that binds by itself (vLLM, a NeMo Gym server, Ray): a tiny
    window for a race remains between this answer and its bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports free now on `host`, for processes that bind by themselves (the NeMo Gym servers of
    a run, a Ray head's services). Every socket stays bound until all are drawn: drawn one at a time (`free_port`),
    the kernel can hand out a port it has just released, and two servers of one run got the same port. The window
    between this answer and each process's own bind remains (`NemoGymLauncher.lost_port` starts them again).

    Raises:
        OSError: `host` is not an address of this machine, or no port is left.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group led by `pid` (a child started with `start_new_session=True`); a group
    that is gone already, or not ours, is ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def run_interruptible(main: Coroutine[Any, Any, T], signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> T:
    """`asyncio.run(main)`, where the first of `signals` cancels `main` and then raises KeyboardInterrupt.

    Unlike `asyncio.run`'s own Ctrl-C handling, this works whatever SIGINT's disposition was when the process started:
    a non-interactive shell starts background jobs (`cmd &`) with SIGINT ignored, and Python then never raises
    KeyboardInterrupt, so `kill -INT` (and a test's SIGINT) would be ignored. The handlers live in the event loop
    (`loop.add_signal_handler`), which wakes on the signal. A second signal while `main` is being cancelled gets the
    usual behaviour (KeyboardInterrupt / termination); the previous dispositions are restored at the end. Outside the
    main thread (where Python allows no signal handler) it is plain `asyncio.run(main)`.

    Raises:
        KeyboardInterrupt: one of `signals` arrived and `main` ended by its cancellation.
    """

    async def guarded() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        received: list[int] = []
        previous = {sig: signal.getsignal(sig) for sig in signals}

        def on_signal(sig: int) -> None:
            received.append(sig)
            loop.remove_signal_handler(sig)  # back to KeyboardInterrupt (SIGINT) / SIG_DFL for a second signal
            task.cancel()

        for sig in signals:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await main
        except asyncio.CancelledError:
            if received:
                raise KeyboardInterrupt from None
            raise
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)  # False (nothing done) for the one already removed by on_signal
                signal.signal(sig, previous[sig] if previous[sig] is not None else signal.SIG_DFL)

    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    return asyncio.run(guarded())
