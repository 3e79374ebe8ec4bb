"""Shared pytest setup for the tests under tests/."""

import os

import pytest

# the torch.distributed variables that a one-rank engine in this process sets (engine.set_single_process_env)
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _launcher_env_stays_in_its_test():
    """Restore LAUNCHER_ENV after each test: a test that trains in this process leaves MASTER_PORT naming the port its
    process group still holds, and a later test's ng_train child inheriting it fails with EADDRINUSE."""
    before = {name: os.environ.get(name) for name in LAUNCHER_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
