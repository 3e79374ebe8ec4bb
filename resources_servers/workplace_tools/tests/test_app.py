"""workplace_tools over real HTTP (FastAPI TestClient): tools, tool errors, sessions, verify, data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
ROWS = read_jsonl(SERVER_DIR / "data/example.jsonl")
ROW = ROWS[0]  # Push 'Team sync' (E101) from Friday 2025-03-14 to Tuesday 2025-03-11, same time.


def call(name: str, arguments: dict | str) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": f"c_{name}", "name": name, "arguments": text}


def response(*items: dict) -> dict:
    return {
        "id": "r",
        "object": "response",
        "output": [
            *items,
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        ],
    }


@pytest.fixture
def client():
    with server_client(SERVER_DIR) as client:
        yield client


def seeded(client: TestClient, session_id: str, row: dict = ROW) -> dict:
    headers = {"X-Session-Id": session_id}
    assert client.post("/seed_session", json=row, headers=headers).status_code == 200
    return headers


def test_list_update_and_verify_full_reward(client):
    headers = seeded(client, "s1")
    events = client.post("/list_events", json={"date": "2025-03-14"}, headers=headers).json()["events"]
    assert [e["event_id"] for e in events] == ["E101"] and events[0]["title"] == "Team sync"
    updated = client.post("/update_event", json={"event_id": "E101", "date": "2025-03-11"}, headers=headers).json()
    assert updated == {
        "event_id": "E101",
        "title": "Team sync",
        "date": "2025-03-11",
        "start": "09:00",
        "duration_minutes": 90,
    }
    verified = client.post("/verify", json={**ROW, "response": response()}, headers=headers).json()
    assert verified["reward"] == 1.0 and verified["reward_components"] == {"calendar": 1.0, "inventory": 1.0}
    assert verified["replayed"] is False and verified["failure_reason"] is None


def test_wrong_final_state_scores_zero_with_partial_components(client):
    headers = seeded(client, "s2")
    client.post("/update_event", json={"event_id": "E101", "date": "2025-03-12"}, headers=headers)  # wrong day
    client.post("/remove_item", json={"item_id": "I104"}, headers=headers)  # an unrequested change
    verified = client.post("/verify", json={**ROW, "response": response()}, headers=headers).json()
    # calendar: 4 of 5 events match → 0.8; inventory: 5 of the 6 expected items left → 5 / max(6, 5)
    assert verified["reward"] == 0.0 and verified["failure_reason"] == "final_state_differs"
    assert verified["reward_components"] == {"calendar": pytest.approx(0.8), "inventory": pytest.approx(5 / 6)}


@pytest.mark.parametrize(
    "tool, arguments, message",
    [
        ("update_event", {"event_id": "E999", "start": "10:00"}, "no event with event_id 'E999'"),
        (
            "create_event",
            {"title": "X", "date": "next tuesday", "start": "10:00", "duration_minutes": 30},
            "date must be a calendar date",
        ),
        (
            "create_event",
            {"title": "X", "date": "2025-02-30", "start": "10:00", "duration_minutes": 30},
            "date must be a calendar date",
        ),
        (
            "create_event",
            {"title": "X", "date": "2025-03-12", "start": "25:00", "duration_minutes": 30},
            "start must be a time",
        ),
        (
            "create_event",
            {"title": " ", "date": "2025-03-12", "start": "10:00", "duration_minutes": 30},
            "title must be 1 to 100",
        ),
        (
            "create_event",
            {"title": "X", "date": "2025-03-12", "start": "10:00", "duration_minutes": 0},
            "duration_minutes must be 1 to 720",
        ),
        ("update_quantity", {"item_id": "I101", "quantity": -3}, "quantity must be 0 to"),
        ("remove_item", {"item_id": "nope"}, "no item with item_id 'nope'"),
        ("add_item", {"name": "usb-c cable", "quantity": 4}, "already in the inventory as I101"),
        ("delete_event", {"event_id": ""}, "no event with event_id ''"),
    ],
)
def test_tool_errors_come_back_as_error_json(client, tool, arguments, message):
    headers = seeded(client, "errors")
    before = json.dumps(client.server.sessions["errors"]["state"], sort_keys=True)
    answer = client.post(f"/{tool}", json=arguments, headers=headers)
    assert answer.status_code == 200 and message in answer.json()["error"]
    assert json.dumps(client.server.sessions["errors"]["state"], sort_keys=True) == before  # nothing changed


def test_wrong_argument_types_are_422(client):
    headers = seeded(client, "types")
    assert (
        client.post("/update_quantity", json={"item_id": "I101", "quantity": "many"}, headers=headers).status_code
        == 422
    )
    assert client.post("/delete_event", json={"id": "E101"}, headers=headers).status_code == 422


def test_create_add_delete_and_ids(client):
    headers = seeded(client, "s3")
    created = client.post(
        "/create_event",
        json={"title": "Roadmap", "date": "2025-03-13", "start": "9:05", "duration_minutes": 30},
        headers=headers,
    ).json()
    assert created == {
        "event_id": "E106",
        "title": "Roadmap",
        "date": "2025-03-13",
        "start": "09:05",
        "duration_minutes": 30,
    }
    assert client.post("/add_item", json={"name": "webcam", "quantity": 3}, headers=headers).json()["item_id"] == "I107"
    assert (
        client.post("/delete_event", json={"event_id": "E106"}, headers=headers).json()["deleted"]["title"] == "Roadmap"
    )
    again = client.post(
        "/create_event",
        json={"title": "Roadmap", "date": "2025-03-13", "start": "09:05", "duration_minutes": 30},
        headers=headers,
    ).json()
    assert again["event_id"] == "E107"  # ids are never reused
    items = client.post("/list_items", json={}, headers=headers).json()["items"]
    assert [i["item_id"] for i in items] == ["I101", "I102", "I103", "I104", "I105", "I106", "I107"]


def test_sessions_are_isolated_and_freed(client):
    a, b = seeded(client, "a"), seeded(client, "b")
    client.post("/remove_item", json={"item_id": "I101"}, headers=a)
    assert len(client.post("/list_items", json={}, headers=a).json()["items"]) == 5
    assert len(client.post("/list_items", json={}, headers=b).json()["items"]) == 6
    client.post("/close_session", headers=a)
    assert "a" not in client.server.sessions and "b" in client.server.sessions
    assert "not seeded" in client.post("/list_items", json={}, headers={"X-Session-Id": "never"}).json()["error"]


def test_verify_replays_function_calls_without_a_session(client):
    solved = response(call("list_events", {}), call("update_event", {"event_id": "E101", "date": "2025-03-11"}))
    verified = client.post("/verify", json={**ROW, "response": solved}).json()
    assert verified["reward"] == 1.0 and verified["replayed"] is True
    junk = response(
        call("update_event", "{not json"),
        call("drop_table", {}),
        call("update_event", {"event_id": "E101", "date": 5}),
        call("update_event", {"event_id": "E101", "when": "2025-03-11"}),
    )
    assert client.post("/verify", json={**ROW, "response": junk}).json()["reward"] == 0.0


@pytest.mark.parametrize(
    "output", [[], [None, 1, "x"], [{"type": "function_call", "name": "remove_item", "arguments": {"item_id": "I101"}}]]
)
def test_bad_model_output_never_crashes(client, output):
    answer = client.post("/verify", json={**ROW, "response": {"output": output}})
    assert answer.status_code == 200 and answer.json()["reward"] == 0.0


def test_malformed_rows_are_422(client):
    assert (
        client.post(
            "/verify", json={**{k: v for k, v in ROW.items() if k != "expected_state"}, "response": response()}
        ).status_code
        == 422
    )
    bad = {**ROW, "initial_state": {"events": [{"title": "x"}]}}
    assert client.post("/seed_session", json=bad, headers={"X-Session-Id": "bad"}).status_code == 422
    repeated = {
        **ROW,
        "initial_state": {
            "items": [{"item_id": "I1", "name": "a", "quantity": 1}, {"item_id": "I1", "name": "b", "quantity": 1}]
        },
    }
    assert client.post("/seed_session", json=repeated, headers={"X-Session-Id": "bad"}).status_code == 422


@pytest.mark.parametrize("initial_state", [None, "empty", {"events": [], "rooms": []}, {"items": [{"name": "a"}]}])
def test_a_bad_seed_row_is_a_422_naming_initial_state(client, initial_state):
    row = {k: v for k, v in ROW.items() if k != "initial_state"} | (
        {} if initial_state is None else {"initial_state": initial_state}
    )
    answer = client.post("/seed_session", json=row, headers={"X-Session-Id": "bad"})
    assert answer.status_code == 422, answer.text
    assert all(error["loc"][0] == "initial_state" for error in answer.json()["detail"]), answer.text


def test_rows_advertise_the_servers_tools_and_the_generator_is_deterministic(client):
    tools = client.get("/tools").json()
    tasks = read_jsonl(SERVER_DIR / "data/tasks.jsonl")
    assert len(tasks) >= 50 and tasks[:5] == ROWS
    assert all(row["responses_create_params"]["tools"] == tools for row in tasks)
    assert import_file(SERVER_DIR / "generate_data.py").task_rows() == tasks
    assert all(row["initial_state"] != row["expected_state"] for row in tasks)  # every task asks for a change
