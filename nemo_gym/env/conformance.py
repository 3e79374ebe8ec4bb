"""Conformance checks every resources server must pass (Gymnasium's `check_env`, for our servers).

`check_resources_server(folder)` imports `<folder>/app.py`, builds the one `ResourcesServer` subclass defined
there with its default config, drives it over HTTP (FastAPI's TestClient, startup and shutdown run; no port, no
process) and returns every problem found, each named by its check; `assert_conformant(folder)` raises them all
at once. `ng_test` runs them in the server's own environment (`python -m nemo_gym.env.conformance <folder>`) on every
resources server it tests (`+run_conformance=false` skips them); tests/test_resources_conformance.py runs them
over every folder under `resources_servers/`. They need the folder's `data/example.jsonl` (at least one row;
the checks verify its rows). A check stops at its first problem; the others still run. The bad answers of the
check `bad-answers` are in `nemo_gym.env.bad_answers`.

| check | what it asks of the server |
|---|---|
| `load` | `app.py` imports and defines one server class; it builds with its default config and starts |
| `example-data` | `data/example.jsonl` exists and holds at least one JSON object (the checks below need its rows) |
| `health` | `GET /health` answers 200 `{"status": "ok", ...}` |
| `tool-schemas` | `GET /tools` lists function tools, each with a name, a text description and `parameters` that are valid JSON Schema (Draft 2020-12) of an object |
| `malformed-verify` | `/verify` bodies that are not JSON, a JSON list, or a row with no `response` get a 4xx, never a 500 |
| `session-idempotence` | seeding a session twice gives the same answer and leaves the same state; closing it twice is fine |
| `example-rows-verify` | every example row, answered by one empty assistant message, verifies (twice, to the same reward: deterministic) to a float inside the class's `reward_range` |
| `bad-answers` | bad model output never crashes `/verify` and never stalls it: output of the wrong JSON types for every example row (content a number, parts that are not objects, `output` not a list, junk items, tool calls with unparsable arguments or no name, ...) and huge answers (about 1 MB of prose, of unclosed markup, of whitespace) for the first each get within VERIFY_DEADLINE_S a 200 with a reward inside `reward_range` when the body is valid for the server's `verify_request_type`, else a 4xx; never a 5xx |

An exception the server raises while answering (a 500 to a real client) is a problem of the check that sent
the request, naming the request and the exception.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import ValidationError

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.bad_answers import EMPTY_ANSWER, HUGE_ANSWER_CHARS, huge_answers, wrong_type_answers
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest
from nemo_gym.serving.entrypoint import load_server_class

__all__ = [
    "CHECKS",
    "CheckProblem",
    "ConformanceError",
    "MissingPackageError",
    "NotAResourcesServerError",
    "check_resources_server",
    "assert_conformant",
    "checks_passed",
    "main",
]

CHECKS: dict[str, str] = {
    "load": "app.py imports, defines one server class, builds with its default config and starts",
    "example-data": "data/example.jsonl holds at least one JSON object",
    "health": "GET /health answers ok",
    "tool-schemas": "GET /tools lists function tools with valid JSON Schema parameters",
    "malformed-verify": "malformed /verify bodies get a 4xx, never a 500",
    "session-idempotence": "seeding a session twice, and closing it twice, are idempotent",
    "example-rows-verify": "every example row verifies, deterministically, to a reward inside reward_range",
    "bad-answers": "wrong-type and huge answers never crash /verify nor stall it",
}
SESSION_ID = "conformance"
VERIFY_DEADLINE_S = 30.0  # one /verify of bad model output; the slowest bundled server takes about a second


@dataclass(frozen=True)
class CheckProblem:
    """One failed check: `[check] message`."""

    check: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


class ConformanceError(AssertionError):
    """A resources server failed conformance checks; `problems` lists them all (one per failed check)."""

    def __init__(self, folder: Path, problems: list[CheckProblem]):
        self.problems = problems
        super().__init__(
            f"{folder}: {len(problems)} conformance check(s) failed:\n" + "\n".join(str(p) for p in problems)
        )


class MissingPackageError(ImportError):
    """`app.py` needs a package its `requirements.txt` lists, not installed in this environment (run the checks in the
    server's own environment: `ng_test`)."""

    def __init__(self, folder: Path, package: str):
        self.package = package
        super().__init__(
            f"{folder.name} needs {package} (listed in its requirements.txt), not installed here", name=package
        )


class NotAResourcesServerError(TypeError):
    """`app.py` defines an agent or model server: the conformance checks are for resources servers."""


class CheckFailed(Exception):
    """Raised inside a check at its first problem; becomes a CheckProblem named after the check."""


@dataclass
class _Subject:
    """What the checks drive: the started client, the server object and the example rows."""

    client: TestClient
    server: ResourcesServer
    rows: list[dict[str, Any]]


def check_resources_server(folder: str | Path) -> list[CheckProblem]:
    """Run every check of CHECKS on the resources server of `folder`; the problems found, [] when it conforms.

    Raises:
        MissingPackageError: `app.py` imports a package its requirements.txt lists that is not installed here.
        NotAResourcesServerError: `app.py` defines an agent or model server.
    """
    folder = Path(folder).resolve()  # `.` names the server after its folder
    try:
        cls = load_resources_server(folder)
        server = cls(name=folder.name)
    except (MissingPackageError, NotAResourcesServerError):
        raise
    except Exception as exc:  # any import or build error of the user's code is the problem to report
        return [CheckProblem("load", _exception_text(exc))]
    rows, rows_problem = _example_rows(folder)
    problems = [rows_problem] if rows_problem else []
    try:
        with TestClient(server.build_app()) as client:
            subject = _Subject(client, server, rows)
            for name, check in _CHECK_FUNCTIONS.items():
                if rows or name in _NEED_NO_ROWS:  # without rows, the example-data problem stands for the others
                    problems.append(_run_check(name, check, subject))
    except Exception as exc:  # startup or shutdown raised
        problems.append(CheckProblem("load", f"starting or stopping the server: {_exception_text(exc)}"))
    return [p for p in problems if p is not None]


def assert_conformant(folder: str | Path) -> None:
    """`check_resources_server(folder)`, raising when anything is wrong.

    Raises:
        ConformanceError: one or more checks failed (every problem in its message and in `.problems`).
        MissingPackageError, NotAResourcesServerError: as check_resources_server.
    """
    problems = check_resources_server(folder)
    if problems:
        raise ConformanceError(Path(folder), problems)


def load_resources_server(folder: Path) -> type[ResourcesServer]:
    """The server class of `folder/app.py`.

    Raises:
        MissingPackageError: it imports a package listed in requirements.txt that is not installed here.
        NotAResourcesServerError: its class is not a ResourcesServer.
        FileNotFoundError: no app.py. ConfigError: no server class, or several. Any error importing app.py.
    """
    if not (folder / "app.py").is_file():
        raise FileNotFoundError(f"{folder}: no app.py")
    try:
        cls = load_server_class(folder / "app.py")
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if _normalized(root) in _required_packages(folder) and not _importable(root):
            raise MissingPackageError(folder, root) from exc
        raise
    if not issubclass(cls, ResourcesServer):
        raise NotAResourcesServerError(
            f"{folder.name}: {cls.__name__} is not a ResourcesServer; the conformance checks are for resources servers"
        )
    return cls


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _required_packages(folder: Path) -> set[str]:
    """Normalized distribution names listed in the folder's requirements.txt."""
    path = folder / "requirements.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    names = (re.split(r"[\s<>=!~\[;@]", line.strip(), maxsplit=1)[0] for line in lines)
    return {_normalized(name) for name in names if name and not name.startswith(("#", "-"))}


def _example_rows(folder: Path) -> tuple[list[dict[str, Any]], CheckProblem | None]:
    """The rows of `data/example.jsonl`, or [] and the problem that stops reading them."""
    path = folder / "data" / "example.jsonl"
    if not path.is_file():
        return [], CheckProblem("example-data", "no data/example.jsonl (the checks verify its rows)")
    try:
        rows = read_jsonl(path)
    except Exception as exc:
        return [], CheckProblem("example-data", f"data/example.jsonl: {_exception_text(exc)}")
    if not rows or not all(isinstance(row, dict) for row in rows):
        return [], CheckProblem(
            "example-data",
            "data/example.jsonl is empty" if not rows else "data/example.jsonl holds a line that is not a JSON object",
        )
    return rows, None


def _exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:1000]}"


def _run_check(name: str, check: Callable[[_Subject], None], subject: _Subject) -> CheckProblem | None:
    try:
        check(subject)
    except CheckFailed as exc:
        return CheckProblem(name, str(exc))
    except Exception as exc:  # a check must report, never crash: the server's answer was not what we could read
        return CheckProblem(name, _exception_text(exc))
    return None


def _request(client: TestClient, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
    """`client.request(...)`; an exception the server raised while answering becomes CheckFailed naming `what`."""
    try:
        return client.request(method, path, **kwargs)
    except Exception as exc:
        raise CheckFailed(f"{what}: {method} {path} raised {_exception_text(exc)} (a 500 to a real client)") from exc


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def _shown(answer: httpx.Response) -> str:
    return f"{answer.status_code} {answer.text[:300]}"


def _reward(answer: httpx.Response, shown: str, reward_range: tuple[float, float]) -> float:
    """The answer's reward, after checking it is a float inside `reward_range`."""
    body = answer.json()
    reward = body.get("reward") if isinstance(body, dict) else None
    low, high = reward_range
    _require(
        isinstance(reward, float) and low <= reward <= high,
        f"{shown}: reward {reward!r} outside {tuple(reward_range)} (or not a float)",
    )
    return reward


# -- the checks, in order ------------------------------------------------------------------------------
def check_health(subject: _Subject) -> None:
    answer = _request(subject.client, "GET", "/health", "health")
    _require(answer.status_code == 200 and answer.json().get("status") == "ok", f"GET /health: {_shown(answer)}")


def check_tool_schemas(subject: _Subject) -> None:
    answer = _request(subject.client, "GET", "/tools", "tools")
    _require(answer.status_code == 200, f"GET /tools: {_shown(answer)}")
    for tool in answer.json():
        name = tool.get("name") if isinstance(tool, dict) else None
        _require(
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and bool(name)
            and isinstance(tool.get("description"), str),
            f"not a function tool with a name and a text description: {str(tool)[:300]}",
        )
        try:
            Draft202012Validator.check_schema(tool.get("parameters"))
        except SchemaError as exc:
            raise CheckFailed(f"tool {name!r}: parameters are not valid JSON Schema: {exc.message}") from None
        parameters = tool["parameters"]
        kind = parameters.get("type") if isinstance(parameters, dict) else parameters
        _require(kind == "object", f"tool {name!r}: parameters are not the schema of an object (type: {kind!r})")


def check_malformed_verify(subject: _Subject) -> None:
    row = {**subject.rows[0], "response": EMPTY_ANSWER}
    bodies = {
        "not JSON": b"{not json",
        "a list": json.dumps([row]).encode(),
        "no response": json.dumps({k: v for k, v in row.items() if k != "response"}).encode(),
    }
    for what, body in bodies.items():
        headers = {"Content-Type": "application/json", "X-Session-Id": SESSION_ID}
        answer = _request(subject.client, "POST", "/verify", f"/verify with {what}", content=body, headers=headers)
        _require(400 <= answer.status_code < 500, f"/verify with {what}: {_shown(answer)} (expected a 4xx)")


def check_session_idempotence(subject: _Subject) -> None:
    client, row, headers = subject.client, subject.rows[0], {"X-Session-Id": SESSION_ID}
    first = _request(client, "POST", "/seed_session", "first /seed_session", json=row, headers=headers)
    _require(first.status_code == 200, f"first /seed_session: {_shown(first)}")
    state = copy.deepcopy(dict(subject.server.sessions[SESSION_ID]))
    second = _request(client, "POST", "/seed_session", "second /seed_session", json=row, headers=headers)
    _require(
        second.status_code == 200 and second.json() == first.json(),
        f"second /seed_session: {_shown(second)}; first: {first.text[:300]}",
    )
    _require(dict(subject.server.sessions[SESSION_ID]) == state, "seeding twice changed the session state")
    for attempt in ("first", "second"):
        answer = _request(client, "POST", "/close_session", f"{attempt} /close_session", headers=headers)
        _require(answer.status_code == 200, f"{attempt} /close_session: {_shown(answer)}")


def check_example_rows_verify(subject: _Subject) -> None:
    for index, row in enumerate(subject.rows):
        headers = {"X-Session-Id": f"conformance-row-{index}"}
        seeded = _request(subject.client, "POST", "/seed_session", f"row {index}", json=row, headers=headers)
        _require(seeded.status_code == 200, f"row {index}: /seed_session: {_shown(seeded)}")
        rewards = []
        for _ in range(2):
            answer = _request(
                subject.client,
                "POST",
                "/verify",
                f"row {index}",
                json={**row, "response": EMPTY_ANSWER},
                headers=headers,
            )
            _require(answer.status_code == 200, f"row {index}: /verify: {_shown(answer)}")
            rewards.append(_reward(answer, f"row {index}", subject.server.reward_range))
        _require(rewards[0] == rewards[1], f"row {index}: verify is not deterministic: {rewards}")


def check_bad_answers(subject: _Subject) -> None:
    server = subject.server
    huge_chars = min(HUGE_ANSWER_CHARS, int(server.config.max_body_mb * 2**20) // 8)  # a server with a lower cap
    for index, row in enumerate(subject.rows):
        headers = {"X-Session-Id": f"conformance-bad-{index}"}
        # Huge answers for the first row only: 1 MB each, every row would add half a minute to a suite.
        answers = {**huge_answers(huge_chars), **wrong_type_answers()} if index == 0 else wrong_type_answers()
        for what, response in answers.items():
            seeded = _request(
                subject.client, "POST", "/seed_session", f"row {index}, {what}", json=row, headers=headers
            )
            _require(seeded.status_code == 200, f"row {index}, {what}: /seed_session: {_shown(seeded)}")
            _verify_bad_answer(subject, {**row, "response": response}, headers, f"row {index}, {what}")


def _verify_bad_answer(subject: _Subject, body: dict[str, Any], headers: dict[str, str], what: str) -> None:
    """/verify of `body` answers within the deadline: 200 with a reward in range if the body fits the schema, else
    4xx."""
    start_s = time.monotonic()
    answer = _request(subject.client, "POST", "/verify", what, json=body, headers=headers)
    elapsed_s = time.monotonic() - start_s
    shown = f"{what}: {_shown(answer)}"
    _require(
        elapsed_s <= VERIFY_DEADLINE_S, f"{shown}: /verify took {elapsed_s:.1f} s (deadline {VERIFY_DEADLINE_S:g} s)"
    )
    _require(answer.status_code < 500, shown)
    if not _schema_valid(subject.server.verify_request_type, body):
        _require(
            400 <= answer.status_code < 500, f"{shown} (the body does not fit verify_request_type: expected a 4xx)"
        )
        return
    _require(answer.status_code == 200, f"{shown} (the body fits verify_request_type: expected 200)")
    _reward(answer, what, subject.server.reward_range)


def _schema_valid(request_type: type[VerifyRequest], body: dict[str, Any]) -> bool:
    try:
        request_type.model_validate(body)
    except ValidationError:
        return False
    return True


_CHECK_FUNCTIONS: dict[str, Callable[[_Subject], None]] = {
    "health": check_health,
    "tool-schemas": check_tool_schemas,
    "malformed-verify": check_malformed_verify,
    "session-idempotence": check_session_idempotence,
    "example-rows-verify": check_example_rows_verify,
    "bad-answers": check_bad_answers,
}
_NEED_NO_ROWS = ("health", "tool-schemas")


# -- python -m nemo_gym.env.conformance ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run the checks on a folder and print each problem; exit 1 when a check failed, 0 when none did or when the
    folder holds an agent or model server (the checks do not apply; said in the output and in `--json-out`)."""
    parser = argparse.ArgumentParser(prog="python -m nemo_gym.env.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the resources server folder")
    parser.add_argument(
        "--json-out",
        type=Path,
        help="write {passed: [check], problems: [{check, message}], skipped: reason or null} here",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the summary line (the caller reports the problems: ng_test)"
    )
    args = parser.parse_args(argv)
    skipped, problems = None, []
    try:
        problems = check_resources_server(args.folder)
    except NotAResourcesServerError as exc:
        skipped = str(exc)
    except MissingPackageError as exc:
        problems = [CheckProblem("load", str(exc))]
    for problem in [] if args.quiet else problems:
        print(f"conformance check {problem}")
    passed = [] if skipped else checks_passed(problems)
    print(
        f"conformance checks: skipped ({skipped})"
        if skipped
        else f"conformance checks: {len(passed)} passed, {len(problems)} failed"
    )
    if args.json_out:
        args.json_out.write_text(
            json.dumps({"passed": passed, "problems": [asdict(p) for p in problems], "skipped": skipped})
        )
    return 1 if problems else 0


def checks_passed(problems: list[CheckProblem]) -> list[str]:
    """The checks that ran and passed, given the problems `check_resources_server` returned: none after a `load`
    problem, only `health` and `tool-schemas` (and `load`) after an `example-data` one."""
    failed = {p.check for p in problems}
    ran = (
        ["load"]
        if "load" in failed
        else ["load", "example-data", *_NEED_NO_ROWS]
        if "example-data" in failed
        else list(CHECKS)
    )
    return [name for name in ran if name not in failed]


if __name__ == "__main__":
    sys.exit(main())
