"""vllm_model's request fields beyond the OpenAI API: `extra_body` and `chat_template_kwargs` from its config, from a
request's `metadata` (JSON objects in strings: NeMo Gym's datasets and its collector's `num_repeats_add_seed` write
them so) and from a chat request itself, in NeMo Gym 0.7.0's order (config < metadata < the request's own fields).
vllm_model is attached over real HTTP on 127.0.0.1 to a stand-in for vLLM's `/tokenize` and `/v1/completions` (the
external service) that records what it is sent; the real vLLM takes them in tests/test_e2e_vllm.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from live_servers import VLLM_MODEL_APP, serve
from pydantic import ValidationError

from nemo_gym.serving.entrypoint import load_server_class

VLLMModel = load_server_class(VLLM_MODEL_APP)


def recording_vllm(sent: dict[str, list[dict[str, Any]]]) -> FastAPI:
    app = FastAPI()

    @app.post("/tokenize")
    def tokenize(body: dict) -> dict:
        sent["tokenize"].append(body)
        return {"tokens": [1, 2, 3]}

    @app.post("/v1/completions")
    def completions(body: dict) -> dict:
        sent["completions"].append(body)
        return {"choices": [{"text": "hi", "token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}}]}

    return app


def call(config: dict[str, Any], path: str, body: dict[str, Any]) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    sent: dict[str, list[dict[str, Any]]] = {"tokenize": [], "completions": []}
    with serve(recording_vllm(sent)) as url:
        server = VLLMModel({"base_url": url, "served_model_name": "m", **config}, name="policy_model")
        with TestClient(server.build_app()) as client:
            return client.post(path, json=body), sent


def test_metadata_extra_body_reaches_vllm_under_the_requests_own_fields():
    answer, sent = call(
        {"extra_body": {"top_k": 20, "min_tokens": 2, "include_stop_str_in_output": False}},
        "/v1/responses",
        {
            "input": "hello",
            "temperature": 0.5,
            "metadata": {
                "extra_body": json.dumps({"seed": 3, "stop": ["</tool_call>"], "include_stop_str_in_output": True}),
                "note": "not json, not read",
            },
        },
    )
    assert answer.status_code == 200, answer.text
    (request,) = sent["completions"]
    assert {k: request[k] for k in ("top_k", "min_tokens", "seed", "stop", "include_stop_str_in_output")} == {
        "top_k": 20,  # the config's
        "min_tokens": 2,
        "seed": 3,  # the request's metadata
        "stop": ["</tool_call>"],
        "include_stop_str_in_output": True,  # metadata over config
    }
    assert request["temperature"] == 0.5 and request["prompt"] == [1, 2, 3] and request["return_token_ids"] is True
    assert request["logprobs"] == 0 and request["model"] == "m"
    assert "chat_template_kwargs" not in sent["tokenize"][0]


def test_the_requests_own_sampling_fields_win_and_max_tokens_falls_back_to_extra_body():
    _, sent = call(
        {"extra_body": {"seed": 1, "max_tokens": 7}},
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "seed": 9, "metadata": {"extra_body": '{"seed": 5}'}},
    )
    assert sent["completions"][0]["seed"] == 9 and sent["completions"][0]["max_tokens"] == 7
    _, sent = call(
        {"extra_body": {"max_tokens": 7}},
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert sent["completions"][0]["max_tokens"] == 3


def test_chat_template_kwargs_go_to_the_template_in_order():
    _, sent = call(
        {"chat_template_kwargs": {"enable_thinking": False, "a": 1}},
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": {
                "chat_template_kwargs": '{"a": 2, "b": 2}',
                "extra_body": '{"chat_template_kwargs": {"c": 3}}',
            },
            "chat_template_kwargs": {"b": 4},
        },
    )
    (tokenize,) = sent["tokenize"]
    assert tokenize["chat_template_kwargs"] == {"enable_thinking": False, "a": 2, "b": 4, "c": 3}
    assert "chat_template_kwargs" not in sent["completions"][0]


def test_a_spliced_prompt_renders_both_turns_with_the_template_kwargs():
    """The second call of a tool loop (an assistant turn with token ids) tokenizes twice: both with the arguments."""
    _, sent = call(
        {"chat_template_kwargs": {"enable_thinking": False}},
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "prompt_token_ids": [1, 2], "generation_token_ids": [3]},
                {"role": "user", "content": "again"},
            ]
        },
    )
    assert len(sent["tokenize"]) == 2
    assert all(t["chat_template_kwargs"] == {"enable_thinking": False} for t in sent["tokenize"])


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        ({"extra_body": "{seed: 3}"}, r"metadata.extra_body is not JSON"),
        ({"extra_body": "[3]"}, r"metadata.extra_body must be a JSON object"),
        ({"chat_template_kwargs": "7"}, r"metadata.chat_template_kwargs must be a JSON object"),
        ({"extra_body": '{"prompt": [1]}'}, r"extra_body may not set prompt: vllm_model sets them"),
        ({"extra_body": '{"logprobs": 5, "model": "x"}'}, r"extra_body may not set logprobs, model"),
    ],
)
def test_a_bad_metadata_value_is_a_400_naming_it(metadata, error):
    answer, sent = call({}, "/v1/responses", {"input": "hello", "metadata": metadata})
    assert answer.status_code == 400 and sent["completions"] == []
    assert re.search(error, answer.json()["detail"]), answer.text


def test_a_config_extra_body_with_a_field_vllm_model_sets_is_refused():
    with pytest.raises(ValidationError, match=r"extra_body\n.*may not set prompt, return_token_ids"):
        VLLMModel.Config.model_validate({"extra_body": {"prompt": [1], "return_token_ids": False}})


def test_null_in_the_config_is_nothing_as_in_nemo_gyms_configs():
    config = VLLMModel.Config.model_validate({"extra_body": None, "chat_template_kwargs": None})
    assert config.extra_body == {} and config.chat_template_kwargs == {}
