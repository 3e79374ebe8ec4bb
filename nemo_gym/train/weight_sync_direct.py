"""The weight syncs without files (`nemo_gym.train.weight_sync` has the interface, the filesystem sync and
`make_weight_sync`): `BroadcastWeightSync` (a process group of the trainer's rank 0 and vLLM's workers; nccl, or gloo
through host memory) and `CudaIpcWeightSync` (the trainer and vLLM on one GPU share a buffer by a CUDA IPC handle),
both through vllm_model's `/weight_sync/*` routes (`PolicyRoutes`), and `choose_backend`, which picks the backend from
where the trainer and vLLM's workers are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx

from nemo_gym.common.errors import ConfigError, ServerError
from nemo_gym.serving.auth import TOKEN_HEADER

if TYPE_CHECKING:
    from nemo_gym.train.engine import PolicyEngine

__all__ = ["PolicyRoutes", "BroadcastWeightSync", "CudaIpcWeightSync", "choose_backend"]

SYNC_ROUTE = "/weight_sync"  # vllm_model's /weight_sync/{workers,init,update,ipc_open,close}
DEFAULT_BUCKET_BYTES = 1 << 30  # the shared buffer of cuda_ipc holds at most this (or the largest weight): 1 GiB


def choose_backend(requested: str, trainer_device: str, trainer_uuid: str | None, workers: list[dict[str, Any]]) -> str:
    """The backend for `requested` (`auto`, `gloo`, `nccl` or `cuda_ipc`) given where the trainer's rank 0 is
    (`trainer_device`, e.g. "cuda:0", with its CUDA UUID) and the vLLM workers (vllm_model's `/weight_sync/workers`:
    `device`, `device_uuid` each). `auto`: cuda_ipc when every worker is on the trainer's GPU, nccl when none is,
    gloo when some are, or when the trainer or a worker is not on CUDA.

    Raises:
        ConfigError: nccl or cuda_ipc asked where it cannot run: the trainer or a worker is not on a CUDA GPU; nccl
            with a worker on the trainer's GPU (NCCL refuses two ranks on one device); cuda_ipc with a worker on
            another GPU (IPC handles open on the GPU that made them).
    """
    on_cuda = trainer_device.startswith("cuda") and all(str(w.get("device", "")).startswith("cuda") for w in workers)
    shared = [w for w in workers if trainer_uuid is not None and w.get("device_uuid") == trainer_uuid]
    if requested == "gloo" or (requested == "auto" and (not on_cuda or 0 < len(shared) < len(workers))):
        return "gloo"
    if requested == "auto":
        return "cuda_ipc" if shared else "nccl"
    if not on_cuda:
        where = ", ".join(str(w.get("device")) for w in workers)
        raise ConfigError(
            f"trainer.weight_sync: {requested} needs the trainer and vLLM on CUDA GPUs; the trainer is on"
            f" {trainer_device}, vLLM's workers on {where}; use gloo or filesystem"
        )
    if requested == "cuda_ipc":
        elsewhere = [w for w in workers if w not in shared]
        if elsewhere:
            raise ConfigError(
                "trainer.weight_sync: cuda_ipc shares memory on one GPU, and vLLM's worker rank"
                f" {elsewhere[0].get('rank')} is on another ({elsewhere[0].get('device')},"
                f" {elsewhere[0].get('device_uuid')}; the trainer: {trainer_device}, {trainer_uuid}); use nccl (vLLM on"
                " other GPUs) or auto"
            )
        return "cuda_ipc"
    if shared:
        raise ConfigError(
            "trainer.weight_sync: nccl cannot connect two processes on one GPU, and vLLM's worker rank"
            f" {shared[0].get('rank')} is on the trainer's GPU ({trainer_device}, {trainer_uuid}); give vLLM other GPUs"
            " (CUDA_VISIBLE_DEVICES in the policy server's engine_env) or use +trainer.weight_sync=cuda_ipc (shared"
            " GPU memory), gloo (the broadcast through host memory) or auto"
        )
    return "nccl"


class PolicyRoutes:
    """vllm_model's `/weight_sync/*` routes at `policy_url`, over HTTP (`run_token`: the ng_run's token)."""

    def __init__(self, policy_url: str, *, run_token: str | None = None, timeout_s: float = 600.0):
        self.policy_url = policy_url.rstrip("/")
        self.headers = {TOKEN_HEADER: run_token} if run_token else {}
        self.timeout_s = timeout_s

    def post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """Raises ServerError: unreachable, no such route (404/405: not a vllm_model with it), or a failure there."""
        url = f"{self.policy_url}{SYNC_ROUTE}/{route}"
        try:
            answer = httpx.post(url, json=body, headers=self.headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServerError(f"weight sync: {url} unreachable: {exc}", path=f"{SYNC_ROUTE}/{route}") from exc
        if answer.status_code in (404, 405):
            raise ServerError(
                f"weight sync: the policy server at {self.policy_url} has no POST {SYNC_ROUTE}/{route}; use"
                " +trainer.weight_sync=filesystem, or a vllm_model that has it",
                path=f"{SYNC_ROUTE}/{route}",
            )
        if answer.status_code >= 400:
            raise ServerError(
                f"weight sync: {SYNC_ROUTE}/{route} answered {answer.status_code}: {answer.text[:2000]}",
                path=f"{SYNC_ROUTE}/{route}",
            )
        return answer.json()

    def workers(self) -> list[dict[str, Any]]:
        """vLLM's workers as vllm_model reports them: `rank`, `device`, `device_uuid` each.

        Raises:
            ServerError: the policy server has no such route (404: not a vllm_model with the weight syncs) or failed.
        """
        return self.post("workers", {})["workers"]


class BroadcastWeightSync:
    """The trainer's rank 0 broadcasts every tensor to the vLLM workers (see the module docstring).

    Args:
        policy_url: the vllm_model server (its `/weight_sync/*` routes).
        backend: `auto`, `gloo` or `nccl` (`choose_backend`).
        host: this machine's address as the vLLM workers reach it (the group's store listens there).
        run_token: the policy server's ng_run token (`nemo_gym.serving.auth`), sent as its header.
        timeout_s: bound of the group's set-up, of each broadcast and of each HTTP call.
    """

    def __init__(
        self,
        policy_url: str,
        *,
        backend: str = "auto",
        host: str = "127.0.0.1",
        run_token: str | None = None,
        timeout_s: float = 600.0,
    ):
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError(
                f"BroadcastWeightSync backend {backend!r}: auto, gloo or nccl (cuda_ipc: CudaIpcWeightSync)"
            )
        self.routes = PolicyRoutes(policy_url, run_token=run_token, timeout_s=timeout_s)
        self.policy_url = self.routes.policy_url
        self.requested, self.host, self.timeout_s = backend, host, timeout_s
        self.backend: str | None = None
        self.group: Any = None
        self.last: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-http")
        self._post = self.routes.post
        self.workers = self.routes.workers

    def connect(self, trainer_device: Any) -> str:
        """Form the group with the vLLM workers (blocking until all joined and a probe broadcast went through);
        returns the backend. `trainer_device`: the torch device of the trainer's rank 0 (the engine's `device`).

        Raises:
            ConfigError: the backend cannot run here (`choose_backend`).
            ServerError: the workers failed to join (their error, from vllm_model).
        """
        import torch

        from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport

        device = torch.device(trainer_device)
        workers = self.workers()
        self.backend = choose_backend(self.requested, str(device), transport.device_uuid(device), workers)
        if self.backend == "cuda_ipc":  # auto on one GPU: this class broadcasts, so through host memory
            self.backend = "gloo"
        world_size = 1 + len(workers)
        store = transport.tcp_store(self.host, 0, world_size, is_master=True, timeout_s=self.timeout_s)
        body = {
            "host": self.host,
            "port": store.port,
            "world_size": world_size,
            "backend": self.backend,
            "timeout_s": self.timeout_s,
        }
        joining = self._pool.submit(self._post, "init", body)
        try:
            self.group = transport.WeightSyncGroup(
                self.backend,
                store,
                0,
                world_size,
                host=self.host,
                timeout_s=self.timeout_s,
                device=device if self.backend == "nccl" else None,
            )
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
        from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport

        if self.group is None:
            self.connect(engine.device)
        started = time.monotonic()
        state = engine.export_state_dict(
            on_device=True
        )  # no copy; send_tensors moves one tensor at a time to the group's device
        exported = time.monotonic()
        metas = [transport.TensorMeta.of(name, tensor) for name, tensor in state.items()]
        receiving = self._pool.submit(
            self._post, "update", {"tensors_json": transport.metas_to_json(metas), "version": step}
        )
        transport.send_tensors(self.group, state.items(), abort_if=lambda: _failure(receiving))
        sent = time.monotonic()
        answer = receiving.result(timeout=self.timeout_s)
        now = time.monotonic()
        self.last = {
            **answer,
            "trainer_seconds": now - started,
            "export_seconds": exported - started,
            "send_seconds": sent - exported,
            "finish_seconds": now - sent,
        }
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


class CudaIpcWeightSync:
    """The trainer shares a buffer on its GPU with vLLM's worker on the same GPU (see the module docstring).

    Args:
        policy_url: the vllm_model server (its `/weight_sync/*` routes).
        run_token: the policy server's ng_run token (`nemo_gym.serving.auth`), sent as its header.
        timeout_s: bound of each HTTP call.
        bucket_bytes: the most the buffer holds (a larger model goes over in several buckets; the buffer is at
            least the largest weight).
        allocate, share: make the buffer (bytes, device → 1-D uint8 tensor) and its JSON handle; default a CUDA
            tensor and `share_cuda_buffer`. Tests pass host-memory ones to run the same path between CPU processes.
    """

    def __init__(
        self,
        policy_url: str,
        *,
        run_token: str | None = None,
        timeout_s: float = 600.0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        allocate: Callable[[int, Any], Any] | None = None,
        share: Callable[[Any], str] | None = None,
    ):
        self.routes = PolicyRoutes(policy_url, run_token=run_token, timeout_s=timeout_s)
        self.bucket_bytes = bucket_bytes
        self.backend = "cuda_ipc"
        self.device: Any = None
        self.buffer: Any = None
        self.buffer_json: str | None = None
        self.last: dict[str, Any] = {}
        self._allocate, self._share = allocate, share

    def connect(self, trainer_device: Any, *, check: bool = True) -> str:
        """Check that every vLLM worker is on the trainer's GPU (`check`: `choose_backend`), then share a small buffer
        and have the workers open it and read it back (`POST /weight_sync/ipc_open`); returns "cuda_ipc".

        Raises:
            ConfigError: a worker is not on the trainer's GPU. ServerError: a worker could not open the buffer, or read
                other bytes than the trainer wrote.
        """
        import torch

        from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport

        self.device = torch.device(trainer_device)
        if check:
            choose_backend("cuda_ipc", str(self.device), transport.device_uuid(self.device), self.routes.workers())
        self._share_buffer(transport.PROBE_BYTES)
        return self.backend

    def _share_buffer(self, num_bytes: int) -> None:
        """A new buffer of `num_bytes` with the probe pattern at its start, opened by every worker."""
        import torch

        from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport

        allocate = self._allocate or (lambda size, device: torch.empty(size, dtype=torch.uint8, device=device))
        buffer = allocate(num_bytes, self.device)
        pattern = transport.probe_pattern(num_bytes, buffer.device)
        buffer[: pattern.numel()].copy_(pattern)
        if buffer.device.type == "cuda":
            torch.cuda.synchronize(buffer.device)
        buffer_json = (self._share or transport.share_cuda_buffer)(buffer)
        expected = int(pattern.to(torch.int64).sum())
        for worker in self.routes.post("ipc_open", {"buffer_json": buffer_json})["workers"]:
            if worker.get("checksum") != expected:
                raise ServerError(
                    f"weight sync cuda_ipc: vLLM's worker rank {worker.get('rank')} read other bytes from the shared"
                    f" buffer (checksum {worker.get('checksum')}, written {expected})",
                    path=f"{SYNC_ROUTE}/ipc_open",
                )
        self.buffer, self.buffer_json = buffer, buffer_json

    def push(self, engine: PolicyEngine, step: int) -> dict[str, Any]:
        """Copy the engine's weights into the buffer bucket by bucket, each loaded by vLLM before the next; returns
        the last bucket's answer with the totals: `tensors`, `bytes`, `buckets`, `trainer_seconds` in all, of which
        `export_seconds` (gathering the state dict) and `copy_seconds` (into the buffer).

        Raises:
            ServerError: the update failed on the policy server.
        """
        import torch

        from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport

        if self.buffer is None:
            self.connect(engine.device)
        started = time.monotonic()
        state = engine.export_state_dict(on_device=True)
        exported = time.monotonic()
        buckets = transport.plan_buckets(
            [transport.TensorMeta.of(name, tensor) for name, tensor in state.items()], self.bucket_bytes
        )
        needed = max(transport.bucket_end(bucket) for bucket in buckets)
        if needed > self.buffer.numel():
            self._share_buffer(needed)
        copy_seconds, answer = 0.0, {}
        for index, bucket in enumerate(buckets):
            copying = time.monotonic()
            with torch.no_grad():
                for name, view in transport.buffer_views(self.buffer, bucket):
                    view.copy_(state[name])
            if self.buffer.device.type == "cuda":
                torch.cuda.synchronize(self.buffer.device)
            copy_seconds += time.monotonic() - copying
            body = {
                "tensors_json": transport.layout_to_json(bucket),
                "version": step,
                "buffer_json": self.buffer_json,
                "reset_prefix_cache": index == len(buckets) - 1,
            }
            answer = self.routes.post("update", body)
        total_bytes = sum(meta.num_bytes for bucket in buckets for meta, _ in bucket)
        now = time.monotonic()
        self.last = {
            **answer,
            "tensors": len(state),
            "bytes": total_bytes,
            "buckets": len(buckets),
            "trainer_seconds": now - started,
            "export_seconds": exported - started,
            "copy_seconds": copy_seconds,
        }
        return self.last

    def close(self) -> None:
        """The workers drop the buffer (best effort), then this process frees it."""
        if self.buffer is not None:
            try:
                self.routes.post("close", {})
            except ServerError:
                pass
        self.buffer = self.buffer_json = None
