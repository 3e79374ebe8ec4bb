"""The environment over HTTP (FastAPI's TestClient on the real app, no mocks): SQL extraction, read-only
execution with limits, result-set comparison and the bundled data.

Run from the project folder: `pytest tests` (this Python) or `ng_test +entrypoint=.` (the server's own environment).
"""

from __future__ import annotations

import json
import sqlite3
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
    with TestClient(
        load_server_class(PROJECT / "app.py")({"time_limit_s": 1.0, "max_rows": 100}, name="sql").build_app()
    ) as client:
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


def row_asking(question_start: str) -> dict[str, Any]:
    return next(
        r
        for rows in ROWS.values()
        for r in rows
        if r["responses_create_params"]["input"][-1]["content"].startswith(question_start)
    )


@pytest.mark.parametrize(
    "row", ROWS["train"] + ROWS["example"], ids=lambda row: row["responses_create_params"]["input"][-1]["content"][:40]
)
def test_gold_query_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    result = verify(client, row, f"Here it is:\n```sql\n{row['gold_sql']};\n```")
    assert (result["reward"], result["failure_reason"]) == (1.0, None)


def test_equivalent_queries_get_1(client: TestClient) -> None:
    lyon = row_asking("List the names of the customers who live in Lyon")
    assert (
        verify(
            client, lyon, "```sql\nSELECT c.name FROM customers AS c WHERE c.city IN ('Lyon') ORDER BY c.name DESC\n```"
        )["reward"]
        == 1.0
    )  # any order
    assert verify(client, lyon, "SELECT name FROM customers WHERE city = 'Lyon'")["reward"] == 1.0  # a bare query
    top3 = row_asking("List the names of the three most expensive products")
    assert (
        verify(client, top3, "```sql\nSELECT name FROM products ORDER BY price ASC LIMIT 3\n```")["failure_reason"]
        == "wrong_result"
    )
    average = row_asking("What is the average price of the products in the category 'garden'")
    assert (
        verify(client, average, "```sql\nSELECT SUM(price) / COUNT(*) FROM products WHERE category = 'garden'\n```")[
            "reward"
        ]
        == 1.0
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I do not know SQL.", "no_sql"),
        ("```sql\nSELEC name FROM customers\n```", "sql_error"),
        ("```sql\nSELECT nme FROM customers\n```", "sql_error"),
        ("```sql\nSELECT name FROM customers WHERE city = 'Porto'\n```", "wrong_result"),
        ("```sql\nDELETE FROM customers\n```", "sql_error"),
        ("```sql\nDROP TABLE customers\n```", "sql_error"),
        ("```sql\nINSERT INTO customers VALUES (99, 'X', 'Y', 2020)\n```", "sql_error"),
        ("```sql\nATTACH DATABASE 'other.db' AS other\n```", "sql_error"),
        ("```sql\nPRAGMA table_info(customers)\n```", "sql_error"),
        ("```sql\nSELECT 1; DELETE FROM customers\n```", "sql_error"),
        ("```sql\nSELECT zeroblob(100000000)\n```", "sql_error"),
        (
            "```sql\nWITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n\n```",
            "too_many_rows",
        ),
        (
            "```sql\nWITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n\n```",
            "timeout",
        ),
    ],
)
def test_failures_get_0_with_a_reason(client: TestClient, text: str, reason: str) -> None:
    result = verify(client, row_asking("List the names of the customers who live in Lyon"), text)
    assert (result["reward"], result["failure_reason"]) == (0.0, reason), result


def test_the_database_is_never_changed(client: TestClient) -> None:
    verify(client, ROWS["example"][0], "```sql\nDELETE FROM orders\n```")
    with sqlite3.connect(PROJECT / "data" / "shop.sqlite") as connection:
        assert connection.execute("SELECT COUNT(*) FROM orders").fetchone() == (48,)
    assert not (PROJECT / "data" / "other.db").exists()


def test_a_broken_gold_query_is_422(client: TestClient) -> None:
    answer = client.post(
        "/verify",
        json={**ROWS["example"][0], "gold_sql": "SELECT nothing FROM nowhere", "response": response("SELECT 1")},
    )
    assert answer.status_code == 422 and "gold_sql fails" in answer.text


def test_bundled_data() -> None:
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
    questions = [r["responses_create_params"]["input"][-1]["content"] for rows in ROWS.values() for r in rows]
    assert len(set(questions)) == len(questions)
    assert all(
        "CREATE TABLE orders" in r["responses_create_params"]["input"][0]["content"]
        for rows in ROWS.values()
        for r in rows
    )
