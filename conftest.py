"""Pytest setup for every test of this repository (tests/, the server folders' tests, ng_test in a server's venv).

Every test session starts cold, as a new user does: see `pytest_configure`.
"""

import os
import shutil
import tempfile

import pytest

TEST_HOME_ENV = "NG_TEST_NEMO_GYM_HOME"
_created_home: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Every test session starts cold, as a new user does: NEMO_GYM_HOME (engine venv, server venvs, converted
    models, NeMo Gym releases, run records) is an empty folder of its own, so what a test needs is built in that
    session, never found because an earlier run left it in ~/.cache/nemo_gym. `NG_TEST_NEMO_GYM_HOME` names the
    folder instead (.ci/run gives all its stages one fresh folder, so they build it once between them); a
    NEMO_GYM_HOME of the shell is not used. uv's own package cache stays warm (it holds what the index serves)."""
    home = os.environ.get(TEST_HOME_ENV)
    if not home:
        home = tempfile.mkdtemp(prefix="ng-test-home-")
        _created_home.append(home)
        # pytest-xdist's workers (started after this) share it: what one builds, the others find (builds are locked)
        os.environ[TEST_HOME_ENV] = home
    os.environ["NEMO_GYM_HOME"] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    for home in _created_home:  # engines and models: gigabytes per session
        shutil.rmtree(home, ignore_errors=True)
