"""Stopping `ng_train` cleanly on SIGTERM / SIGINT (`ng_runs stop`, Ctrl-C).

A signal sets `StopSignal.requested`. Where the trainer waits for rollouts (an `abandonable()` block: setup,
rollout collection, evaluation), the signal also raises `StopRequested` at once, so the step is abandoned;
elsewhere (the optimizer step, the weight sync, logging, checkpointing) the step finishes and the loop ends
before the next one. Then `run_stoppable` saves `output_dir/final` when the stop asked for it, and the trainer's
cleanup stops its servers. A second signal while stopping aborts at once.

Whether to save is read, when the signal arrives, from the JSON file `$NEMO_GYM_BACKGROUND_RUN_DIR/stop.json`
(`{"save_model": true}`), which `ng_runs stop +save_model=true` writes before sending SIGTERM; without it
(a foreground Ctrl-C, a plain `kill`) nothing is saved.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

__all__ = [
    "BACKGROUND_RUN_DIR_ENV",
    "STOP_REQUEST_FILE",
    "StopRequested",
    "StopSignal",
    "read_stop_request",
    "run_stoppable",
]

BACKGROUND_RUN_DIR_ENV = "NEMO_GYM_BACKGROUND_RUN_DIR"
STOP_REQUEST_FILE = "stop.json"
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(KeyboardInterrupt):
    """Raised by the signal handler inside an `abandonable()` block.

    A KeyboardInterrupt, so that `except Exception` in rollout code does not swallow it and asyncio propagates
    it out of the event loop (cancelling the pending rollouts) as it does for Ctrl-C.
    """


def read_stop_request(run_dir: str | Path | None = None) -> dict[str, Any]:
    """The stop request of the background run whose record folder is `run_dir` (default: this process's, from
    `$NEMO_GYM_BACKGROUND_RUN_DIR`); `{}` when there is none or it cannot be read."""
    run_dir = run_dir or os.environ.get(BACKGROUND_RUN_DIR_ENV)
    if not run_dir:
        return {}
    try:
        request = json.loads((Path(run_dir) / STOP_REQUEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return request if isinstance(request, dict) else {}


class StopSignal:
    """SIGTERM / SIGINT → a stop request (see the module docstring). Inert until `installed()`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.save_model = False
        self._abandonable_depth = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_status(self) -> int:
        """0 when no stop was requested, else 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 0 if self.signum is None else 128 + self.signum

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler: record the request; raise `StopRequested` inside an abandonable block or on a
        second signal."""
        if self.requested:
            print(f"ng_train: second {signal.Signals(signum).name}; aborting now", file=sys.stderr, flush=True)
            raise StopRequested()
        self.signum = signum
        self.save_model = bool(read_stop_request().get("save_model", False))
        action = "abandoning the current step" if self._abandonable_depth else "finishing the current step"
        saving = (
            "then saving final/" if self.save_model else "no final/ model (ng_runs stop +save_model=true saves one)"
        )
        print(
            f"ng_train: {signal.Signals(signum).name} received: {action}, {saving}; send it again to abort",
            file=sys.stderr,
            flush=True,
        )
        if self._abandonable_depth:
            raise StopRequested()

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """Handle SIGTERM and SIGINT inside the block (main thread only; elsewhere nothing is installed)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.handle) for s in _SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextlib.contextmanager
    def abandonable(self) -> Iterator[None]:
        """A block a stop may interrupt (waiting for rollouts): raises `StopRequested` on entry when a stop is
        already requested, and from the handler when one arrives inside."""
        if self.requested:
            raise StopRequested()
        self._abandonable_depth += 1
        try:
            yield
        finally:
            self._abandonable_depth -= 1


class Stoppable(Protocol):
    """What `run_stoppable` needs of a trainer (`nemo_gym.train.loop.TrainingLoop` has it)."""

    stop: StopSignal
    step: int
    out: Path

    def setup(self) -> None: ...

    def train(self) -> None: ...

    def cleanup(self) -> None: ...


def run_stoppable(trainer: Stoppable) -> int:
    """setup → train → (on a stop: save `final/` when asked) → cleanup, with the signal handlers installed.

    Returns the exit status: 0, or 128 + the signal number when stopped.
    """
    with trainer.stop.installed():
        try:
            with trainer.stop.abandonable():
                trainer.setup()
            trainer.train()
        except StopRequested:
            pass
        finally:
            try:
                if trainer.stop.requested:
                    _finish_stopped(trainer)
            finally:
                trainer.cleanup()
    return trainer.stop.exit_status


def _finish_stopped(trainer: Stoppable) -> None:
    engine = getattr(trainer, "engine", None)
    if trainer.stop.save_model and engine is not None:
        final = engine.save_hf(trainer.out / "final")
        print(f"ng_train: stopped after step {trainer.step}; model saved in {final}", flush=True)
    elif trainer.stop.save_model:
        print("ng_train: stopped during setup; no model to save", flush=True)
    else:
        print(f"ng_train: stopped after step {trainer.step}; no final model saved", flush=True)
