"""Tutorial step 8: test the reward before training on it. FastAPI's TestClient runs the real app in this
process and sends real HTTP requests to it, exactly what the agent sends during a rollout.

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
    with TestClient(load_server_class(PROJECT / "app.py")(name="tutorial_reward").build_app()) as client:
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


def verify(client: TestClient, row: dict[str, Any], text: str) -> dict[str, Any]:
    answer = client.post("/verify", json={**row, "response": response(text)})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("row", ROWS["example"], ids=lambda row: row["word"])
def test_right_count_in_tags_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    result = verify(client, row, f"Let me count the vowels of {row['word']}. <answer>{row['expected_answer']}</answer>")
    assert result["reward"] == 1.0 and result["reward_components"] == {"format": 1.0, "correct": 1.0}


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("<answer>4</answer>", 1.0),  # queue: u, e, u, e
        ("<answer> 4 </answer>", 1.0),  # spaces around the number are fine
        ("<answer>5</answer>", 0.2),  # the format alone
        ("<answer>2</answer> no, <answer>4</answer>", 1.0),  # the last tag counts
        ("<think><answer>4</answer></think><answer>3</answer>", 0.2),  # thinking is not the answer
        ("The word has 4 vowels.", 0.0),  # right, but not in the asked format
        ("<answer>four</answer>", 0.0),
        ("<answer>³</answer>", 0.0),
        ("<answer>4", 0.0),  # never closed
        ("", 0.0),
    ],
)
def test_reward_table(client: TestClient, text: str, reward: float) -> None:
    row = ROWS["example"][0]
    assert row["word"] == "queue"
    assert verify(client, row, text)["reward"] == pytest.approx(reward)


def test_row_without_the_task_fields_is_422(client: TestClient) -> None:
    row = {"responses_create_params": ROWS["example"][0]["responses_create_params"]}
    assert client.post("/verify", json={**row, "response": response("<answer>4</answer>")}).status_code == 422


def test_bundled_counts_are_right() -> None:
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
    for rows in ROWS.values():
        for row in rows:
            assert row["expected_answer"] == sum(c in "aeiou" for c in row["word"])
            assert f'"{row["word"]}"' in row["responses_create_params"]["input"][-1]["content"]
