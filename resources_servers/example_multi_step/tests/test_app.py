"""Tools and verify of example_multi_step, over HTTP (FastAPI TestClient, no mocks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.serving.entrypoint import load_server_class

APP = Path(__file__).resolve().parents[1] / "app.py"
# A task in the shape of data/example.jsonl: submit the values of "Blazing" and "Warm", in that order;
# the original term "Hot" (value 299) is the minefield.
TASK = {
    "id": 0,
    "responses_create_params": {"input": [{"role": "user", "content": "How hot is it?"}]},
    "expected_synonyms": ["Blazing", "Warm"],
    "expected_synonym_values": [711, 407],
    "minefield_label": "Hot",
    "minefield_label_value": 299,
}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(load_server_class(APP)(name="example_multi_step").build_app()) as client:
        yield client


def response(*calls: tuple[str, Any]) -> dict[str, Any]:
    """A Response whose output is the given function calls (name, arguments) and a closing message."""
    output: list[dict[str, Any]] = [
        {
            "type": "function_call",
            "name": name,
            "arguments": args if isinstance(args, str) else json.dumps(args),
            "call_id": f"call_{i}",
            "status": "completed",
        }
        for i, (name, args) in enumerate(calls)
    ]
    output.append(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        }
    )
    return {
        "id": "resp",
        "created_at": 0,
        "model": "test",
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def verify(client: TestClient, *calls: tuple[str, Any], **task: Any) -> dict[str, Any]:
    answer = client.post("/verify", json={**TASK, **task, "response": response(*calls)})
    assert answer.status_code == 200, answer.text
    return answer.json()


def submit(values: Any) -> tuple[str, Any]:
    return ("extract_synonym_values", {"synonym_values": values})


def test_get_synonym_value_is_the_sum_of_code_points(client: TestClient) -> None:
    # "Blazing": 66 + 108 + 97 + 122 + 105 + 110 + 103 = 711; "Warm": 87 + 97 + 114 + 109 = 407.
    assert client.post("/get_synonym_value", json={"synonym": "Blazing"}).json() == {"synonym_value": 711}
    assert client.post("/get_synonym_value", json={"synonym": "Warm"}).json() == {"synonym_value": 407}
    assert client.post("/get_synonym_value", json={"synonym": ""}).json() == {"synonym_value": 0}


def test_extract_synonym_values_acknowledges(client: TestClient) -> None:
    assert client.post("/extract_synonym_values", json={"synonym_values": [711, 407]}).json() == {"success": True}
    assert client.post("/extract_synonym_values", json={"synonym_values": "711"}).status_code == 422


def test_exact_submission_gets_full_reward(client: TestClient) -> None:
    answer = verify(client, ("get_synonym_value", {"synonym": "Blazing"}), submit([711, 407]))
    assert answer["reward"] == 1.0 and answer["accuracy"] is True
    assert answer["parsed_synonym_values"] == [711, 407] and answer["set_overlap"] == 1.0
    assert answer["original_term_minefield_hit"] is False and answer["order_instruction_following_failure"] is False


def test_wrong_order_is_an_order_failure(client: TestClient) -> None:
    answer = verify(client, submit([407, 711]))
    assert answer["reward"] == 0.0 and answer["set_overlap"] == 1.0
    assert answer["order_instruction_following_failure"] is True


def test_partial_submission_and_minefield(client: TestClient) -> None:
    # {711, 299} ∩ {711, 407} = {711}: overlap 1/2.
    answer = verify(client, submit([711, 299]))
    assert answer["reward"] == 0.0 and answer["set_overlap"] == 0.5
    assert answer["original_term_minefield_hit"] is True and answer["order_instruction_following_failure"] is False


def test_the_last_submission_counts(client: TestClient) -> None:
    assert verify(client, submit([407]), submit([711, 407]))["reward"] == 1.0
    assert verify(client, submit([711, 407]), submit([407]))["parsed_synonym_values"] == [407]


@pytest.mark.parametrize(
    "arguments", ["not json", "{}", '{"synonym_values": "711"}', '{"synonym_values": [711, "407"]}']
)
def test_malformed_submission_counts_as_none(client: TestClient, arguments: str) -> None:
    answer = verify(client, ("extract_synonym_values", arguments))
    assert answer["reward"] == 0.0 and answer["parsed_synonym_values"] == [] and answer["set_overlap"] == 0.0


def test_no_submission(client: TestClient) -> None:
    answer = verify(client, ("get_synonym_value", {"synonym": "Warm"}))
    assert answer["reward"] == 0.0 and answer["parsed_synonym_values"] == []


@pytest.mark.parametrize("task", [{"expected_synonym_values": []}, {"minefield_label_value": "x"}, {"id": None}])
def test_malformed_task_is_422(client: TestClient, task: dict[str, Any]) -> None:
    assert client.post("/verify", json={**TASK, **task, "response": response(submit([711]))}).status_code == 422


def test_missing_task_field_is_422(client: TestClient) -> None:
    body = {k: v for k, v in TASK.items() if k != "expected_synonym_values"}
    assert client.post("/verify", json={**body, "response": response()}).status_code == 422
