"""scripted_model over HTTP: the script, determinism, latency and failure knobs."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from nemo_gym.serving.entrypoint import load_server_class

ScriptedModel = load_server_class(Path(__file__).resolve().parents[1] / "app.py")
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def client(**config) -> TestClient:
    return TestClient(ScriptedModel(config).build_app(), raise_server_exceptions=False)


def test_calls_tools_then_answers_by_rule():
    with client(rules=[{"match": "sf", "reply": "Cold in SF."}], max_tool_rounds=1) as c:
        first = c.post("/v1/responses", json={"input": "weather in sf?", "tools": TOOLS}).json()
        call = first["output"][0]
        assert (
            call["type"] == "function_call"
            and call["name"] == "get_weather"
            and call["arguments"] == '{"city": "San Francisco"}'
        )
        second_input = [
            {"role": "user", "content": "weather in sf?"},
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "cold"},
        ]
        second = c.post("/v1/responses", json={"input": second_input, "tools": TOOLS}).json()
        assert second["output"][0]["content"][0]["text"] == "Cold in SF."
        assert (
            c.post("/v1/responses", json={"input": "weather in sf?", "tools": TOOLS}).json()["id"] == first["id"]
        )  # deterministic


def test_chat_models_and_failure_knob():
    with client(default_reply="B") as c:
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "pick"}]}).json()
        assert chat["choices"][0]["message"]["content"] == "B"
        assert c.get("/v1/models").json()["data"][0]["id"] == "scripted"
    with client(error_status=503) as c:
        assert c.post("/v1/responses", json={"input": "x"}).status_code == 503


def test_a_request_script_plays_one_turn_per_model_call():
    script = (
        '[{"tool_calls": [{"name": "multiply", "arguments": {"a": 347, "b": 29}}]}, {"tool_calls": [{"name": "add",'
        ' "arguments": {"a": 10063, "b": 518}}]}, {"text": "The answer is 10581."}]'
    )
    body = {
        "input": [{"role": "user", "content": "What is 347 * 29 + 518?"}],
        "tools": TOOLS,
        "metadata": {"script": script},
    }
    with client(max_tool_rounds=0, default_reply="no") as c:
        first = c.post("/v1/responses", json=body).json()["output"]
        assert [(i["type"], i["name"], i["arguments"]) for i in first] == [
            ("function_call", "multiply", '{"a": 347, "b": 29}')
        ]
        history = [
            *body["input"],
            *first,
            {"type": "function_call_output", "call_id": first[0]["call_id"], "output": "10063"},
        ]
        second = c.post("/v1/responses", json={**body, "input": history}).json()["output"]
        assert second[0]["name"] == "add" and second[0]["arguments"] == '{"a": 10063, "b": 518}'
        history += [*second, {"type": "function_call_output", "call_id": second[0]["call_id"], "output": "10581"}]
        third = c.post("/v1/responses", json={**body, "input": history}).json()["output"]
        assert third[0]["type"] == "message" and third[0]["content"][0]["text"] == "The answer is 10581."
        past_the_end = history + third + [{"role": "user", "content": "again?"}]
        assert (
            c.post("/v1/responses", json={**body, "input": past_the_end}).json()["output"][0]["content"][0]["text"]
            == "no"
        )
        assert c.post("/v1/responses", json={**body, "metadata": {"script": "{not json"}}).status_code == 400
