"""tool_calculator over real HTTP (FastAPI TestClient): tools, verify, the data split and the expert script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
tasks = import_file(SERVER_DIR / "tasks.py")
ROWS = {name: read_jsonl(SERVER_DIR / "data" / f"{name}.jsonl") for name in ("example", "train", "heldout")}


def call(name: str, arguments: dict | str) -> dict:
    return {
        "type": "function_call",
        "call_id": f"c_{name}",
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
    }


def answer(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


@pytest.fixture
def client():
    with server_client(SERVER_DIR) as client:
        yield client


def verify(client, row: dict, *output: dict) -> dict:
    result = client.post("/verify", json={**row, "response": {"id": "r", "object": "response", "output": list(output)}})
    assert result.status_code == 200, result.text
    return result.json()


def test_tools_compute_and_reject_bad_arguments(client):
    assert client.post("/multiply", json={"a": 347, "b": 29}).json() == 10063
    assert client.post("/add", json={"a": 10063, "b": 518}).json() == 10581
    assert client.post("/add", json={"a": 1}).status_code == 422
    assert client.post("/multiply", json={"a": 1, "b": 2, "c": 3}).status_code == 422


def test_rows_advertise_the_server_tools(client):
    served = {tool["name"]: tool for tool in client.get("/tools").json()}
    for tool in tasks.TOOLS:
        assert served[tool["name"]]["description"] == tool["description"]
        assert served[tool["name"]]["parameters"]["properties"] == tool["parameters"]["properties"]


def test_two_call_task_full_reward_and_components(client):
    row = tasks.make_task(347, 29, 518)
    result = verify(
        client,
        row,
        call("multiply", {"a": 347, "b": 29}),
        {"type": "function_call_output", "call_id": "c_multiply", "output": "10063"},
        call("add", {"a": 10063, "b": 518}),
        {"type": "function_call_output", "call_id": "c_add", "output": "10581"},
        answer("The answer is 10,581."),
    )
    assert result["reward"] == 1.0 and result["reward_components"] == {"answer": 1.0, "calls": 1.0}
    assert result["extracted_answer"] == 10581 and result["num_tool_calls"] == 2 and result["failure_reason"] is None


@pytest.mark.parametrize(
    ("output", "reward", "reason"),
    [
        ([answer("It is 10000.")], 0.0, "no_tool_call"),
        ([call("multiply", {"a": 347, "b": 29}), answer("I don't know")], 0.0, "no_answer"),
        ([call("multiply", {"a": 347, "b": 29}), answer("The answer is 10063.")], 0.0, "wrong_answer"),
        ([call("multiply", "{bad json"), answer("10581")], 1.0, None),  # the answer alone is scored
        (
            [call("multiply", {"a": 347, "b": 29}), call("add", {"a": 10063, "b": 518})],
            0.0,
            "no_answer",
        ),  # ended on calls
    ],
)
def test_reward_is_the_exact_final_answer(client, output, reward, reason):
    result = verify(client, tasks.make_task(347, 29, 518), *output)
    assert (result["reward"], result["failure_reason"]) == (reward, reason)


def test_missing_expected_answer_is_422(client):
    assert (
        client.post("/verify", json={"responses_create_params": {"input": "x"}, "response": {"output": []}}).status_code
        == 422
    )


def test_data_split_is_disjoint_and_reproducible():
    train, heldout = tasks.split(tasks.draw_tasks())
    assert [r["question"] for r in train] == [r["question"] for r in ROWS["train"]]
    assert [r["question"] for r in heldout] == [r["question"] for r in ROWS["heldout"]]
    assert not {r["question"] for r in train} & {r["question"] for r in heldout}
    assert ROWS["example"] == ROWS["train"][:5]
    for rows in (train, heldout):  # both kinds of task in both sets
        assert {len(r["expected_calls"]) for r in rows} == {1, 2}


def test_expert_script_solves_every_example_row(client):
    for row in ROWS["example"]:
        script = json.loads(tasks.expert_row(row)["responses_create_params"]["metadata"]["script"])
        output = []
        for turn in script[:-1]:
            (expected,) = turn["tool_calls"]
            result = client.post(f"/{expected['name']}", json=expected["arguments"]).json()
            output += [
                call(expected["name"], expected["arguments"]),
                {"type": "function_call_output", "call_id": "c", "output": json.dumps(result)},
            ]
        assert verify(client, row, *output, answer(script[-1]["text"]))["reward"] == 1.0
