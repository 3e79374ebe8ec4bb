"""The environment over HTTP (FastAPI's TestClient on the real app, no mocks): tools, rewards, bundled data.

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
PLANETS = json.loads((PROJECT / "data" / "planets.json").read_text())


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(load_server_class(PROJECT / "app.py")(name="rl_tools").build_app()) as client:
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


def test_lookup(client: TestClient) -> None:
    assert client.post("/lookup", json={"planet": "zorblax "}).json() == {"planet": "Zorblax", **PLANETS["Zorblax"]}
    unknown = client.post("/lookup", json={"planet": "Earth"}).json()
    assert unknown["error"] == "unknown planet 'Earth'" and unknown["known_planets"] == sorted(PLANETS)


@pytest.mark.parametrize(("expression", "result"), [("(12 + 7) * 2", 38.0), ("-3 / 4", -0.75), ("2.5 - 0.75", 1.75)])
def test_calculator(client: TestClient, expression: str, result: float) -> None:
    assert client.post("/calculator", json={"expression": expression}).json() == {"result": result}


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "2 ** 1000", "1 / 0", "1e300 * 1e300", "(" * 300, "x + 1", "9" * 300]
)
def test_calculator_refuses_anything_else(client: TestClient, expression: str) -> None:
    answer = client.post("/calculator", json={"expression": expression})
    assert answer.status_code == 200 and set(answer.json()) == {"error"}


def test_tool_with_bad_arguments_is_422(client: TestClient) -> None:
    assert client.post("/lookup", json={}).status_code == 422
    assert client.post("/calculator", json={"expression": 5, "extra": 1}).status_code == 422


def test_rows_advertise_the_server_tools(client: TestClient) -> None:
    tools = client.get("/tools").json()
    assert [t["name"] for t in tools] == ["calculator", "lookup"]
    assert all(row["responses_create_params"]["tools"] == tools for rows in ROWS.values() for row in rows)


@pytest.mark.parametrize(
    "row", ROWS["example"], ids=lambda row: row["responses_create_params"]["input"][-1]["content"][:40]
)
def test_right_final_answer_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    value = row["expected_answer"]
    for text in (f"The answer is {value:g}", f"That makes {value:,.2f}"):
        answer = client.post("/verify", json={**row, "response": response(text)})
        assert answer.status_code == 200 and answer.json()["reward"] == 1.0, (text, answer.text)


@pytest.mark.parametrize("text", ["", "I need to look that up.", "About 100000.5", "5 moons? No: 6"])
def test_wrong_or_missing_answer_gets_0(client: TestClient, text: str) -> None:
    row = ROWS["example"][0]  # Orrin has 5 moons
    assert row["expected_answer"] == 5.0
    answer = client.post("/verify", json={**row, "response": response(text)})
    assert answer.status_code == 200 and answer.json()["reward"] == 0.0


def test_bundled_rows_are_answerable_with_the_tools() -> None:
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
    for rows in ROWS.values():
        for row in rows:
            question = row["responses_create_params"]["input"][-1]["content"]
            assert any(name in question for name in PLANETS), question
