"""A stand-in for vllm_model + one vLLM worker, for the broadcast weight sync's CPU test (tests/test_weight_sync_broadcast.py).

    python tests/weight_sync_receiver.py <HF model folder> <port file> [<device> [<dtype>]]   (default: cpu float32)

Serves vllm_model's `/weight_sync/{workers,init,update,close}` routes (same bodies) on a free loopback port (written
to the port file), calling the real `WeightSyncWorkerExtension` methods on a stand-in worker whose model is the
transformers model of the folder. The seam: vLLM's `Worker.reload_weights(weights_iterator=)` is replaced by a copy into the
module's parameters by HF name (KeyError for a name the model does not have, as vLLM's loaders raise). `POST /dump {"path"}`
writes the model's state dict (safetensors) for the test to compare.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nemo_gym" / "engine_ext"))
import nemo_gym_weight_sync as transport  # noqa: E402  (as vLLM's worker imports it)
from nemo_gym_weight_sync import WeightSyncWorkerExtension  # noqa: E402

RENDEZVOUS_TIMEOUT_S = 300  # a loaded 2-core CI machine takes tens of seconds to start a spawned process


def receive_into_queue(port: int, metas_json: str, queue: Any, backend: str = "gloo", device: str | None = None) -> None:
    """Rank 1 of a two-process group (`backend`, on `device` for nccl) on 127.0.0.1:`port`: receive the tensors of
    `metas_json` and put {name: tensor on the CPU} on `queue` (a multiprocessing target; this module imports no more
    than torch, FastAPI and uvicorn)."""
    if device is not None:
        torch.cuda.set_device(torch.device(device))
    store = transport.tcp_store("127.0.0.1", port, 2, is_master=False, timeout_s=RENDEZVOUS_TIMEOUT_S)
    group = transport.WeightSyncGroup(backend, store, 1, 2, timeout_s=RENDEZVOUS_TIMEOUT_S, device=torch.device(device) if device else None)
    group.check()
    queue.put({name: tensor.cpu().clone() for name, tensor in transport.receive_tensors(group, transport.metas_from_json(metas_json))})


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
    """What vLLM's worker offers the extension: `rank`, `device`, `model_runner.model`, `reload_weights(weights_iterator=)`."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.rank = 0
        self.device = device
        self.model_runner = SimpleNamespace(model=LoadableModel(model))

    def reload_weights(self, weights_iterator=None, weights_path=None) -> None:
        for name, tensor in weights_iterator:  # streamed, as vLLM's loaders pull them
            self.model_runner.model.load_weights(weights=[(name, tensor)])


def build_app(worker: StandInWorker) -> FastAPI:
    app = FastAPI()

    def call(method: str, **kwargs: Any) -> list[Any]:
        try:
            return [getattr(worker, method)(**kwargs)]
        except Exception as exc:  # vLLM's /collective_rpc answers 500 with the worker's error
            raise HTTPException(500, f"{type(exc).__name__}: {exc}") from exc

    @app.post("/weight_sync/workers")
    def workers() -> dict[str, Any]:
        return {"workers": call("nemo_gym_weight_sync_info")}

    @app.post("/weight_sync/init")
    def init(body: dict[str, Any]) -> dict[str, Any]:
        return {"workers": call("nemo_gym_weight_sync_init", **body)}

    @app.post("/weight_sync/update")
    def update(body: dict[str, Any]) -> dict[str, Any]:
        result = call("nemo_gym_weight_sync_receive", metas_json=body["tensors_json"])[0]
        return {"version": body.get("version", 0), **result}

    @app.post("/weight_sync/close")
    def close() -> dict[str, Any]:
        call("nemo_gym_weight_sync_close")
        return {}

    @app.post("/dump")
    def dump(body: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import save_file

        state = {k: v.detach().clone().contiguous() for k, v in worker.model_runner.model.inner.state_dict().items()}
        save_file(state, body["path"])
        return {"tensors": len(state)}

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
