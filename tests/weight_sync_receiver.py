"""A stand-in for vllm_model + one vLLM worker, for the weight syncs' CPU tests (tests/test_weight_sync_broadcast.py,
tests/test_weight_sync_ipc.py) and the GPU benchmark's stand-in.

    python tests/weight_sync_receiver.py <HF model folder> <port file> [<device> [<dtype>]]   (default: cpu float32)

Serves vllm_model's own weight-sync routes (`nemo_gym.model_servers.weight_sync_routes`: `/weight_sync/{workers,init,
update,ipc_open,close}`) on a free loopback port (written to the port file); where vllm_model goes through vLLM's
`/collective_rpc`, this calls the real `WeightSyncWorkerExtension` methods on a stand-in worker whose model is the
transformers model of the folder. The seams: vLLM's `Worker.reload_weights(weights_iterator=)` and `model.load_weights`
are a copy into the module's parameters by HF name (KeyError for a name the model does not have, as vLLM's loaders
raise); cuda_ipc's shared buffer may also be POSIX shared memory (`HostBuffers`: handles of kind `shm`), so the same
path runs between CPU processes. `POST /dump {"path"}` writes the model's state dict (safetensors) and answers how many
prefix-cache resets the routes asked for.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import sys
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nemo_gym" / "model_servers" / "engine_ext"))
import weight_sync_worker as transport  # noqa: E402  (as vLLM's worker imports it)
from weight_sync_worker import WeightSyncWorkerExtension  # noqa: E402

RENDEZVOUS_TIMEOUT_S = 300  # a loaded 2-core CI machine takes tens of seconds to start a spawned process


def receive_into_queue(
    port: int, metas_json: str, queue: Any, backend: str = "gloo", device: str | None = None
) -> None:
    """Rank 1 of a two-process group (`backend`, on `device` for nccl) on 127.0.0.1:`port`: receive the tensors of
    `metas_json` and put {name: tensor on the CPU} on `queue`, read with `tensors_from_queue` (a multiprocessing
    target; this module imports no more than torch, FastAPI and uvicorn)."""
    if device is not None:
        torch.cuda.set_device(torch.device(device))
    store = transport.tcp_store("127.0.0.1", port, 2, is_master=False, timeout_s=RENDEZVOUS_TIMEOUT_S)
    group = transport.WeightSyncGroup(
        backend, store, 1, 2, timeout_s=RENDEZVOUS_TIMEOUT_S, device=torch.device(device) if device else None
    )
    group.check()
    received = {
        name: tensor.cpu().clone()
        for name, tensor in transport.receive_tensors(group, transport.metas_from_json(metas_json))
    }
    # as bytes, not tensors: a tensor put on a queue is shared through a file descriptor that this process hands out
    # when the other one gets it (torch.multiprocessing), and this process may have ended by then ("Connection reset
    # by peer" in the getter)
    buffer = io.BytesIO()
    torch.save(received, buffer)
    queue.put(buffer.getvalue())


def tensors_from_queue(queue: Any, timeout_s: float) -> dict[str, Any]:
    """What `receive_into_queue` put on `queue`: {name: tensor}. Raises queue.Empty after `timeout_s` seconds."""
    return torch.load(io.BytesIO(queue.get(timeout=timeout_s)))


def open_and_answer(buffer_json: str, queue: Any) -> None:
    """Another process on the same GPU (a multiprocessing target): open the trainer's shared CUDA buffer as vLLM's
    worker does, put the sum of its first PROBE_BYTES bytes on `queue`, and write 255 into its last byte."""
    buffer = transport.open_buffer(buffer_json, torch.device("cuda", torch.cuda.current_device()))
    checksum = int(buffer[: transport.PROBE_BYTES].to(torch.int64).sum())
    buffer[-1] = 255
    torch.cuda.synchronize()
    queue.put(checksum)


class LoadableModel(torch.nn.Module):
    """The transformers model with vLLM's `load_weights(weights=[(name, tensor)])` entry point."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        params = self.inner.state_dict(keep_vars=True)
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"no parameter {name!r} in the model")
            params[name].data.copy_(tensor)


class StandInWorker(WeightSyncWorkerExtension):
    """What vLLM's worker offers the extension: `rank`, `device`, `model_runner.model`,
    `reload_weights(weights_iterator=)`."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.rank = 0
        self.device = device
        self.model_runner = SimpleNamespace(model=LoadableModel(model))

    def reload_weights(self, weights_iterator=None, weights_path=None) -> None:
        for name, tensor in weights_iterator:  # streamed, as vLLM's loaders pull them
            self.model_runner.model.load_weights(weights=[(name, tensor)])


class HostBuffers:
    """cuda_ipc's buffer in POSIX shared memory (the trainer's side: `allocate` and `share` of CudaIpcWeightSync), so
    the shared-buffer path runs between CPU processes; `open_host_buffer` is the worker's side."""

    def __init__(self) -> None:
        self.segments: dict[int, shared_memory.SharedMemory] = {}

    def allocate(self, num_bytes: int, device: Any) -> torch.Tensor:
        segment = shared_memory.SharedMemory(create=True, size=num_bytes)
        buffer = torch.frombuffer(segment.buf, dtype=torch.uint8, count=num_bytes)
        self.segments[buffer.data_ptr()] = segment
        return buffer

    def share(self, buffer: torch.Tensor) -> str:
        return json.dumps({"kind": "shm", "name": self.segments[buffer.data_ptr()].name, "num_bytes": buffer.numel()})

    def unlink(self) -> None:
        for segment in self.segments.values():
            segment.unlink()  # the memory goes when the last process lets go of it


_OPENED: list[shared_memory.SharedMemory] = []  # attached segments stay open as long as this process


def open_host_buffer(handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    segment = shared_memory.SharedMemory(name=handle["name"])
    resource_tracker.unregister(
        segment._name, "shared_memory"
    )  # the trainer owns it (Python < 3.13 would unlink it at our exit)
    _OPENED.append(segment)
    return torch.frombuffer(segment.buf, dtype=torch.uint8, count=handle["num_bytes"])


transport.BUFFER_OPENERS["shm"] = open_host_buffer


def build_app(worker: StandInWorker) -> FastAPI:
    from nemo_gym.model_servers.weight_sync_routes import add_weight_sync_routes

    app = FastAPI()
    resets = []

    async def rpc(method: str, kwargs: dict[str, Any]) -> list[Any]:
        try:  # in a thread: a worker method blocks until the trainer's broadcasts arrive
            return [await asyncio.to_thread(getattr(worker, method), **kwargs)]
        except Exception as exc:  # vLLM's /collective_rpc answers 500 with the worker's error
            raise HTTPException(500, f"{type(exc).__name__}: {exc}") from exc

    async def reload(model_dir: Path) -> float:
        raise HTTPException(501, "the stand-in has no filesystem reload")

    async def reset_cache() -> None:
        resets.append(1)

    add_weight_sync_routes(app, reload=reload, rpc=rpc, reset_cache=reset_cache)

    @app.post("/dump")
    def dump(body: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import save_file

        state = {k: v.detach().clone().contiguous() for k, v in worker.model_runner.model.inner.state_dict().items()}
        save_file(state, body["path"])
        return {"tensors": len(state), "resets": len(resets)}

    return app


def main() -> None:
    from transformers import AutoModelForCausalLM

    model_dir, port_file = sys.argv[1], Path(sys.argv[2])
    device = torch.device(sys.argv[3] if len(sys.argv) > 3 else "cpu")
    dtype = getattr(torch, sys.argv[4] if len(sys.argv) > 4 else "float32")
    worker = StandInWorker(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device), device)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port_file.write_text(json.dumps({"port": sock.getsockname()[1]}))
    uvicorn.Server(uvicorn.Config(build_app(worker), log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
