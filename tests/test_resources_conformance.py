"""One conformance check over every resources server (Gymnasium's `check_env`, for our servers).

Each folder under `resources_servers/` is found when the tests are collected, so a new server is checked
without editing this file. The checks themselves are the library's (`nemo_gym.env.conformance`, the ones `ng_test` runs
on any server folder; its docstring lists them): health, tool schemas valid JSON Schema, malformed `/verify`
bodies answered 4xx never 500, session idempotence, every example row verifying deterministically inside
`reward_range`, and wrong-type and huge answers never crashing or stalling `/verify`. A server whose
`requirements.txt` lists a package that is not installed here is skipped, naming it.

The checks are also tested on broken servers here: each must fail naming its check.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nemo_gym.env.conformance import (
    CHECKS,
    ConformanceError,
    MissingPackageError,
    NotAResourcesServerError,
    assert_conformant,
    check_resources_server,
    checks_passed,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVERS_DIR = REPO_ROOT / "resources_servers"


def server_folders() -> list[Path]:
    return sorted(p for p in SERVERS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


@pytest.mark.long
@pytest.mark.parametrize("folder", server_folders(), ids=lambda folder: folder.name)
def test_resources_server_conformance(folder: Path) -> None:
    try:
        problems = check_resources_server(folder)
    except MissingPackageError as exc:
        pytest.skip(str(exc))
    assert problems == [], f"{folder.name}:\n" + "\n".join(str(p) for p in problems)


# -- the checks catch what they are for ----------------------------------------------------------------
BROKEN_APP = '''
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import Session
from nemo_gym.env.tools import tool


class BrokenServer(ResourcesServer):
    @tool
    async def echo(self, text: str) -> dict:
        """Echo the text."""
        return {{"text": text}}

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
{verify}
'''
CRASHING_VERIFY = (
    """        return VerifyResult(reward=float(request.model_extra["expected_answer"] in str(request.response)))"""
)
OUT_OF_RANGE_VERIFY = """        return VerifyResult(reward=2.0)"""


def broken_server(tmp_path: Path, verify: str) -> Path:
    """A server folder whose verify is `verify`; its example rows lack the `expected_answer` the crashing one reads."""
    folder = tmp_path / "resources_servers" / "broken"
    (folder / "data").mkdir(parents=True)
    (folder / "app.py").write_text(BROKEN_APP.format(verify=verify))
    row = {"responses_create_params": {"input": "Say hi."}}
    (folder / "data" / "example.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def test_a_verify_that_crashes_is_named(tmp_path: Path) -> None:
    problems = check_resources_server(broken_server(tmp_path, CRASHING_VERIFY))
    assert [p.check for p in problems] == ["example-rows-verify", "bad-answers"]
    assert "row 0: POST /verify raised KeyError: 'expected_answer' (a 500 to a real client)" in problems[0].message
    assert checks_passed(problems) == [
        "load",
        "example-data",
        "health",
        "tool-schemas",
        "malformed-verify",
        "session-idempotence",
    ]
    with pytest.raises(ConformanceError, match=r"2 conformance check\(s\) failed:\n\[example-rows-verify\] row 0"):
        assert_conformant(tmp_path / "resources_servers" / "broken")


def test_a_reward_outside_the_range_is_named(tmp_path: Path) -> None:
    problems = check_resources_server(broken_server(tmp_path, OUT_OF_RANGE_VERIFY))
    assert [str(p) for p in problems][
        0
    ] == "[example-rows-verify] row 0: reward 2.0 outside (0.0, 1.0) (or not a float)"


def test_an_invalid_tool_schema_is_named(tmp_path: Path) -> None:
    folder = broken_server(tmp_path, OUT_OF_RANGE_VERIFY.replace("2.0", "1.0"))
    app = folder / "app.py"
    app.write_text(
        app.read_text()
        + """
    def tool_schemas(self) -> list[dict]:
        return [{"type": "function", "name": "echo", "description": "Echo.", "parameters": {"type": "objet"}}]
"""
    )
    problems = check_resources_server(folder)
    assert [p.check for p in problems] == ["tool-schemas"], problems
    assert problems[0].message.startswith("tool 'echo': parameters are not valid JSON Schema: 'objet' is not valid")


def test_missing_example_data_and_unloadable_apps_are_named(tmp_path: Path) -> None:
    folder = broken_server(tmp_path, CRASHING_VERIFY)
    (folder / "data" / "example.jsonl").unlink()
    assert [str(p) for p in check_resources_server(folder)] == [
        "[example-data] no data/example.jsonl (the checks verify its rows)"
    ]
    (folder / "app.py").write_text("import os\n")
    problems = check_resources_server(folder)
    assert [p.check for p in problems] == ["load"] and "expected exactly one server class" in problems[0].message
    assert checks_passed(problems) == []


def test_other_server_types_and_missing_requirements_are_not_failures(tmp_path: Path) -> None:
    with pytest.raises(NotAResourcesServerError, match="is not a ResourcesServer"):
        check_resources_server(REPO_ROOT / "responses_api_agents" / "simple_agent")
    folder = tmp_path / "needs_package"
    shutil.copytree(broken_server(tmp_path, CRASHING_VERIFY), folder)
    (folder / "app.py").write_text("import not_installed_pkg_xyz\n" + (folder / "app.py").read_text())
    (folder / "requirements.txt").write_text("not-installed-pkg-xyz==1.0\n")
    with pytest.raises(MissingPackageError, match="needs not_installed_pkg_xyz"):
        check_resources_server(folder)


def test_every_check_is_documented() -> None:
    import nemo_gym.env.conformance as checks

    assert all(f"| `{name}` |" in checks.__doc__ for name in CHECKS)
