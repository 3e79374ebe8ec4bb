"""Tools and verify of example_single_tool_call, over HTTP (FastAPI TestClient, no mocks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.serving.entrypoint import load_server_class

APP = Path(__file__).resolve().parents[1] / "app.py"
ROW = json.loads((APP.parent / "data" / "example.jsonl").read_text().splitlines()[0])


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(load_server_class(APP)(name="example_single_tool_call").build_app()) as client:
        yield client


def response(*output: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "resp_test",
        "created_at": 0,
        "model": "test",
        "object": "response",
        "output": list(output),
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


def message(text: str) -> dict[str, Any]:
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "name": name,
        "arguments": json.dumps(arguments),
        "call_id": "call_1",
        "status": "completed",
    }


def test_get_weather_answers_like_nemo_gym(client: TestClient) -> None:
    answer = client.post("/get_weather", json={"city": "Warsaw"})
    assert answer.status_code == 200
    assert answer.json() == {"city": "Warsaw", "weather_description": "The weather in Warsaw is cold."}


def test_get_weather_without_city_is_422(client: TestClient) -> None:
    assert client.post("/get_weather", json={}).status_code == 422
    assert client.post("/get_weather", json={"city": "Warsaw", "unit": "C"}).status_code == 422


def test_tool_schema_matches_the_data(client: TestClient) -> None:
    (tool,) = client.get("/tools").json()
    assert tool["name"] == "get_weather"
    assert tool["parameters"]["properties"]["city"]["type"] == "string"
    assert tool["parameters"]["required"] == ["city"]
    # The example rows advertise the same tool to the policy.
    assert [t["name"] for t in ROW["responses_create_params"]["tools"]] == ["get_weather"]


@pytest.mark.parametrize(
    ("output", "reward"),
    [
        ([function_call("get_weather", {"city": "SF"}), message("It is cold.")], 1.0),
        ([message("Take a jacket."), function_call("get_weather", {"city": "SF"})], 1.0),
        ([message("Which city?")], 0.0),
        ([function_call("get_time", {"city": "SF"})], 0.0),
        ([], 0.0),
    ],
    ids=["call-then-text", "text-then-call", "text-only", "other-tool", "empty"],
)
def test_verify_rewards_any_get_weather_call(client: TestClient, output: list[dict[str, Any]], reward: float) -> None:
    answer = client.post("/verify", json={**ROW, "response": response(*output)})
    assert answer.status_code == 200
    assert answer.json()["reward"] == reward


def test_verify_echoes_the_row(client: TestClient) -> None:
    body = {**ROW, "task_id": 7, "response": response(message("hi"))}
    answer = client.post("/verify", json=body).json()
    assert answer["task_id"] == 7 and answer["responses_create_params"] == ROW["responses_create_params"]


def test_verify_without_response_is_422(client: TestClient) -> None:
    answer = client.post("/verify", json=ROW)
    assert answer.status_code == 422 and "response" in answer.text
