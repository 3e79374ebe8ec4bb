"""One conformance check over every resources server (Gymnasium's `check_env`, for our servers).

Each folder under `resources_servers/` is found when the tests are collected, so a new server is checked
without editing this file. Its `app.py` is imported from the file path, the one `ResourcesServer` subclass
defined there is built with its default config and driven over HTTP (FastAPI's TestClient):

- `GET /health` answers ok;
- the `GET /tools` schemas are valid JSON Schema (Draft 2020-12);
- malformed `/verify` bodies (not JSON, a list, no `response`) get a 4xx, never a 500;
- seeding a session twice, and closing it twice, are idempotent;
- every row of `data/example.jsonl`, answered by one empty assistant message, verifies (twice, to the same
  reward) to a reward inside the class's `reward_range`;
- bad model output never crashes `/verify` and never stalls it: output of the wrong JSON types (content a
  number, parts that are not objects, text that is not a string, `output` not a list, junk items, tool calls
  with unparsable arguments or no name) for every example row, and huge answers (about 1 MB of prose, of
  unclosed markup, of whitespace) for the first, each get within VERIFY_DEADLINE_S a 200 with a reward
  inside `reward_range` when the body is valid for the server's `verify_request_type` (the declared schema;
  `response` is any object there), else a 4xx; never a 5xx.

A server whose `requirements.txt` lists a package that is not installed here is skipped, naming it.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from nemo_gym.serve import load_server_class
from nemo_gym.server import ResourcesServer, VerifyRequest
from nemo_gym.jsonl import read_jsonl

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVERS_DIR = REPO_ROOT / "resources_servers"
SESSION = {"X-Session-Id": "conformance"}
EMPTY_ANSWER = {
    "id": "resp_conformance",
    "created_at": 0,
    "model": "conformance",
    "object": "response",
    "output": [
        {
            "id": "msg_conformance",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        }
    ],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}
VERIFY_DEADLINE_S = 30.0  # one /verify of bad model output; the slowest server here takes about a second
HUGE_ANSWER_CHARS = 1_000_000  # far above every answer cap (2k-20k characters), far below the body cap (64 MiB)


def answer_with(content: Any = None, *, output: Any = None) -> dict[str, Any]:
    """EMPTY_ANSWER with its message's `content`, or its whole `output`, replaced."""
    answer = copy.deepcopy(EMPTY_ANSWER)
    if output is not None:
        answer["output"] = output
    else:
        answer["output"][0]["content"] = content
    return answer


def huge_answers(huge_chars: int) -> dict[str, Any]:
    """Answers of about `huge_chars` characters a verifier must score without stalling."""

    def huge(unit: str) -> dict[str, Any]:
        return answer_with([{"type": "output_text", "text": unit * (huge_chars // len(unit)), "annotations": []}])

    return {
        "huge prose": huge("Let me think step by step. "),
        # A model stuck in a loop: quadratic extractors (a lazy `<think>.*?</think>`, a box scanned from every
        # `\boxed{`) take hours on this.
        "huge unclosed markup": huge("<think> <answer> \\boxed{ The answer is: "),
        # Regexes whose `\s+`/`\s*` are tried from every space of a run (math_verify's phrase end, reasoning_gym's
        # "answer is") are quadratic or worse here.
        "huge whitespace": answer_with([{"type": "output_text", "text": "The answer is 4" + " " * huge_chars + ".", "annotations": []}]),
    }


def wrong_type_answers() -> dict[str, Any]:
    """Responses with content of the wrong JSON types (the last two are not even objects: schema errors)."""
    return {
        "content a number": answer_with(42),
        "content an object": answer_with({"type": "output_text", "text": "stand"}),
        "parts not objects": answer_with([1, None, "x", [2]]),
        "text not a string": answer_with([{"type": "output_text", "text": 42}, {"type": "output_text", "text": None}]),
        "output a string": answer_with(output="stand"),
        "output a number": answer_with(output=5),
        "output items of no shape": answer_with(output=[None, 3, "x", [], {"type": 5}, {"type": "message", "role": 7, "content": "x"}]),
        "tool call with unparsable arguments": answer_with(output=[{"type": "function_call", "name": "f", "arguments": "{not json", "call_id": "c"}]),
        "tool call of wrong types": answer_with(output=[{"type": "function_call", "name": None, "arguments": {"a": 1}, "call_id": 5}]),
        "no output": {},
        "response a string": "stand",
        "response a list": [EMPTY_ANSWER],
    }


def server_folders() -> list[Path]:
    return sorted(p for p in SERVERS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def required_packages(folder: Path) -> set[str]:
    """Normalized distribution names listed in the folder's requirements.txt."""
    path = folder / "requirements.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    names = (re.split(r"[\s<>=!~\[;@]", line.strip(), maxsplit=1)[0] for line in lines)
    return {normalized(name) for name in names if name and not name.startswith(("#", "-"))}


def load_resources_server(folder: Path) -> type[ResourcesServer]:
    """The server class of `folder/app.py`; skips when it needs a package its requirements.txt lists."""
    assert (folder / "app.py").is_file(), f"{folder.name}: no app.py"
    try:
        cls = load_server_class(folder / "app.py")
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if normalized(root) not in required_packages(folder):
            raise
        pytest.importorskip(root, reason=f"{folder.name} needs {root} (listed in its requirements.txt), not installed here")
        raise
    assert issubclass(cls, ResourcesServer), f"{folder.name}: {cls.__name__} is not a ResourcesServer"
    return cls


def example_rows(folder: Path) -> list[dict[str, Any]]:
    path = folder / "data" / "example.jsonl"
    assert path.is_file(), f"{folder.name}: no data/example.jsonl"
    rows = read_jsonl(path)
    assert rows, f"{folder.name}: data/example.jsonl is empty"
    return rows


def check_tool_schemas(client: TestClient) -> None:
    answer = client.get("/tools")
    assert answer.status_code == 200, answer.text
    for tool in answer.json():
        assert tool["type"] == "function" and tool["name"] and isinstance(tool["description"], str), tool
        Draft202012Validator.check_schema(tool["parameters"])
        assert tool["parameters"].get("type") == "object", tool


def check_malformed_verify_bodies(client: TestClient, row: dict[str, Any]) -> None:
    bodies = {
        "not JSON": b"{not json",
        "a list": json.dumps([row]).encode(),
        "no response": json.dumps({k: v for k, v in row.items() if k != "response"}).encode(),
    }
    for what, body in bodies.items():
        answer = client.post("/verify", content=body, headers={"Content-Type": "application/json", **SESSION})
        assert 400 <= answer.status_code < 500, f"/verify with {what}: {answer.status_code} {answer.text[:300]}"


def check_session_idempotence(client: TestClient, server: ResourcesServer, row: dict[str, Any]) -> None:
    first = client.post("/seed_session", json=row, headers=SESSION)
    assert first.status_code == 200, first.text
    state = copy.deepcopy(dict(server.sessions[SESSION["X-Session-Id"]]))
    second = client.post("/seed_session", json=row, headers=SESSION)
    assert second.status_code == 200 and second.json() == first.json(), second.text
    assert dict(server.sessions[SESSION["X-Session-Id"]]) == state, "seeding twice changed the session state"
    for _ in range(2):
        assert client.post("/close_session", headers=SESSION).status_code == 200


def check_example_rows_verify(client: TestClient, rows: list[dict[str, Any]], reward_range: tuple[float, float]) -> None:
    low, high = reward_range
    for index, row in enumerate(rows):
        headers = {"X-Session-Id": f"conformance-row-{index}"}
        assert client.post("/seed_session", json=row, headers=headers).status_code == 200
        rewards = []
        for _ in range(2):
            answer = client.post("/verify", json={**row, "response": EMPTY_ANSWER}, headers=headers)
            assert answer.status_code == 200, f"row {index}: {answer.status_code} {answer.text[:300]}"
            rewards.append(answer.json()["reward"])
        assert rewards[0] == rewards[1], f"row {index}: verify is not deterministic: {rewards}"
        reward = rewards[0]
        assert isinstance(reward, float) and low <= reward <= high, f"row {index}: reward {reward} outside {reward_range}"


def schema_valid(request_type: type[VerifyRequest], body: dict[str, Any]) -> bool:
    try:
        request_type.model_validate(body)
    except ValidationError:
        return False
    return True


def check_bad_answers_never_crash(client: TestClient, server: ResourcesServer, rows: list[dict[str, Any]]) -> None:
    low, high = server.reward_range
    huge_chars = min(HUGE_ANSWER_CHARS, int(server.config.max_body_mb * 2**20) // 8)  # a server with a lower cap
    for index, row in enumerate(rows):
        headers = {"X-Session-Id": f"conformance-bad-{index}"}
        # Huge answers for the first row only: 1 MB each, every row would add half a minute to the suite.
        answers = {**huge_answers(huge_chars), **wrong_type_answers()} if index == 0 else wrong_type_answers()
        for what, response in answers.items():
            assert client.post("/seed_session", json=row, headers=headers).status_code == 200
            body = {**row, "response": response}
            start_s = time.monotonic()
            answer = client.post("/verify", json=body, headers=headers)
            elapsed_s = time.monotonic() - start_s
            shown = f"row {index}, {what}: {answer.status_code} {answer.text[:300]}"
            assert elapsed_s <= VERIFY_DEADLINE_S, f"{shown}: /verify took {elapsed_s:.1f} s (deadline {VERIFY_DEADLINE_S:g} s)"
            assert answer.status_code < 500, shown
            if not schema_valid(server.verify_request_type, body):
                assert 400 <= answer.status_code < 500, shown
                continue
            assert answer.status_code == 200, shown
            reward = answer.json()["reward"]
            assert isinstance(reward, float) and low <= reward <= high, f"{shown}: reward {reward} outside {server.reward_range}"


@pytest.mark.parametrize("folder", server_folders(), ids=lambda folder: folder.name)
def test_resources_server_conformance(folder: Path) -> None:
    cls = load_resources_server(folder)
    rows = example_rows(folder)
    server = cls(name=folder.name)
    with TestClient(server.build_app()) as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        check_tool_schemas(client)
        check_malformed_verify_bodies(client, {**rows[0], "response": EMPTY_ANSWER})
        check_session_idempotence(client, server, rows[0])
        check_example_rows_verify(client, rows, cls.reward_range)
        check_bad_answers_never_crash(client, server, rows)
