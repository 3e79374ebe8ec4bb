"""Helpers a server's own tests share (they run in the server's environment, where nemo_gym is installed):
`server_client` (a started TestClient over `<folder>/app.py`) and `client_fixture`, `assistant_response` and
`episode_response` (Responses bodies to verify), `post_verify` and `text_verifier`, `assert_verifier_cases`, and
`NgRun` (a real `ng_run` process, stopped by its PID).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.env.validation import run_verifier_cases
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import live_runs, run_token_headers

__all__ = [
    "server_client",
    "client_fixture",
    "text_verifier",
    "assistant_response",
    "episode_response",
    "post_verify",
    "assert_verifier_cases",
    "NgRun",
]


@contextmanager
def server_client(
    folder: str | Path, config: dict[str, Any] | None = None, *, name: str | None = None
) -> Iterator[TestClient]:
    """A started `fastapi.testclient.TestClient` over the server of `<folder>/app.py` (real HTTP routes, startup
    and shutdown run); `client.server` is the server object. `config`: the instance's fields (default: none).

    Raises:
        ConfigError: `folder/app.py` defines no server class, or several.
        pydantic.ValidationError: `config` does not fit the server's `Config`.
    """
    folder = Path(folder)
    server = load_server_class(folder / "app.py")(config or {}, name=name or folder.name)
    with TestClient(server.build_app()) as client:
        client.server = server  # type: ignore[attr-defined]
        yield client


def client_fixture(
    folder: str | Path, config: dict[str, Any] | None = None, *, name: str = "client", scope: str = "module"
) -> Any:
    """A pytest fixture `name` yielding `server_client(folder, config)`; assign it in a test module:
    `client = client_fixture(SERVER_DIR)`."""
    import pytest

    @pytest.fixture(scope=scope, name=name)
    def fixture() -> Iterator[TestClient]:
        with server_client(folder, config) as client:
            yield client

    return fixture


def text_verifier(row: dict[str, Any], *, reasoning: bool = False) -> Callable[..., dict[str, Any]]:
    """`verify(client, text, **fields)`: `post_verify` of `row` (with `fields` replacing its own) and an
    `assistant_response(text, reasoning=reasoning)`."""

    def verify(client: TestClient, text: Any, **fields: Any) -> dict[str, Any]:
        return post_verify(client, {**row, **fields, "response": assistant_response(text, reasoning=reasoning)})

    return verify


def _response(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp",
        "object": "response",
        "created_at": 0,
        "model": "test",
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


def assistant_response(*texts: Any, reasoning: bool = False) -> dict[str, Any]:
    """A Responses `Response` dict whose output is one assistant message per text (`output_text` parts; a
    text may be of any JSON type, to test malformed model output), after a reasoning item if `reasoning`."""
    output = [{"type": "reasoning", "id": "rs_0", "summary": []}] if reasoning else []
    output += [
        {
            "type": "message",
            "id": f"msg_{i}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        for i, text in enumerate(texts)
    ]
    return _response(output)


def episode_response(*actions: str, observation: str = "observation") -> dict[str, Any]:
    """A Responses `Response` dict of a Gymnasium-style episode: `observation` (a user message) then each
    assistant action in turn, as `responses_api_agents/gymnasium_agent` writes it."""
    output: list[dict[str, Any]] = []
    for text in actions:
        output.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": observation}]})
        output.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
    return _response(output)


def post_verify(client: TestClient, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """`POST /verify` with `body` (and `client.post` keyword arguments, e.g. headers); the answer's JSON,
    after asserting the status is 200."""
    answer = client.post("/verify", json=body, **kwargs)
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_verifier_cases(folder: str | Path, *, at_least: int = 1) -> int:
    """Run the folder's `tests/verifier_cases.jsonl` as `ng_test` does (`nemo_gym.env.validation`), assert every
    case passes and that there are `at_least` of them; returns how many passed."""
    results = run_verifier_cases(Path(folder))
    assert not results.problems, "\n".join(str(p) for p in results.problems)
    assert results.passed >= at_least, f"{results.passed} verifier cases, expected at least {at_least}"
    return results.passed


class NgRun:
    """`ng_run` with `overrides` as a real process in its own session; `head_url` once ready. Use as a
    context manager: leaving it stops the process (SIGINT, then SIGKILL of its process group after 60 s)."""

    def __init__(self, *overrides: str, timeout_s: float = 300, env: dict[str, str] | None = None):
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ng_run_{os.getpid()}_{time.monotonic_ns()}.log"
        self.command = [str(Path(sys.executable).parent / "ng_run"), "+head_server.port=0", *overrides]
        self.timeout_s = timeout_s
        self.env = {**os.environ, **(env or {})}
        self.head_url: str | None = None

    def __enter__(self) -> NgRun:
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            self.command, cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        return self

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self) -> str:
        """The head server's URL once every server is ready.

        Raises:
            RuntimeError: ng_run exited first. TimeoutError: not ready within `timeout_s`.
        """
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            match = re.search(r"servers ready in .* Head server: (\S+)", self.output())
            if match:
                self.head_url = match.group(1)
                return self.head_url
            if self.process.poll() is not None:
                raise RuntimeError(f"ng_run exited with {self.process.returncode}:\n{self.output()}")
            time.sleep(0.2)
        raise TimeoutError(f"ng_run not ready after {self.timeout_s} s:\n{self.output()}")

    @property
    def headers(self) -> dict[str, str]:
        """The run token's header, for plain HTTP calls to this run's servers (`{}` before ready or unauthenticated)."""
        return run_token_headers(self.head_url)

    def server_url(self, name: str) -> str:
        """Base URL of the run's server instance `name` (asks the head server; waits until ready)."""
        head_url = self.head_url or self.wait_ready()
        answer = httpx.get(f"{head_url}/servers/{name}", headers=self.headers, timeout=10)
        answer.raise_for_status()
        return answer.json()["url"]

    def state(self) -> dict[str, Any]:
        """The run's `state.json` (`{run_id, head_url, servers: [{name, replica, pid, url, ...}]}`), once ready.

        Raises:
            LookupError: no live run with this process's PID.
        """
        self.head_url or self.wait_ready()
        for state in live_runs():
            if state.get("pid") == self.process.pid:
                return state
        raise LookupError(f"no live ng_run with pid {self.process.pid}")

    def wait_exit(self, timeout_s: float = 60) -> int:
        return self.process.wait(timeout_s)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.log.close()
