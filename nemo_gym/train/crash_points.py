"""Named crash points of the trainer: a test hook for the kill matrix, which checks that resume is exact after a
SIGKILL anywhere (tests/chaos/test_train_kill.py).

With `NEMO_GYM_CRASH_AT=<point>@<step>` in its environment, `ng_train` SIGKILLs itself (its whole process group
when it leads one, as a test that starts it with `start_new_session=True` arranges) on reaching `<point>` while
working on step `<step>` (1-based: the step being trained or checkpointed). Without the variable nothing happens
and nothing is registered. The points:

    backward          after the first micro-batch's backward of the step (gradients partly accumulated)
    optimizer_step    inside DeepSpeed's step, right after AdamW updated the weights in memory (the LR schedule
                      and the step counter not yet advanced)
    checkpoint_file   inside DeepSpeed's checkpoint write, after its first file: the step's folder is torn
    checkpoint_state  after the DeepSpeed files and trainer_state.json, before rng_state.pt and `latest_step`

A SIGKILL cannot be caught: what is on disk at that moment is all a resume has, which is what the test checks.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["CRASH_AT_ENV", "POINTS", "armed", "reached"]

CRASH_AT_ENV = "NEMO_GYM_CRASH_AT"
POINTS = ("backward", "optimizer_step", "checkpoint_file", "checkpoint_state")


def _target() -> tuple[str, int] | None:
    """(point, step) from `NEMO_GYM_CRASH_AT`, or None when it is unset.

    Raises:
        ValueError: the value is not `<point>@<step>` with a known point and an integer step.
    """
    value = os.environ.get(CRASH_AT_ENV)
    if not value:
        return None
    point, _, step = value.partition("@")
    if point not in POINTS or not step.isdigit():
        raise ValueError(f"{CRASH_AT_ENV}={value!r}: expected <point>@<step> with point one of {', '.join(POINTS)}")
    return point, int(step)


def armed(point: str) -> bool:
    """Whether `NEMO_GYM_CRASH_AT` names `point` (so a caller registers the hook that reaches it only then)."""
    target = _target()
    return target is not None and target[0] == point


def reached(point: str, step: int) -> None:
    """SIGKILL this process group (or this process, when it leads none) if `NEMO_GYM_CRASH_AT` is `point@step`."""
    if _target() != (point, step):
        return
    print(f"ng_train: {CRASH_AT_ENV}={point}@{step}: SIGKILL now", file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
