"""The environment over HTTP (FastAPI's TestClient on the real app, no mocks): the MCP server runs as a real
subprocess over stdio, and every tool call goes through the mcp client library to it.

Run from the project folder: `pytest tests` (this Python, with the mcp package) or `ng_test +entrypoint=.`
(the server's own environment, built from requirements.txt).
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
BOOKS = json.loads((PROJECT / "data" / "books.json").read_text())


@pytest.fixture(scope="module")
def server() -> Any:
    return load_server_class(PROJECT / "app.py")(name="mcp")


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[TestClient]:
    with TestClient(server.build_app()) as client:
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


def test_the_mcp_tools_are_the_server_tools(client: TestClient) -> None:
    tools = client.get("/tools").json()
    assert [t["name"] for t in tools] == ["search_books", "book_details"]
    assert tools[0]["parameters"]["required"] == ["query"] and "case-insensitive" in tools[0]["description"]
    assert all(row["responses_create_params"]["tools"] == tools for rows in ROWS.values() for row in rows)


def test_calls_go_to_the_mcp_server(client: TestClient) -> None:
    found = client.post("/search_books", json={"query": "lindqvist"}).json()
    assert found == {
        "result": [
            {"id": "bk-101", "title": "The Silent Orbit", "author": "Mara Lindqvist"},
            {"id": "bk-104", "title": "Night Ferry to Turku", "author": "Mara Lindqvist"},
        ]
    }
    assert client.post("/book_details", json={"book_id": "bk-108"}).json() == {"id": "bk-108", **BOOKS["bk-108"]}


def test_a_tool_error_is_an_answer_for_the_model(client: TestClient) -> None:
    answer = client.post("/book_details", json={"book_id": "bk-999"})
    assert answer.status_code == 200 and "no book with id 'bk-999'" in answer.json()["error"]


@pytest.mark.parametrize("arguments", [{}, {"query": 5}, {"book_id": "bk-101"}])
def test_arguments_outside_the_tool_schema_are_422(client: TestClient, arguments: dict[str, Any]) -> None:
    answer = client.post("/search_books", json=arguments)
    assert answer.status_code == 422 and answer.json()["detail"], answer.text


def test_a_body_that_is_not_a_json_object_is_4xx(client: TestClient) -> None:
    for body in (b"{not json", b"[1, 2]"):
        answer = client.post("/book_details", content=body, headers={"Content-Type": "application/json"})
        assert 400 <= answer.status_code < 500, answer.text


@pytest.mark.parametrize(
    "row", ROWS["example"], ids=lambda row: row["responses_create_params"]["input"][-1]["content"][:40]
)
def test_right_answer_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    answer = client.post("/verify", json={**row, "response": response(f"The answer is {row['expected_answer']}.")})
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0


@pytest.mark.parametrize(
    ("expected", "text", "reward"),
    [
        ("312", "It has 312 pages.", 1.0),
        ("312", "It has 3120 pages.", 0.0),
        ("312", "It has 31 pages.", 0.0),
        ("Mara Lindqvist", "It was written by mara lindqvist!", 1.0),
        ("Mara Lindqvist", "By Mara.", 0.0),
        ("C4", "Shelf c4.", 1.0),
        ("C4", "Shelf C44.", 0.0),
        ("1987", "", 0.0),
    ],
)
def test_reward(client: TestClient, expected: str, text: str, reward: float) -> None:
    row = {**ROWS["example"][0], "expected_answer": expected}
    assert client.post("/verify", json={**row, "response": response(text)}).json()["reward"] == reward


def test_bundled_answers_match_the_catalogue() -> None:
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
    for rows in ROWS.values():
        for row in rows:
            question = row["responses_create_params"]["input"][-1]["content"]
            book = next(b for b in BOOKS.values() if f'"{b["title"]}"' in question)
            assert row["expected_answer"] in {str(book["pages"]), str(book["year"]), book["author"], book["shelf"]}


def test_a_dead_mcp_server_fails_the_call_instead_of_scoring_it() -> None:
    """No answer from the MCP server is an infrastructure failure (503: the rollout goes to the failures file), not a tool error."""  # noqa: E501
    import psutil

    with TestClient(load_server_class(PROJECT / "app.py")(name="mcp").build_app()) as client:
        started = [
            p for p in psutil.Process().children(recursive=True) if any("mcp_server.py" in part for part in p.cmdline())
        ]
        mcp_server = max(started, key=lambda p: p.create_time())  # this client's (another test's may still run)
        mcp_server.kill()
        mcp_server.wait(10)
        answer = client.post("/search_books", json={"query": "orbit"})
        assert answer.status_code == 503 and "did not answer search_books" in answer.text
