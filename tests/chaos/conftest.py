"""The `soak` tests (tests/chaos/test_soak.py) run only when asked for: `NG_SOAK_SECONDS` set, or `-m` naming
`soak` (not as `not soak`). Otherwise they are skipped, so the default `pytest -m "not e2e and not ray"` leaves
them out without having to name them."""

from __future__ import annotations

import os
import re

import pytest


def _soak_requested(config: pytest.Config) -> bool:
    if os.environ.get("NG_SOAK_SECONDS"):
        return True
    expression = config.getoption("markexpr", "") or ""
    return re.search(r"(?<!not )\bsoak\b", expression) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _soak_requested(config):
        return
    skip = pytest.mark.skip(reason="soak test: set NG_SOAK_SECONDS or pass -m soak (see tests/chaos/test_soak.py)")
    for item in items:
        if item.get_closest_marker("soak"):
            item.add_marker(skip)
