"""`responses_create_params` keys are Responses API create parameters wherever rows and overrides enter (the
collector, ng_try, ng_eval, the trainer, ng_test's data check), and the model servers have a documented output
limit for calls that set none (vLLM's completions API stops at 16 tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from live_servers import serve
from pydantic import ValidationError

from nemo_gym.collect.command import CollectConfig, load_tasks
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.responses_params import RESPONSES_CREATE_KEYS, unknown_keys

REPO = Path(__file__).resolve().parents[1]


def test_the_keys_are_the_openai_packages_and_unknown_ones_get_a_suggestion():
    assert {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "top_p",
        "reasoning",
        "text",
        "stream",
    } <= RESPONSES_CREATE_KEYS
    assert {
        "seed",
        "top_k",
        "min_p",
        "repetition_penalty",
    } <= RESPONSES_CREATE_KEYS  # vLLM's sampling fields, passed through
    assert unknown_keys({"input": "x", "temperature": 1.0, "seed": 3}) == []
    assert unknown_keys({"max_tokens": 64}) == [
        "key 'max_tokens' is not a Responses API create parameter (did you mean 'max_output_tokens'?)"
    ]
    assert unknown_keys({"temprature": 1.0}) == [
        "key 'temprature' is not a Responses API create parameter (did you mean 'temperature'?)"
    ]
    assert "did you mean 'input'" in unknown_keys({"messages": []})[0]


def test_collector_rows_and_overrides_are_checked(tmp_path, capsys):
    from nemo_gym.cli import main

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"responses_create_params": {"input": "a"}})
        + "\n"
        + json.dumps({"responses_create_params": {"input": "b", "max_tokens": 64}})
        + "\n"
    )
    with pytest.raises(
        DataError,
        match=(
            rf"{tasks}:2: responses_create_params: key 'max_tokens' is not a Responses API create parameter \(did you"
            r" mean 'max_output_tokens'\?\)"
        ),
    ):
        load_tasks(
            CollectConfig(input_jsonl_fpath=str(tasks), output_jsonl_fpath=str(tmp_path / "out.jsonl"), agent_name="a")
        )
    with pytest.raises(ValidationError, match="key 'max_tokens' is not a Responses API create parameter"):
        CollectConfig(
            input_jsonl_fpath=str(tasks), output_jsonl_fpath="o.jsonl", responses_create_params={"max_tokens": 64}
        )
    assert (
        main(
            "collect_rollouts",
            [f"+input_jsonl_fpath={tasks}", "+output_jsonl_fpath=o.jsonl", "+responses_create_params={max_tokens: 64}"],
        )
        == 2
    )
    assert (
        "+responses_create_params: Value error, key 'max_tokens' is not a Responses API create parameter (did you mean"
        " 'max_output_tokens'?)" in capsys.readouterr().err
    )


def test_ng_try_the_trainer_and_ng_test_check_them_too(tmp_path):
    from nemo_gym.config import load_config
    from nemo_gym.env.validation import check_row
    from nemo_gym.train.config import EvalOptions
    from nemo_gym.train.recipes import train_main
    from nemo_gym.tryout.options import split_arguments

    with pytest.raises(
        ConfigError,
        match="ng_try: \\+responses_create_params: .*key 'max_new_tokens' .*did you mean 'max_output_tokens'",
    ):
        split_arguments(["+responses_create_params={max_new_tokens: 64}"])
    argv = [
        "+config_paths=[configs/train/quickstart_grpo.yaml]",
        "+trainer.responses_create_params={temperature: 1.0, max_tokens: 64}",
    ]
    with pytest.raises(
        ConfigError, match="trainer.responses_create_params: .*key 'max_tokens' .*did you mean 'max_output_tokens'"
    ):
        train_main(load_config(argv, cwd=REPO), argv)
    with pytest.raises(ValidationError, match="key 'temprature'"):
        EvalOptions(responses_create_params={"temprature": 0.0})
    [problem] = check_row({"responses_create_params": {"input": "x", "max_tokens": 3}}, "data/example.jsonl", 2, set())
    assert (problem.rule, problem.line) == (
        "responses-create-params",
        2,
    ) and "did you mean 'max_output_tokens'" in problem.message


# -- the model servers' output limit when a call sets none -------------------------------------------------------
def fake_vllm(requests: list[dict[str, Any]], prompt_tokens: int) -> FastAPI:
    """vLLM's routes as vllm_model calls them: a prompt of `prompt_tokens` tokens; completions bodies are recorded."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        return {"tokens": list(range(prompt_tokens)), "count": prompt_tokens}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        requests.append(await request.json())
        return {
            "id": "c",
            "object": "text_completion",
            "created": 1,
            "model": "fake",
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1},
            "choices": [
                {
                    "index": 0,
                    "text": "Hi.",
                    "token_ids": [7],
                    "logprobs": {"token_logprobs": [-0.5]},
                    "finish_reason": "stop",
                }
            ],
        }

    return app


@pytest.mark.parametrize(
    ("fields", "body", "expected", "expected_chat"),
    [
        ({}, {"input": "Hello"}, 1024, 1024),  # the documented default, not vLLM's 16
        ({}, {"input": "Hello", "max_output_tokens": 64}, 64, 1024),  # the chat call sets no limit
        ({"max_model_len": 1030}, {"input": "Hello"}, 1020, 1020),  # at most the context left after the 10-token prompt
        ({"default_max_output_tokens": 300}, {"input": "Hello"}, 300, 300),
    ],
)
def test_vllm_model_default_output_limit(fields, body, expected, expected_chat):
    vllm_model = load_server_class(REPO / "responses_api_models" / "vllm_model" / "app.py")
    requests: list[dict[str, Any]] = []
    with serve(fake_vllm(requests, prompt_tokens=10)) as vllm_url:
        server = vllm_model({"base_url": vllm_url, **fields}, name="policy_model")
        with serve(server.build_app()) as url:
            answer = httpx.post(f"{url}/v1/responses", json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            chat = httpx.post(
                f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}, timeout=30
            )
            assert chat.status_code == 200, chat.text
    assert [r["max_tokens"] for r in requests] == [expected, expected_chat]


def test_openai_model_sends_its_default_only_when_set():
    from test_model_servers import SECRET, fake_openai_app

    openai_model = load_server_class(REPO / "responses_api_models" / "openai_model" / "app.py")
    requests: list[dict[str, Any]] = []
    with serve(fake_openai_app(requests)) as endpoint:
        for default in (None, 300):
            server = openai_model(
                {
                    "openai_base_url": f"{endpoint}/v1",
                    "openai_api_key": SECRET,
                    "openai_model": "m",
                    "default_max_output_tokens": default,
                },
                name="policy_model",
            )
            with serve(server.build_app()) as url:
                assert httpx.post(f"{url}/v1/responses", json={"input": "Hi"}, timeout=30).status_code == 200
                assert (
                    httpx.post(
                        f"{url}/v1/responses", json={"input": "Hi", "max_output_tokens": 7}, timeout=30
                    ).status_code
                    == 200
                )
                assert (
                    httpx.post(
                        f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}, timeout=30
                    ).status_code
                    == 200
                )
    sent = [(r["path"], r.get("max_output_tokens"), r.get("max_tokens")) for r in requests]
    assert sent == [
        ("responses", None, None),
        ("responses", 7, None),
        ("chat", None, None),
        ("responses", 300, None),
        ("responses", 7, None),
        ("chat", None, 300),
    ]
