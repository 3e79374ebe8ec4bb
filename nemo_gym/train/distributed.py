"""Several training ranks on one machine: torch's launcher, rank 0 as the only client of the gym, and the few
collectives the trainer adds to DeepSpeed's.

Launch: `ng_train ... +trainer.num_ranks=N` (N > 1) relaunches itself as
`python -m torch.distributed.run --nproc_per_node=N ... -m nemo_gym.train.distributed <same args>`, so the command
stays the same. Started by a launcher already (`torchrun -m nemo_gym.train.distributed ...`,
`deepspeed --module nemo_gym.train.distributed ...`: `WORLD_SIZE` > 1 in the environment), it runs as the
launcher's ranks and `num_ranks` is not used.

Division of work: rank 0 alone talks to the gym (starts or attaches to ng_run, collects rollouts, evaluates,
writes metrics, checkpoint metadata and HF folders, syncs the weights to vLLM); it broadcasts each step's
`TrainingBatch` and every control decision (go on, stop, checkpoint) to the other ranks over a gloo group
(`broadcast_from_main`), so every rank takes the same collectives in the same order. Each rank trains on its
contiguous share of the batch's sequences (`shard`); `PolicyEngine.train_step` keeps the loss equal to the one-rank
loss of the same global batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any, TypeVar

from nemo_gym.common.processes import free_port
from nemo_gym.config import commands

__all__ = [
    "world_size",
    "rank",
    "is_main",
    "needs_relaunch",
    "launcher_command",
    "relaunch",
    "broadcast_from_main",
    "all_gather",
    "shard",
    "shutdown",
]

T = TypeVar("T")
WORKER_MODULE = "nemo_gym.train.distributed"  # `python -m` of this module runs `ng_train` (see the bottom)
# How long a rank waits for rank 0 (its rollouts and evaluations take as long as they take); the launcher stops the
# other ranks at once when one fails, so this bounds only a rank 0 that hangs.
CONTROL_TIMEOUT = timedelta(hours=24)
_control_group: Any = None


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Ranks of this training run: torch.distributed's when initialised, else `WORLD_SIZE` (default 1)."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's global rank: torch.distributed's when initialised, else `RANK` (default 0)."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0: the only rank that talks to the gym servers and writes the run's files."""
    return rank() == 0


def needs_relaunch(num_ranks: int) -> bool:
    """True when `num_ranks` > 1 and no launcher started this process with several ranks."""
    return num_ranks > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1


def launcher_command(num_ranks: int, argv: list[str], master_port: int) -> list[str]:
    """torch's launcher running `ng_train argv` as `num_ranks` local ranks on 127.0.0.1:`master_port`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={num_ranks}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={master_port}",
        "-m",
        WORKER_MODULE,
        *argv,
    ]


def relaunch(num_ranks: int, argv: list[str]) -> int:
    """Run `ng_train argv` as `num_ranks` ranks under torch's launcher and wait; returns its exit status.

    The launcher runs in its own session, and SIGINT / SIGTERM sent to this process are forwarded to it once (it
    forwards them once to every rank): Ctrl-C and `ng_runs stop` reach the ranks exactly once, as in one process.
    Each rank gets `OMP_NUM_THREADS` = cores / ranks unless it is set. Returns 128 + the signal number when a
    forwarded signal ended the run with a non-zero status (the launcher itself exits with 1).
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // num_ranks)))
    command = launcher_command(num_ranks, argv, free_port())
    launcher = command[: len(command) - len(argv)]  # the arguments may hold secrets: not printed
    print(f"ng_train: {num_ranks} ranks: {' '.join(launcher)} <the same arguments>", flush=True)
    process = subprocess.Popen(command, env=env, start_new_session=True)
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        process.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = process.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 + received[0] if received and status != 0 else status


def _group() -> Any:
    """The gloo group of the control messages (created once, collectively, on first use)."""
    global _control_group
    if _control_group is None:
        import torch.distributed as dist

        _control_group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return _control_group


def broadcast_from_main(value: T) -> T:
    """Rank 0's `value` on every rank (pickled; tensors stay on the CPU). With one rank: `value` as is."""
    if world_size() == 1:
        return value
    import torch.distributed as dist

    box = [value if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=_group())
    return box[0]


def all_gather(value: T) -> list[T]:
    """Every rank's `value`, in rank order. With one rank: `[value]`."""
    if world_size() == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world_size()
    dist.all_gather_object(values, value, group=_group())
    return values


def shutdown() -> None:
    """End this rank's part in the run: wait for every rank (gloo barrier), then destroy the process groups.

    Called once at the end of a finished or stopped `ng_train` on every rank (not after an error: the other ranks
    may be inside another collective). Without it the groups are torn down by the interpreter's exit,
    where gloo's worker threads can abort the process ("terminate called without an active exception", SIGABRT)
    after the run has finished, and torch's launcher then reports the whole run as failed. No-op with one rank (its
    single-process group stays for later runs in the same process).
    """
    global _control_group
    if not _initialized() or world_size() == 1:
        return
    import torch.distributed as dist

    try:
        dist.barrier(group=_group())
    finally:
        _control_group = None
        dist.destroy_process_group()


def shard(num_rows: int, rank: int, world_size: int) -> slice:
    """Rows of rank `rank`: a contiguous split of `num_rows` rows, the first `num_rows % world_size` ranks one row more.

    Example: 5 rows over 2 ranks → rows 0:3 and 3:5; 1 row over 2 ranks → 0:1 and 1:1 (empty).
    """
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


if __name__ == "__main__":  # one rank of ng_train (see `launcher_command`)
    # the deepspeed launcher appends --local_rank=<n> (also in LOCAL_RANK, which DeepSpeed reads) unless --no_local_rank
    sys.exit(
        commands.main("train", [arg for arg in sys.argv[1:] if not arg.startswith(("--local_rank=", "--local-rank="))])
    )
