"""vllm_model without vLLM: config, example rows through the conversion and tool rendering, README.

The server with the real SmolLM2 on vLLM is tested in tests/test_e2e_vllm.py (marker e2e).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.model_servers import tool_calls
from nemo_gym.serving import openai_convert
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.module_loading import import_file

HERE = Path(__file__).resolve().parents[1]
VLLMModel = load_server_class(HERE / "app.py")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")


def test_example_rows_render_to_plain_text_chats():
    assert len(ROWS) == 5
    for row in ROWS:
        chat = openai_convert.responses_to_chat(row["responses_create_params"], keep_token_info=True)
        rendered = tool_calls.render_tool_messages(chat["messages"], chat.get("tools"))
        assert all(isinstance(m["content"], str) and m["role"] in ("system", "user", "assistant") for m in rendered)
        if chat.get("tools"):
            assert rendered[0]["role"] == "system" and "<tools>" in rendered[0]["content"]
        if any(m["role"] == "tool" for m in chat["messages"]):
            assert "<tool_call>" in rendered[-2]["content"] and rendered[-1]["content"].startswith("<tool_response>")


def test_config_yaml_validates():
    text = (HERE / "configs" / "vllm_model.yaml").read_text()
    assert text.startswith("# ng_run ")
    fields = yaml.safe_load(text)["policy_model"]["responses_api_models"]["vllm_model"]
    config = VLLMModel.Config.model_validate(fields)
    assert config.model == "embedded:smollm2" and config.return_token_id_information


def test_readme_headings():
    readme = (HERE / "README.md").read_text()
    for heading in ("Description", "Tools", "Reward", "Episode end", "Arguments", "Data"):
        assert f"\n## {heading}\n" in readme


def test_reload_weights_rejects_folders_vllm_cannot_load(tmp_path):
    from fastapi.testclient import TestClient

    # Attached to a port nothing listens on: validation answers before vLLM would be called.
    server = VLLMModel({"base_url": "http://127.0.0.1:9", "served_model_name": "m"}, name="policy_model")
    (tmp_path / "config.json").write_text("{}")
    with TestClient(server.build_app()) as client:
        for model_dir in ("relative/dir", str(tmp_path / "missing"), str(tmp_path)):  # the last has no *.safetensors
            answer = client.post("/reload_weights", json={"model_dir": model_dir})
            assert answer.status_code == 422 and "model_dir" in answer.text, (model_dir, answer.text)
        assert client.post("/reload_weights", json={}).status_code == 422


def test_response_format_becomes_a_structured_output_constraint():
    import pytest
    from fastapi import HTTPException

    constraint = import_file(HERE / "completions.py").response_format_constraint
    schema = {"type": "object", "properties": {"verdict": {"enum": ["[[A=B]]", "[[A!=B]]"]}}, "required": ["verdict"]}
    assert constraint(None) is None and constraint({"type": "text"}) is None
    assert constraint({"type": "json_object"}) == {"json_object": True}
    assert constraint({"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}) == {"json": schema}
    # a Responses `text.format` reaches the model server as the same response_format
    chat = openai_convert.responses_to_chat(
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "v", "schema": schema}}}
    )
    assert constraint(chat["response_format"]) == {"json": schema}
    for bad in ({"type": "json_schema"}, {"type": "grammar"}, "json"):
        with pytest.raises(HTTPException) as info:
            constraint(bad)
        assert info.value.status_code == 400
