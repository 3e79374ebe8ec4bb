"""Shared pytest setup for the tests under tests/."""

import os
from collections.abc import Iterator

import pytest
from ng_process import LAUNCHER_ENV


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


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer (the embedded model, converted by an e2e test or ng_run); skips when
    it is not converted yet."""
    from transformers import AutoTokenizer

    from nemo_gym.train.engine import resolve_model_path

    try:
        path = resolve_model_path("embedded:smollm2")
    except FileNotFoundError as exc:
        pytest.skip(f"SmolLM2 not converted yet (an e2e test or ng_run with vllm_model converts it): {exc}")
    return AutoTokenizer.from_pretrained(path)
