"""The policy server's side of the weight syncs (`nemo_gym.train.weight_sync`): the routes vllm_model adds.

- `POST /reload_weights {"model_dir"}`: the filesystem sync (vLLM's `reload_weights(weights_path=...)`).
- `POST /weight_sync/workers`, `/init`, `/update`, `/ipc_open`, `/close`: the broadcast syncs (gloo, nccl) and the
  shared-memory one (cuda_ipc), each a call of our worker extension's methods on every vLLM worker
  (`nemo_gym/model_servers/engine_ext/weight_sync_worker.py`) through vLLM's `/collective_rpc`.

The server passes three coroutines: `reload(model_dir) -> seconds`, `rpc(method, kwargs) -> [one result per worker]`
and `reset_cache()` (vLLM's prefix cache; `nemo_gym.model_servers.vllm_versions` for how its answer is read).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

__all__ = [
    "add_weight_sync_routes",
    "ReloadRequest",
    "WeightSyncInit",
    "WeightSyncUpdate",
    "IpcOpen",
    "checked_model_dir",
]

Rpc = Callable[[str, dict[str, Any]], Awaitable[list[Any]]]


class ReloadRequest(BaseModel):
    model_dir: str = Field(
        description="absolute path of an HF model folder (config.json + *.safetensors), e.g. from PolicyEngine.save_hf"
    )


class WeightSyncInit(BaseModel):
    host: str = Field(description="address of the trainer's rank 0 (the group's TCPStore)")
    port: int = Field(ge=1, le=65535, description="the store's port")
    world_size: int = Field(ge=2, description="1 + the number of vLLM workers")
    backend: Literal["gloo", "nccl"] = Field(description="gloo: CPU tensors; nccl: CUDA tensors")
    timeout_s: float = Field(600.0, gt=0, description="bound of the set-up and of each broadcast, seconds")


class WeightSyncUpdate(BaseModel):
    tensors_json: str = Field(
        description=(
            "JSON list of [name, dtype, shape] in the order the trainer broadcasts them; with buffer_json, [name,"
            " dtype, shape, offset] in the shared buffer"
        )
    )
    version: int = Field(0, ge=0, description="the trainer's step (echoed back)")
    buffer_json: str | None = Field(
        None,
        description=(
            "cuda_ipc: the trainer's shared buffer (as opened by /weight_sync/ipc_open); the tensors are read from it,"
            " not broadcast"
        ),
    )
    reset_prefix_cache: bool = Field(
        True,
        description="reset vLLM's prefix cache after loading (false for all but the last bucket of a cuda_ipc update)",
    )


class IpcOpen(BaseModel):
    buffer_json: str = Field(
        description="the JSON handle of the trainer's shared CUDA buffer (weight_sync_worker.share_cuda_buffer)"
    )


def add_weight_sync_routes(
    app: FastAPI, *, reload: Callable[[Path], Awaitable[float]], rpc: Rpc, reset_cache: Callable[[], Awaitable[None]]
) -> None:
    """The routes of the module docstring, on `app`."""

    @app.post("/reload_weights")
    async def reload_weights(request: ReloadRequest) -> dict[str, Any]:
        """`{"model_dir": absolute HF folder}` → `{"model_dir", "seconds"}`; 422 for a folder vLLM cannot load."""
        model_dir = checked_model_dir(request.model_dir)
        return {"model_dir": str(model_dir), "seconds": await reload(model_dir)}

    @app.post("/weight_sync/workers")
    async def weight_sync_workers() -> dict[str, Any]:
        """→ `{"workers": [{"rank", "device", "device_uuid"}]}`: vLLM's workers (the syncs' receivers)."""
        return {"workers": await rpc("weight_sync_worker_info", {})}

    @app.post("/weight_sync/init")
    async def weight_sync_init(request: WeightSyncInit) -> dict[str, Any]:
        """Have every worker join the trainer's weight-sync group (blocks until the trainer joined too)."""
        return {"workers": await rpc("weight_sync_worker_init", request.model_dump())}

    @app.post("/weight_sync/ipc_open")
    async def weight_sync_ipc_open(request: IpcOpen) -> dict[str, Any]:
        """cuda_ipc: every worker opens the trainer's shared buffer → `{"workers": [{"rank", "checksum"}]}`."""
        return {"workers": await rpc("weight_sync_worker_ipc_open", {"buffer_json": request.buffer_json})}

    @app.post("/weight_sync/update")
    async def weight_sync_update(request: WeightSyncUpdate) -> dict[str, Any]:
        """Load the tensors listed in `tensors_json` (broadcast by the trainer, or from its shared buffer), then reset
        the prefix cache; → `{"version", "tensors", "tensors_loaded", "bytes", "seconds"}` (seconds: the whole
        update, cache reset included)."""
        started = time.monotonic()
        if request.buffer_json is None:
            results = await rpc("weight_sync_worker_receive", {"metas_json": request.tensors_json})
        else:
            results = await rpc(
                "weight_sync_worker_ipc_receive",
                {"buffer_json": request.buffer_json, "tensors_json": request.tensors_json},
            )
        if request.reset_prefix_cache:
            await reset_cache()
        first = results[0] if results and isinstance(results[0], dict) else {}
        return {
            "version": request.version,
            **{key: first.get(key) for key in ("tensors", "tensors_loaded", "bytes")},
            "seconds": time.monotonic() - started,
        }

    @app.post("/weight_sync/close")
    async def weight_sync_close() -> dict[str, Any]:
        await rpc("weight_sync_worker_close", {})
        return {}


def checked_model_dir(model_dir: str) -> Path:
    """The folder as a Path. Raises HTTPException 422 unless it is absolute and holds config.json and safetensors."""
    path = Path(model_dir)
    if not path.is_absolute():
        raise HTTPException(422, f"model_dir must be an absolute path, got {model_dir!r}")
    if not path.is_dir():
        raise HTTPException(422, f"model_dir {model_dir!r} is not a directory")
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise HTTPException(422, f"model_dir {model_dir!r} must hold config.json and *.safetensors")
    return path
