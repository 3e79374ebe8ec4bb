"""Tools, sessions and verify of example_session_state_mgmt, over HTTP (FastAPI TestClient, no mocks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.serving.entrypoint import load_server_class

APP = Path(__file__).resolve().parents[1] / "app.py"
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "add 1 then add 2"}]},
    "initial_count": 3,
    "expected_count": 6,
}
RESPONSE = {
    "id": "resp",
    "created_at": 0,
    "model": "test",
    "object": "response",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(load_server_class(APP)(name="example_session_state_mgmt").build_app()) as client:
        yield client


def session(session_id: str) -> dict[str, str]:
    return {"X-Session-Id": session_id}


def post(client: TestClient, path: str, body: dict[str, Any], session_id: str) -> dict[str, Any]:
    answer = client.post(path, json=body, headers=session(session_id))
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_seed_sets_the_counter_and_tools_change_it(client: TestClient) -> None:
    assert post(client, "/seed_session", ROW, "a") == {}
    assert post(client, "/get_counter_value", {}, "a") == {"count": 3}
    assert post(client, "/increment_counter", {"count": 1}, "a") == {"success": True}
    assert post(client, "/increment_counter", {"count": 2}, "a") == {"success": True}
    assert post(client, "/get_counter_value", {}, "a") == {"count": 6}  # 3 + 1 + 2


def test_verify_compares_the_counter_with_expected_count(client: TestClient) -> None:
    post(client, "/seed_session", ROW, "a")
    post(client, "/increment_counter", {"count": 1}, "a")
    assert post(client, "/verify", {**ROW, "response": RESPONSE}, "a")["reward"] == 0.0  # 4 != 6
    post(client, "/increment_counter", {"count": 2}, "a")
    assert post(client, "/verify", {**ROW, "response": RESPONSE}, "a")["reward"] == 1.0  # 6 == 6


def test_sessions_are_isolated(client: TestClient) -> None:
    post(client, "/seed_session", ROW, "a")
    post(client, "/seed_session", {**ROW, "initial_count": 100}, "b")
    post(client, "/increment_counter", {"count": 3}, "a")
    assert post(client, "/get_counter_value", {}, "a") == {"count": 6}
    assert post(client, "/get_counter_value", {}, "b") == {"count": 100}
    assert post(client, "/verify", {**ROW, "response": RESPONSE}, "b")["reward"] == 0.0


def test_a_session_without_counter_gets_zero(client: TestClient) -> None:
    assert post(client, "/verify", {**ROW, "expected_count": 0, "response": RESPONSE}, "never-seeded")["reward"] == 0.0


def test_unseeded_tools_start_from_zero(client: TestClient) -> None:
    # As in NeMo Gym, reading or incrementing creates the counter at 0.
    assert post(client, "/get_counter_value", {}, "c") == {"count": 0}
    assert post(client, "/verify", {**ROW, "expected_count": 0, "response": RESPONSE}, "c")["reward"] == 1.0
    post(client, "/increment_counter", {"count": 5}, "d")
    assert post(client, "/verify", {**ROW, "expected_count": 5, "response": RESPONSE}, "d")["reward"] == 1.0


def test_reseeding_restarts_the_counter(client: TestClient) -> None:
    post(client, "/seed_session", ROW, "a")
    post(client, "/increment_counter", {"count": 10}, "a")
    post(client, "/seed_session", ROW, "a")
    assert post(client, "/get_counter_value", {}, "a") == {"count": 3}


def test_closing_a_session_drops_its_counter(client: TestClient) -> None:
    post(client, "/seed_session", ROW, "a")
    assert client.post("/close_session", headers=session("a")).status_code == 200
    assert post(client, "/verify", {**ROW, "expected_count": 3, "response": RESPONSE}, "a")["reward"] == 0.0


def test_malformed_requests_are_422(client: TestClient) -> None:
    row = {k: v for k, v in ROW.items() if k != "initial_count"}
    assert client.post("/seed_session", json=row, headers=session("a")).status_code == 422
    row = {k: v for k, v in ROW.items() if k != "expected_count"}
    assert client.post("/verify", json={**row, "response": RESPONSE}, headers=session("a")).status_code == 422
    assert client.post("/increment_counter", json={"count": "many"}, headers=session("a")).status_code == 422
