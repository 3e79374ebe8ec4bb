"""Tutorial step 5: test the tool and the reward before training. FastAPI's TestClient runs the real app in
this process and sends real HTTP requests, with the session header the agent sends during a rollout.

Run from the project folder: `pytest tests` (this Python) or `ng_test +entrypoint=.` (the server's own environment).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.serving.entrypoint import load_server_class

PROJECT = Path(__file__).resolve().parents[1]
ROWS = {
    name: [json.loads(line) for line in (PROJECT / "data" / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    for name in ("train", "example")
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(load_server_class(PROJECT / "app.py")(name="tutorial_tool").build_app()) as client:
        yield client


def response(text: str) -> dict[str, Any]:
    """What the agent sends as `response`: an OpenAI Responses `Response` whose output is one assistant message."""
    message = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_test",
        "created_at": 0,
        "model": "test",
        "object": "response",
        "output": [message],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


def guess(client: TestClient, session: str, number: int) -> dict[str, Any]:
    answer = client.post("/guess", json={"number": number}, headers={"X-Session-Id": session})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("row", ROWS["example"], ids=lambda row: f"{row['low']}-{row['high']}:{row['secret']}")
def test_binary_search_finds_the_secret_and_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    session = f"search-{row['secret']}-{row['low']}"
    assert client.post("/seed_session", json=row, headers={"X-Session-Id": session}).status_code == 200
    low, high = row["low"], row["high"]
    while True:  # what a good policy does with the tool's hints
        middle = (low + high) // 2
        hint = guess(client, session, middle)["hint"]
        if hint == "correct":
            break
        low, high = (middle + 1, high) if hint == "higher" else (low, middle - 1)
    answer = client.post(
        "/verify",
        json={**row, "response": response(f"The secret number is {middle}.")},
        headers={"X-Session-Id": session},
    )
    assert answer.json()["reward"] == 1.0 and 1 <= answer.json()["guesses"] <= 6


def test_hints_and_state_are_per_rollout(client: TestClient) -> None:
    row = ROWS["example"][0]  # secret 67
    assert row["secret"] == 67
    for session in ("a", "b"):
        client.post("/seed_session", json=row, headers={"X-Session-Id": session})
    assert guess(client, "a", 50) == {"guess": 50, "hint": "higher", "guesses_so_far": 1}
    assert guess(client, "a", 80) == {"guess": 80, "hint": "lower", "guesses_so_far": 2}
    assert guess(client, "b", 67) == {"guess": 67, "hint": "correct", "guesses_so_far": 1}  # b has its own count
    client.post("/seed_session", json=row, headers={"X-Session-Id": "a"})  # a new rollout starts over
    assert guess(client, "a", 67)["guesses_so_far"] == 1


@pytest.mark.parametrize(
    ("text", "reward"), [("It is 67.", 1.0), ("67", 1.0), ("It is 66.", 0.0), ("I give up.", 0.0), ("67? no, 68", 0.0)]
)
def test_reward_reads_the_last_number(client: TestClient, text: str, reward: float) -> None:
    answer = client.post(
        "/verify", json={**ROWS["example"][0], "response": response(text)}, headers={"X-Session-Id": "verify"}
    )
    assert answer.status_code == 200 and answer.json()["reward"] == reward


def test_bad_calls(client: TestClient) -> None:
    assert client.post("/guess", json={"number": "fifty"}).status_code == 422  # the type hint is enforced
    assert "error" in client.post("/guess", json={"number": 5}, headers={"X-Session-Id": "never-seeded"}).json()
    assert client.post("/seed_session", json={"responses_create_params": {}}).status_code == 422  # no secret in the row
    not_a_number = client.post("/seed_session", json={**ROWS["example"][0], "secret": "seven"})
    assert not_a_number.status_code == 422 and not_a_number.json()["detail"][0]["loc"] == [
        "secret"
    ]  # the framework says which field


def test_rows_advertise_the_tool_and_secrets_are_in_range(client: TestClient) -> None:
    tools = client.get("/tools").json()
    assert [t["name"] for t in tools] == ["guess"]
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
    for rows in ROWS.values():
        for row in rows:
            assert row["responses_create_params"]["tools"] == tools and row["low"] <= row["secret"] <= row["high"]
            assert str(row["secret"]) not in row["responses_create_params"]["input"][-1]["content"].replace(
                f"from {row['low']} to {row['high']}", ""
            )
