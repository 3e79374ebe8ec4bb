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
    with TestClient(load_server_class(PROJECT / "app.py")(name="rl_single").build_app()) as client:
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


def verify(client: TestClient, row: dict[str, Any], text: str) -> dict[str, Any]:
    answer = client.post("/verify", json={**row, "response": response(text)})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("row", ROWS["example"], ids=lambda row: row["responses_create_params"]["input"][-1]["content"])
def test_boxed_right_answer_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    result = verify(client, row, f"Step by step... so the result is \\boxed{{{row['expected_answer']}}}.")
    assert result["reward"] == 1.0 and result["reward_components"] == {"correct": 1.0, "boxed": 1.0}
    assert result["extracted_answer"] == row["expected_answer"]


def test_partial_credit_and_zero(client: TestClient) -> None:
    row = ROWS["example"][0]  # 16 * 12 = 192
    assert row["expected_answer"] == 192
    assert verify(client, row, "16 * 12 = 192")["reward"] == 0.5  # right number, no box: half credit
    assert verify(client, row, "\\boxed{1,000} no wait, 192")["reward"] == 0.0  # the box is the answer
    assert verify(client, row, "\\boxed{193}")["reward"] == 0.0
    assert verify(client, row, "\\boxed{192.0}")["reward"] == 1.0  # the same number
    result = verify(client, row, "I cannot compute that.")
    assert (
        result["reward"] == 0.0
        and result["extracted_answer"] is None
        and result["reward_components"] == {"correct": 0.0, "boxed": 0.0}
    )


def test_thinking_is_ignored(client: TestClient) -> None:
    assert verify(client, ROWS["example"][0], "<think>maybe \\boxed{191}</think> \\boxed{192}")["reward"] == 1.0
    assert verify(client, ROWS["example"][0], "<think>\\boxed{192}</think> I give up")["reward"] == 0.0


def test_row_without_an_integer_answer_is_422(client: TestClient) -> None:
    row = ROWS["example"][0]
    assert client.post("/verify", json={**row, "expected_answer": "many", "response": response("1")}).status_code == 422


def test_bundled_answers_are_right() -> None:
    questions = set()
    for rows in ROWS.values():
        for row in rows:
            a, op, b = re.fullmatch(
                r"What is (\d+) ([-+*]) (\d+)\?", row["responses_create_params"]["input"][-1]["content"]
            ).groups()
            assert row["expected_answer"] == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            questions.add((a, op, b))
    assert len(questions) == len(ROWS["train"]) + len(ROWS["example"])
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
