"""The environment over HTTP (FastAPI's TestClient on the real app, no mocks): rewards and the bundled data.

Run from the project folder: `pytest tests` (this Python) or `ng_test +entrypoint=.` (the server's own environment).
"""

from __future__ import annotations

import json
import re
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
    with TestClient(load_server_class(PROJECT / "app.py")(name="first_rl").build_app()) as client:
        yield client


def response(text: str) -> dict[str, Any]:
    """A Responses `Response` whose output is one assistant message saying `text`."""
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


def reward(client: TestClient, row: dict[str, Any], text: str) -> float:
    answer = client.post("/verify", json={**row, "response": response(text)})
    assert answer.status_code == 200, answer.text
    return answer.json()["reward"]


@pytest.mark.parametrize("row", ROWS["example"], ids=lambda row: row["responses_create_params"]["input"][-1]["content"])
def test_right_answer_gets_1_and_wrong_gets_0(client: TestClient, row: dict[str, Any]) -> None:
    right, wrong = row["expected_answer"], {"yes": "no", "no": "yes"}[row["expected_answer"]]
    assert reward(client, row, right) == 1.0
    assert reward(client, row, f"Let me think... {right.capitalize()}.") == 1.0  # case and punctuation do not matter
    assert reward(client, row, wrong) == 0.0
    assert reward(client, row, f"{right}? No, wait: {wrong}") == 0.0  # the last yes/no counts


@pytest.mark.parametrize("text", ["", "I do not know.", "yesterday, nobody"])
def test_no_yes_or_no_gets_0(client: TestClient, text: str) -> None:
    assert reward(client, ROWS["example"][0], text) == 0.0


def test_row_without_a_valid_expected_answer_is_422(client: TestClient) -> None:
    row = ROWS["example"][0]
    assert (
        client.post("/verify", json={**row, "expected_answer": "maybe", "response": response("yes")}).status_code == 422
    )
    assert (
        client.post(
            "/verify", json={"responses_create_params": row["responses_create_params"], "response": response("yes")}
        ).status_code
        == 422
    )


def test_bundled_answers_are_right() -> None:
    def is_prime(n: int) -> bool:
        return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))

    numbers = {}
    for name, rows in ROWS.items():
        for row in rows:
            n = int(re.search(r"Is (\d+) a prime", row["responses_create_params"]["input"][-1]["content"]).group(1))
            assert row["expected_answer"] == ("yes" if is_prime(n) else "no"), (name, n)
            numbers.setdefault(n, name)
    assert len(numbers) == len(ROWS["train"]) + len(ROWS["example"])  # no question in both files
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
