"""The environment over HTTP (FastAPI's TestClient on the real app, no mocks): the tools drive the real system
Chromium on the local shop, and verify reads what the shop received.

Run from the project folder: `pytest tests` (this Python) or `ng_test +entrypoint=.` (the server's own environment).
Needs /usr/bin/chromium (`apt-get install chromium`).
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
ANSWER = {
    "id": "resp_test",
    "created_at": 0,
    "model": "test",
    "object": "response",
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        }
    ],
}
FORM_FIELDS = {
    "newsletter": ("#subscribe", ["email"]),
    "contact": ("#send", ["name", "message"]),
    "order": ("#place-order", ["product", "quantity"]),
}

pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/chromium").is_file(), reason="needs the system Chromium: apt-get install chromium"
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(
        load_server_class(PROJECT / "app.py")({"action_timeout_s": 1.0}, name="rl_browser").build_app()
    ) as client:
        yield client


def call(client: TestClient, session: str, tool: str, **arguments: Any) -> dict[str, Any]:
    answer = client.post(f"/{tool}", json=arguments, headers={"X-Session-Id": session})
    assert answer.status_code == 200, answer.text
    return answer.json()


def verify(client: TestClient, session: str, row: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/verify", json={**row, "response": ANSWER}, headers={"X-Session-Id": session})
    assert answer.status_code == 200, answer.text
    return answer.json()


def fill_and_submit(client: TestClient, session: str, form: str, values: dict[str, str]) -> None:
    call(client, session, "navigate", url="/")
    home = call(client, session, "read_page")
    assert f"#{form}-link" in [e["selector"] for e in home["elements"]]
    assert call(client, session, "click", selector=f"#{form}-link")["url"] == f"/{form}"
    button, fields = FORM_FIELDS[form]
    listed = [e["selector"] for e in call(client, session, "read_page")["elements"]]
    assert all(f"#{field}" in listed for field in fields) and button in listed
    for field in fields:
        assert call(client, session, "type_text", selector=f"#{field}", text=values.get(field, "")) == {
            "typed": values.get(field, ""),
            "into": f"#{field}",
        }
    assert call(client, session, "click", selector=button)["url"] == f"/{form}"  # the shop's thank-you page


ONE_ROW_PER_FORM = [
    next(r for r in ROWS["example"] + ROWS["train"] if r["expected_form"] == form) for form in FORM_FIELDS
]


@pytest.mark.parametrize("row", ONE_ROW_PER_FORM, ids=lambda row: row["expected_form"])
def test_submitting_the_right_values_gets_1(client: TestClient, row: dict[str, Any]) -> None:
    session = f"right-{id(row)}"
    client.post("/seed_session", json=row, headers={"X-Session-Id": session})
    fill_and_submit(
        client, session, row["expected_form"], {k: f"  {v.upper()} " for k, v in row["expected_fields"].items()}
    )  # case and spaces are ignored
    result = verify(client, session, row)
    assert (result["reward"], result["failure_reason"]) == (1.0, None)
    assert verify(client, session, row)["reward"] == 1.0  # verify is deterministic


def test_wrong_values_or_no_submission_get_0(client: TestClient) -> None:
    row = next(r for r in ROWS["example"] if r["expected_form"] == "newsletter")
    client.post("/seed_session", json=row, headers={"X-Session-Id": "wrong"})
    fill_and_submit(client, "wrong", "newsletter", {"email": "someone.else@example.com"})
    result = verify(client, "wrong", row)
    assert (result["reward"], result["failure_reason"], result["submitted_fields"]) == (
        0.0,
        "wrong_values",
        {"email": "someone.else@example.com"},
    )
    client.post("/seed_session", json=row, headers={"X-Session-Id": "idle"})
    call(client, "idle", "navigate", url="/newsletter")
    call(client, "idle", "type_text", selector="#email", text=row["expected_fields"]["email"])  # typed, never submitted
    assert verify(client, "idle", row)["failure_reason"] == "not_submitted"


def test_rollouts_are_isolated_and_a_new_seed_starts_over(client: TestClient) -> None:
    row = next(r for r in ROWS["example"] if r["expected_form"] == "order")
    for session in ("a", "b"):
        client.post("/seed_session", json=row, headers={"X-Session-Id": session})
    fill_and_submit(client, "a", "order", row["expected_fields"])
    assert verify(client, "b", row)["failure_reason"] == "not_submitted"  # a's submission is not b's
    client.post("/seed_session", json=row, headers={"X-Session-Id": "a"})
    assert verify(client, "a", row)["failure_reason"] == "not_submitted"


def test_tool_errors_are_answers_for_the_model(client: TestClient) -> None:
    assert "no page is open" in call(client, "errors", "read_page")["error"]
    for url in ("https://example.com/", "http://127.0.0.2/", "javascript:alert(1)", "file:///etc/passwd"):
        assert "only the shop's pages" in call(client, "errors", "navigate", url=url)["error"], url
    call(client, "errors", "navigate", url="/newsletter")
    assert "error" in call(client, "errors", "click", selector="#no-such-button")  # times out after action_timeout_s
    assert "error" in call(client, "errors", "type_text", selector="h1", text="x")  # not a field
    assert call(client, "errors", "navigate", url="/nowhere")["title"] == ""
    assert "Not found" in call(client, "errors", "read_page")["text"]


def test_tool_with_bad_arguments_is_422(client: TestClient) -> None:
    assert client.post("/navigate", json={}).status_code == 422
    assert client.post("/click", json={"selector": 1}).status_code == 422


def test_rows_advertise_the_server_tools(client: TestClient) -> None:
    tools = client.get("/tools").json()
    assert [t["name"] for t in tools] == ["navigate", "read_page", "type_text", "click"]
    assert all(row["responses_create_params"]["tools"] == tools for rows in ROWS.values() for row in rows)


def test_bundled_rows_name_every_field_of_their_form() -> None:
    assert len(ROWS["example"]) == 5 and 16 <= len(ROWS["train"]) <= 64
    for rows in ROWS.values():
        for row in rows:
            assert sorted(row["expected_fields"]) == sorted(FORM_FIELDS[row["expected_form"]][1])


def test_a_dead_browser_fails_the_call_instead_of_scoring_it() -> None:
    """Chromium gone is an infrastructure failure (503: the rollout goes to the failures file), not a tool error."""
    import psutil

    def chromium_processes() -> set[psutil.Process]:
        return {p for p in psutil.Process().children(recursive=True) if "chrom" in p.name().lower()}

    before = chromium_processes()  # another test's browser may still run
    with TestClient(
        load_server_class(PROJECT / "app.py")({"action_timeout_s": 1.0}, name="rl_browser").build_app()
    ) as client:
        assert call(client, "dead", "navigate", url="/")["title"] == "Corner Shop"
        for process in chromium_processes() - before:  # this client's Chromium, all its processes
            process.kill()
        for session in ("dead", "new"):  # the open page, and a page that cannot be opened any more
            answer = client.post("/navigate", json={"url": "/order"}, headers={"X-Session-Id": session})
            assert answer.status_code == 503, answer.text
