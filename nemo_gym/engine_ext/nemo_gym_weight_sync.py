"""Weight broadcast from the trainer's rank 0 to the vLLM workers: one code path, two backends.

Both sides import this file: the trainer (`nemo_gym.train.weight_sync.BroadcastWeightSync`) and every vLLM worker,
into which vLLM mixes `WeightSyncWorkerExtension` (`--worker-extension-cls nemo_gym_weight_sync.WeightSyncWorkerExtension`,
this folder on vLLM's PYTHONPATH; `vllm_model` starts vLLM so). It needs torch only: the engine venv has vLLM and
torch, not nemo_gym.

The group is *stateless*: its own `TCPStore` (the trainer's rank 0 is the store's master, on a port the OS picks)
and a process group built directly on it — torch's `ProcessGroupGloo` (backend `gloo`, CPU tensors) or
`ProcessGroupNCCL` (backend `nccl`, CUDA tensors) — never `torch.distributed.init_process_group`, so the trainer's
default world (DeepSpeed's) and vLLM's own groups are untouched. Ranks: the trainer's rank 0 is rank 0 (the root of
every broadcast); vLLM worker w is rank `1 + w` (w: its global rank in vLLM, so tensor-parallel workers each get the
whole tensor and load their shard). This is what vLLM's `stateless_init_torch_distributed_process_group` does; TRL,
OpenRLHF and verl sync the same way (a worker extension reached through `collective_rpc`, one broadcast per tensor,
`model.load_weights`).

Why torch's process groups and not vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`: the same two calls
(`broadcast`, `wait`) run over gloo between CPU processes (the CI test) and over NCCL on GPUs, and the trainer's
venv needs no vLLM (vLLM's classes are CUDA-only for NCCL and would pin the trainer to vLLM's torch).

Limits: NCCL cannot put two ranks on one GPU ("Duplicate GPU detected"): with the trainer and vLLM on the same GPU
use `gloo` (the tensors travel through host memory; `nemo_gym.train.weight_sync.choose_backend` picks it).
Per step: one HTTP call (`collective_rpc`) carries the list of (name, dtype, shape); then one broadcast per tensor.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["BACKENDS", "WORKER_EXTENSION", "TensorMeta", "tcp_store", "WeightSyncGroup", "send_tensors", "receive_tensors", "device_uuid", "WeightSyncWorkerExtension"]

BACKENDS = ("gloo", "nccl")
WORKER_EXTENSION = "nemo_gym_weight_sync.WeightSyncWorkerExtension"
STORE_PREFIX = "nemo_gym_weight_sync"


@dataclass(frozen=True)
class TensorMeta:
    """What a receiver allocates before a broadcast: the HF parameter name, dtype (torch's name, e.g. `bfloat16`)
    and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorMeta:
        return cls(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=getattr(torch, self.dtype), device=device)

    @property
    def num_bytes(self) -> int:
        return getattr(torch, self.dtype).itemsize * _numel(self.shape)


def metas_to_json(metas: Iterable[TensorMeta]) -> str:
    return json.dumps([[m.name, m.dtype, list(m.shape)] for m in metas])


def metas_from_json(text: str) -> list[TensorMeta]:
    """Raises ValueError for a malformed list or an unknown dtype."""
    metas = [TensorMeta(str(name), str(dtype), tuple(int(d) for d in shape)) for name, dtype, shape in json.loads(text)]
    for meta in metas:
        if not isinstance(getattr(torch, meta.dtype, None), torch.dtype):
            raise ValueError(f"{meta.name}: unknown dtype {meta.dtype!r}")
    return metas


def device_uuid(device: torch.device) -> str | None:
    """The CUDA device's UUID (NVML's, as `nvidia-smi -L` prints it without the `GPU-` prefix); None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)  # torch's device properties carry it since 2.1
    return str(uuid) if uuid is not None else None


def local_address_towards(host: str) -> str:
    """The local IP address whose route reaches `host` (127.0.0.1 for a loopback host): gloo binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))  # UDP: no packet is sent
        return sock.getsockname()[0]


def tcp_store(host: str, port: int, world_size: int, *, is_master: bool, timeout_s: float = 600.0) -> dist.TCPStore:
    """The group's rendezvous store: rank 0 (the trainer) listens (`port` 0: the OS picks one, read `.port`), the
    vLLM workers connect to `host:port`.

    Raises:
        RuntimeError: a worker could not reach the store within `timeout_s` (torch's DistNetworkError / DistStoreError).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(host, port, world_size, is_master=is_master, timeout=timeout, wait_for_workers=False)


class WeightSyncGroup:
    """One rank of the weight-sync group (see the module docstring). Construction blocks until every rank has joined
    (gloo connects all pairs then; NCCL at the first broadcast, which `check` does).

    Args:
        backend: `gloo` (tensors on the CPU) or `nccl` (tensors on `device`, a CUDA device).
        store: the rendezvous store (`tcp_store`), the same host:port on every rank.
        rank: 0 for the trainer, 1 + w for vLLM worker w.
        world_size: 1 + the number of vLLM workers.
        host: the address of the store's host, from which gloo finds the local interface to bind.
        timeout_s: bound of the connection and of every broadcast.
        device: the CUDA device of this rank (nccl; default the current one); ignored for gloo.

    Raises:
        ValueError: an unknown backend, or nccl where torch has no CUDA / NCCL.
        RuntimeError: not every rank joined within `timeout_s` (torch's DistStoreError and the like).
    """

    def __init__(self, backend: str, store: dist.Store, rank: int, world_size: int, *, host: str = "127.0.0.1", timeout_s: float = 600.0, device: torch.device | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"weight sync backend {backend!r}: use one of {', '.join(BACKENDS)}")
        if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise ValueError("weight sync backend nccl needs a CUDA GPU and torch built with NCCL (torch.cuda.is_available() is False here); use gloo or the filesystem sync")
        self.backend, self.rank, self.world_size = backend, rank, world_size
        timeout = datetime.timedelta(seconds=timeout_s)
        prefixed = dist.PrefixStore(STORE_PREFIX, store)
        if backend == "gloo":
            self.device = torch.device("cpu")
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address_towards(host))]
            self.group: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        else:
            from torch.distributed import ProcessGroupNCCL

            self.device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
            options = ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = ProcessGroupNCCL(prefixed, rank, world_size, options)
        self.store = store  # keep the store (and its server on rank 0) alive as long as the group

    def broadcast(self, tensor: torch.Tensor, *, abort_if: Callable[[], BaseException | None] | None = None) -> None:
        """Broadcast `tensor` (on `device`) from rank 0 to every rank, in place; blocks until done on this rank.

        `abort_if`, polled while waiting: a function returning an exception to raise instead of waiting on (the
        trainer's: the HTTP call that drives the receivers failed, so they will never join this broadcast).
        """
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        work = self.group.broadcast([tensor], options)
        if abort_if is not None:
            pause_s = 5e-5  # doubling up to 2 ms: small tensors finish in microseconds, a stalled peer costs no CPU
            while not work.is_completed():
                error = abort_if()
                if error is not None:
                    raise error
                time.sleep(pause_s)
                pause_s = min(2 * pause_s, 2e-3)
        work.wait()
        if self.backend == "nccl":
            torch.cuda.current_stream(self.device).synchronize()

    def check(self) -> None:
        """One broadcast of a small tensor: every rank joined, and the backend moves data (NCCL connects lazily)."""
        probe = torch.full((4,), 7.0 if self.rank == 0 else 0.0, device=self.device)
        self.broadcast(probe)
        if not bool((probe == 7.0).all()):
            raise RuntimeError(f"weight sync group ({self.backend}): the probe broadcast arrived wrong on rank {self.rank}")

    def close(self) -> None:
        """Release the backend's resources (NCCL communicators); the store closes with the object."""
        shutdown = getattr(self.group, "shutdown", None)
        if self.backend == "nccl" and callable(shutdown):
            shutdown()


def send_tensors(group: WeightSyncGroup, tensors: Iterable[tuple[str, torch.Tensor]], *, abort_if: Callable[[], BaseException | None] | None = None) -> int:
    """Rank 0: broadcast each tensor (moved to the group's device, made contiguous) in order; returns the bytes sent."""
    sent = 0
    for _, tensor in tensors:
        tensor = tensor.detach().to(group.device, non_blocking=False).contiguous()
        group.broadcast(tensor, abort_if=abort_if)
        sent += tensor.numel() * tensor.element_size()
    return sent


def receive_tensors(group: WeightSyncGroup, metas: Iterable[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks > 0: for each meta, allocate, receive rank 0's broadcast and yield (name, tensor on the group's device)."""
    for meta in metas:
        tensor = meta.empty(group.device)
        group.broadcast(tensor)
        yield meta.name, tensor


class WeightSyncWorkerExtension:
    """Mixed into each vLLM worker (`--worker-extension-cls`); its methods are called through vLLM's
    `collective_rpc` (the `POST /collective_rpc` dev route, `VLLM_SERVER_DEV_MODE=1`) by `vllm_model`'s
    `/weight_sync/*` routes. Names are prefixed: vLLM refuses an extension attribute that the worker already has.
    `self` is the vLLM worker (`rank`, `device`, `model_runner`)."""

    def nemo_gym_weight_sync_info(self) -> dict[str, Any]:
        """{"rank": global rank in vLLM, "device": e.g. "cuda:0" or "cpu", "device_uuid": CUDA UUID or null}."""
        device = _worker_device(self)
        return {"rank": int(getattr(self, "rank", 0)), "device": str(device), "device_uuid": device_uuid(device)}

    def nemo_gym_weight_sync_init(self, host: str, port: int, world_size: int, backend: str, timeout_s: float = 600.0) -> dict[str, Any]:
        """Join the group as rank 1 + this worker's rank and take the probe broadcast (`WeightSyncGroup.check`)."""
        old = getattr(self, "_nemo_gym_weight_sync", None)
        if old is not None:
            old.close()
        rank, world_size, timeout_s = 1 + int(getattr(self, "rank", 0)), int(world_size), float(timeout_s)
        store = tcp_store(host, int(port), world_size, is_master=False, timeout_s=timeout_s)
        group = WeightSyncGroup(backend, store, rank, world_size, host=host, timeout_s=timeout_s, device=_worker_device(self))
        group.check()
        self._nemo_gym_weight_sync = group
        return {"rank": group.rank, "backend": backend}

    def nemo_gym_weight_sync_receive(self, metas_json: str) -> dict[str, Any]:
        """Receive the tensors listed in `metas_json` (`metas_to_json`) and load them into the running model.

        The received (name, tensor) pairs stream into vLLM's in-place reload (`Worker.reload_weights(weights_iterator=)`,
        which maps HF names onto vLLM's fused parameters and this worker's shard, and redoes the post-load processing
        that some backends apply, e.g. vLLM-CPU's repacked linear weights, where a bare `model.load_weights` fails
        with "'Parameter' object has no attribute 'weight_loader'"); a vLLM without it gets `model.load_weights`.
        Tensors the loader did not pull are still received (and dropped), so every broadcast of the trainer is matched.
        """
        group = getattr(self, "_nemo_gym_weight_sync", None)
        if group is None:
            raise RuntimeError("weight sync: nemo_gym_weight_sync_init was not called on this worker")
        metas = metas_from_json(metas_json)
        started = time.monotonic()
        stream = receive_tensors(group, metas)
        pulled = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal pulled
            for item in stream:
                pulled += 1
                yield item

        with torch.no_grad():
            if _accepts(getattr(self, "reload_weights", None), "weights_iterator"):
                self.reload_weights(weights_iterator=counted())
            else:
                model = self.model_runner.model
                for name, tensor in counted():
                    model.load_weights(weights=[(name, tensor)])
            loaded = pulled
            for _ in stream:  # the rest of the trainer's broadcasts (a loader that stopped early)
                pass
        if group.device.type == "cuda":
            torch.cuda.synchronize(group.device)
        return {"tensors": len(metas), "tensors_loaded": loaded, "bytes": sum(m.num_bytes for m in metas), "seconds": time.monotonic() - started}

    def nemo_gym_weight_sync_close(self) -> None:
        group = getattr(self, "_nemo_gym_weight_sync", None)
        if group is not None:
            group.close()
            self._nemo_gym_weight_sync = None


def _accepts(function: Any, parameter: str) -> bool:
    """True when `function` is callable with the keyword `parameter`."""
    if not callable(function):
        return False
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return parameter in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _worker_device(worker: Any) -> torch.device:
    device = getattr(worker, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(worker.model_runner.model.parameters()).device


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
