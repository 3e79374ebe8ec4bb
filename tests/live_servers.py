"""Serve FastAPI apps with uvicorn on 127.0.0.1 in background threads (real HTTP, one process); `serve_vllm_model`
starts the real vllm_model server for the e2e tests; `gpu_engine` says where the GPU suite's vLLM is."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.limits import UVICORN_LIMITS

VLLM_MODEL_APP = Path(__file__).resolve().parents[1] / "responses_api_models" / "vllm_model" / "app.py"


def gpu_engine() -> dict[str, str]:
    """vllm_model's keys for vLLM on CUDA in the GPU suite: `engine_python` from NG_GPU_ENGINE_PYTHON (vLLM carried in,
    benchmarks/gpu/setup.sh), else `vllm_package: vllm` (its engine venv)."""
    python = os.environ.get("NG_GPU_ENGINE_PYTHON")
    return {"engine_python": python} if python else {"vllm_package": "vllm"}


def gpu_vllm_reason() -> str | None:
    """Why the GPU suite has no vLLM for CUDA here, or None when it has one (`gpu_engine`'s)."""
    from nemo_gym.model_servers.vllm_engine import engine_venv_ready

    if os.environ.get("NG_GPU_ENGINE_PYTHON") or engine_venv_ready("vllm"):
        return None
    return (
        "no vLLM for CUDA: NG_GPU_ENGINE_PYTHON is unset (vLLM carried in: benchmarks/gpu/device.sh) and no engine venv"
        " is built (benchmarks/gpu/setup.sh builds one where a package index is reachable)"
    )


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Yield the base URL of `app` served on a free loopback port; stop it on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, **UVICORN_LIMITS))
    server.install_signal_handlers = lambda: None
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise TimeoutError("server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextmanager
def serve_registered(servers: dict[str, tuple[str, str, dict[str, Any]]]) -> Iterator[dict[str, str]]:
    """A head server, and each of `servers` (its name: (server type, folder with its app.py, config)) built against
    the head, served (`serve`) and registered under its name; yields the base URLs by name (the head's as `head`)."""
    from nemo_gym.common.layout import REPO_ROOT
    from nemo_gym.serving.client import ServerClient
    from nemo_gym.serving.head import build_head_app

    with ExitStack() as stack:
        urls = {"head": stack.enter_context(serve(build_head_app()))}
        for name, (server_type, folder, config) in servers.items():
            instance = load_server_class(REPO_ROOT / folder / "app.py")(
                config, name=name, client=ServerClient(urls["head"])
            )
            urls[name] = stack.enter_context(serve(instance.build_app()))
            entry = {"name": name, "server_type": server_type, "implementation": "test", "url": urls[name]}
            registration = {**entry, "pid": os.getpid()}
            httpx.post(f"{urls['head']}/register", json=registration, trust_env=False).raise_for_status()
        yield urls


@contextmanager
def serve_vllm_model(config: dict[str, Any], startup_timeout_s: float) -> Iterator[tuple[str, Any]]:
    """Yield (base URL, server object) of a running vllm_model server named policy_model with `config`
    (uvicorn in a thread; vLLM in its own process group), once `/health` answers 200 (at most
    `startup_timeout_s`; else the test fails with the end of `config["log_path"]`). Stops vLLM on exit."""
    server = load_server_class(VLLM_MODEL_APP)(config, name="policy_model")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    web = uvicorn.Server(uvicorn.Config(server.build_app(), log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline and thread.is_alive():
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(1)
    else:
        log_path = Path(config.get("log_path", ""))
        pytest.fail(
            f"vllm_model did not start; log {log_path}:\n{log_path.read_text()[-3000:] if log_path.is_file() else ''}"
        )
    try:
        yield url, server
    finally:
        web.should_exit = True
        thread.join(60)  # shutdown() stops vLLM
        sock.close()
