"""Weight broadcast from the trainer's rank 0 to the vLLM workers: one code path, two backends.

Both sides import this file: the trainer (`nemo_gym.train.weight_sync.BroadcastWeightSync`) and every vLLM worker,
into which vLLM mixes `WeightSyncWorkerExtension` (`--worker-extension-cls
weight_sync_worker.WeightSyncWorkerExtension`,
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

Limits: NCCL cannot put two ranks on one GPU ("Duplicate GPU detected"). Per step: one HTTP call (`collective_rpc`)
carries the list of (name, dtype, shape); then one broadcast per tensor.

**CUDA IPC** (backend `cuda_ipc`, the trainer and vLLM on one GPU, no process group): the trainer copies the weights
into a buffer of its own on the GPU (one uint8 tensor, each weight at an offset aligned to ALIGN_BYTES; `plan_buckets`
cuts them into buckets when they do not fit), and shares it once by a CUDA IPC handle: `share_cuda_buffer` runs
torch's `reduce_tensor` (what torch.multiprocessing sends between processes) and writes its arguments as JSON, never a
pickle (`BufferHandle`). The worker opens it (`open_cuda_buffer`: torch's `rebuild_cuda_tensor` with its own device
index, since vLLM's CUDA_VISIBLE_DEVICES may number the GPU differently), so both processes see the same memory; per
bucket an HTTP call carries [name, dtype, shape, offset] of each weight, and the worker hands views of the buffer to
`model.load_weights`, the in-place load verl and TRL use on CUDA. Nothing is copied through host memory. This is the
colocated path of vLLM's RLHF example and of verl (its vLLM worker extension's IPC update): the same torch calls, our
own JSON for the handle.
"""

from __future__ import annotations

import base64
import datetime
import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "BACKENDS",
    "WORKER_EXTENSION",
    "TensorMeta",
    "tcp_store",
    "WeightSyncGroup",
    "send_tensors",
    "receive_tensors",
    "device_uuid",
    "plan_buckets",
    "layout_to_json",
    "layout_from_json",
    "buffer_views",
    "share_cuda_buffer",
    "open_buffer",
    "BUFFER_OPENERS",
    "probe_pattern",
    "WeightSyncWorkerExtension",
]

BACKENDS = ("gloo", "nccl")
WORKER_EXTENSION = "weight_sync_worker.WeightSyncWorkerExtension"
STORE_PREFIX = "weight_sync_worker"
ALIGN_BYTES = 256  # offsets in the shared buffer: any dtype's view is aligned, and so are CUDA's vector loads
PROBE_BYTES = 4096  # the pattern the trainer writes at the start of the shared buffer (`probe_pattern`)


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
    uuid = getattr(
        torch.cuda.get_device_properties(index), "uuid", None
    )  # torch's device properties carry it since 2.1
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

    def __init__(
        self,
        backend: str,
        store: dist.Store,
        rank: int,
        world_size: int,
        *,
        host: str = "127.0.0.1",
        timeout_s: float = 600.0,
        device: torch.device | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"weight sync backend {backend!r}: use one of {', '.join(BACKENDS)}")
        if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise ValueError(
                "weight sync backend nccl needs a CUDA GPU and torch built with NCCL (torch.cuda.is_available() is"
                " False here); use gloo or the filesystem sync"
            )
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
            raise RuntimeError(
                f"weight sync group ({self.backend}): the probe broadcast arrived wrong on rank {self.rank}"
            )

    def close(self) -> None:
        """Release the backend's resources (NCCL communicators); the store closes with the object."""
        shutdown = getattr(self.group, "shutdown", None)
        if self.backend == "nccl" and callable(shutdown):
            shutdown()


def send_tensors(
    group: WeightSyncGroup,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    abort_if: Callable[[], BaseException | None] | None = None,
) -> int:
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


# -- CUDA IPC (backend cuda_ipc) ------------------------------------------------------------------------------------
Placed = tuple[TensorMeta, int]  # a weight and its byte offset in the shared buffer


def plan_buckets(metas: Iterable[TensorMeta], bucket_bytes: int) -> list[list[Placed]]:
    """Cut `metas` (in order) into buckets of at most `bucket_bytes` each (a weight larger than that gets a bucket of
    its own), each weight at an offset aligned to ALIGN_BYTES from its bucket's start. The shared buffer must hold
    `bucket_end(b)` bytes for every bucket b."""
    buckets: list[list[Placed]] = [[]]
    end = 0
    for meta in metas:
        offset = -(-end // ALIGN_BYTES) * ALIGN_BYTES
        if buckets[-1] and offset + meta.num_bytes > bucket_bytes:
            buckets.append([])
            offset = 0
        buckets[-1].append((meta, offset))
        end = offset + meta.num_bytes
    return [bucket for bucket in buckets if bucket]


def bucket_end(bucket: list[Placed]) -> int:
    """The bytes of the shared buffer that `bucket` uses."""
    return max((offset + meta.num_bytes for meta, offset in bucket), default=0)


def layout_to_json(bucket: list[Placed]) -> str:
    return json.dumps([[m.name, m.dtype, list(m.shape), offset] for m, offset in bucket])


def layout_from_json(text: str) -> list[Placed]:
    """Raises ValueError for a malformed list, an unknown dtype or an offset that is not aligned."""
    rows = json.loads(text)
    metas = metas_from_json(json.dumps([row[:3] for row in rows]))
    placed = [(meta, int(row[3])) for meta, row in zip(metas, rows)]
    for meta, offset in placed:
        if offset < 0 or offset % ALIGN_BYTES:
            raise ValueError(f"{meta.name}: offset {offset} is not a multiple of {ALIGN_BYTES}")
    return placed


def buffer_views(buffer: torch.Tensor, bucket: list[Placed]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, view of `buffer` as the weight's dtype and shape) for each placed weight (`buffer`: uint8, 1-D).

    Raises:
        ValueError: a weight reaches past the end of the buffer.
    """
    for meta, offset in bucket:
        if offset + meta.num_bytes > buffer.numel():
            raise ValueError(
                f"{meta.name}: bytes {offset}..{offset + meta.num_bytes} are past the shared buffer's {buffer.numel()}"
            )
        yield meta.name, buffer[offset : offset + meta.num_bytes].view(getattr(torch, meta.dtype)).reshape(meta.shape)


def probe_pattern(num_bytes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The bytes the trainer writes at the start of the shared buffer before the workers open it: i mod 251."""
    return (torch.arange(min(num_bytes, PROBE_BYTES), device=device) % 251).to(torch.uint8)


_CLASSES = {
    f"{cls.__module__}.{cls.__qualname__}": cls
    for cls in (torch.Tensor, torch.nn.Parameter, torch.storage.TypedStorage, torch.UntypedStorage)
}


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        name = f"{value.__module__}.{value.__qualname__}"
        if name not in _CLASSES:
            raise ValueError(f"cannot share a {name} by CUDA IPC")
        return {"class": name}
    if isinstance(value, (torch.Size, tuple)):
        return {"tuple": [_encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot write {type(value).__name__} {value!r} into a CUDA IPC handle")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "bytes" in value:
        return base64.b64decode(value["bytes"])
    if "dtype" in value:
        return getattr(torch, value["dtype"])
    if "class" in value:
        return _CLASSES[value["class"]]  # KeyError: a class that was never shared (a forged handle)
    return tuple(_decode(v) for v in value["tuple"])


def share_cuda_buffer(buffer: torch.Tensor) -> str:
    """The JSON handle of a CUDA tensor for `open_buffer` in another process on the same GPU: torch's `reduce_tensor`
    arguments, by the names of `rebuild_cuda_tensor`'s parameters, plus the GPU's UUID. Keep `buffer` alive while
    any process uses it."""
    import inspect

    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    rebuild, args = reduce_tensor(buffer)
    if rebuild is not rebuild_cuda_tensor:
        raise ValueError(f"share_cuda_buffer needs a CUDA tensor, not one on {buffer.device}")
    names = list(inspect.signature(rebuild_cuda_tensor).parameters)
    return json.dumps(
        {
            "kind": "cuda",
            "device_uuid": device_uuid(buffer.device),
            "num_bytes": buffer.numel() * buffer.element_size(),
            "args": {n: _encode(a) for n, a in zip(names, args)},
        }
    )


def open_cuda_buffer(handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    """The trainer's shared buffer in this process, on `device` (this process's index of the same GPU)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = {name: _decode(value) for name, value in handle["args"].items()}
    args["storage_device"] = device.index if device.index is not None else torch.cuda.current_device()
    return rebuild_cuda_tensor(**args)


# How a worker opens a handle of each kind; tests add a host-memory kind to run the same path between CPU processes.
BUFFER_OPENERS: dict[str, Callable[[dict[str, Any], torch.device], torch.Tensor]] = {"cuda": open_cuda_buffer}


def open_buffer(handle_json: str, device: torch.device) -> torch.Tensor:
    """Open a shared buffer from its JSON handle (`share_cuda_buffer`).

    Raises:
        ValueError: a handle of an unknown kind.
    """
    handle = json.loads(handle_json)
    opener = BUFFER_OPENERS.get(handle.get("kind"))
    if opener is None:
        raise ValueError(f"shared buffer of kind {handle.get('kind')!r}: this worker opens {', '.join(BUFFER_OPENERS)}")
    return opener(handle, device)


class WeightSyncWorkerExtension:
    """Mixed into each vLLM worker (`--worker-extension-cls`); its methods are called through vLLM's
    `collective_rpc` (the `POST /collective_rpc` dev route, `VLLM_SERVER_DEV_MODE=1`) by `vllm_model`'s
    `/weight_sync/*` routes. Names are prefixed: vLLM refuses an extension attribute that the worker already has.
    `self` is the vLLM worker (`rank`, `device`, `model_runner`)."""

    def weight_sync_worker_info(self) -> dict[str, Any]:
        """{"rank": global rank in vLLM, "device": e.g. "cuda:0" or "cpu", "device_uuid": CUDA UUID or null}."""
        device = _worker_device(self)
        return {"rank": int(getattr(self, "rank", 0)), "device": str(device), "device_uuid": device_uuid(device)}

    def weight_sync_worker_init(
        self, host: str, port: int, world_size: int, backend: str, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        """Join the group as rank 1 + this worker's rank and take the probe broadcast (`WeightSyncGroup.check`)."""
        old = getattr(self, "_weight_sync_worker", None)
        if old is not None:
            old.close()
        rank, world_size, timeout_s = 1 + int(getattr(self, "rank", 0)), int(world_size), float(timeout_s)
        store = tcp_store(host, int(port), world_size, is_master=False, timeout_s=timeout_s)
        group = WeightSyncGroup(
            backend, store, rank, world_size, host=host, timeout_s=timeout_s, device=_worker_device(self)
        )
        group.check()
        self._weight_sync_worker = group
        return {"rank": group.rank, "backend": backend}

    def weight_sync_worker_receive(self, metas_json: str) -> dict[str, Any]:
        """Receive the tensors listed in `metas_json` (`metas_to_json`) and load them into the running model.

        The received (name, tensor) pairs stream into vLLM's in-place reload
        (`Worker.reload_weights(weights_iterator=)`,
        which maps HF names onto vLLM's fused parameters and this worker's shard, and redoes the post-load processing
        that some backends apply, e.g. vLLM-CPU's repacked linear weights, where a bare `model.load_weights` fails
        with "'Parameter' object has no attribute 'weight_loader'"); a vLLM without it gets `model.load_weights`.
        Tensors the loader did not pull are still received (and dropped), so every broadcast of the trainer is matched.
        """
        group = getattr(self, "_weight_sync_worker", None)
        if group is None:
            raise RuntimeError("weight sync: weight_sync_worker_init was not called on this worker")
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
        return {
            "tensors": len(metas),
            "tensors_loaded": loaded,
            "bytes": sum(m.num_bytes for m in metas),
            "seconds": time.monotonic() - started,
        }

    def weight_sync_worker_ipc_open(self, buffer_json: str) -> dict[str, Any]:
        """Open the trainer's shared buffer (`open_buffer`) and keep it; → {"rank", "checksum": the sum of its first
        PROBE_BYTES bytes, which the trainer compares with `probe_pattern`'s}."""
        buffer = open_buffer(buffer_json, _worker_device(self))
        self._weight_sync_ipc = (buffer_json, buffer)
        probe = buffer[: min(buffer.numel(), PROBE_BYTES)]
        return {"rank": int(getattr(self, "rank", 0)), "checksum": int(probe.to(torch.int64).sum())}

    def weight_sync_worker_ipc_receive(self, buffer_json: str, tensors_json: str) -> dict[str, Any]:
        """Load the weights laid out in `tensors_json` (`layout_to_json`) from the shared buffer into the model:
        `model.load_weights` over views of the buffer (no copy until the model's own parameters), then wait for the
        copies, so the trainer may reuse the buffer when this returns."""
        opened = getattr(self, "_weight_sync_ipc", None)
        if opened is None or opened[0] != buffer_json:
            self.weight_sync_worker_ipc_open(buffer_json)
        buffer = self._weight_sync_ipc[1]
        started = time.monotonic()
        bucket = layout_from_json(tensors_json)
        with torch.no_grad():
            self.model_runner.model.load_weights(weights=list(buffer_views(buffer, bucket)))
        if buffer.device.type == "cuda":
            torch.cuda.synchronize(buffer.device)
        return {
            "tensors": len(bucket),
            "tensors_loaded": len(bucket),
            "bytes": sum(m.num_bytes for m, _ in bucket),
            "seconds": time.monotonic() - started,
        }

    def weight_sync_worker_close(self) -> None:
        group = getattr(self, "_weight_sync_worker", None)
        if group is not None:
            group.close()
            self._weight_sync_worker = None
        self._weight_sync_ipc = None  # the trainer's buffer is released when no process refers to it


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
