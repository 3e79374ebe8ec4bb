"""Responses ↔ Chat Completions conversion, on NeMo Gym's own rollouts (../shared/peer_data)."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.serving import openai_convert as oc

PEER = Path(__file__).resolve().parents[2] / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
ROLLOUT_FILES = sorted(PEER.glob("*/data/example_rollouts.jsonl"))


def _rows(path: Path) -> list[dict]:
    return read_jsonl(path)


def _comparable(items: list[dict]) -> list[dict]:
    """Items as the round trip keeps them: text, calls and outputs without ids/status/annotations."""
    kept = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            kept.append({"type": "message", "role": item["role"], "text": text})
        elif kind == "function_call":
            kept.append(
                {"type": kind, "call_id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
            )
        elif kind == "function_call_output":
            kept.append({"type": kind, "call_id": item["call_id"], "output": item["output"]})
    return kept


def test_peer_rollout_files_found():
    assert len(ROLLOUT_FILES) >= 5, PEER


@pytest.mark.parametrize("path", ROLLOUT_FILES, ids=lambda p: p.parts[-3])
def test_peer_trajectories_round_trip(path: Path):
    for row in _rows(path):
        trajectory = oc.input_items(row["responses_create_params"]) + row["response"]["output"]
        messages = oc.input_items_to_messages(trajectory, developer_as_system=False)
        assert all(m["role"] in ("system", "developer", "user", "assistant", "tool") for m in messages)
        # Every function call is answered by a tool message with its call id.
        call_ids = [c["id"] for m in messages for c in m.get("tool_calls", [])]
        tool_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert tool_ids == call_ids[: len(tool_ids)]
        back = oc.messages_to_input_items(messages)
        assert _comparable(back) == _comparable([i for i in trajectory if i.get("type") != "reasoning"])


@pytest.mark.parametrize("path", ROLLOUT_FILES, ids=lambda p: p.parts[-3])
def test_peer_create_params_to_chat(path: Path):
    for row in _rows(path):
        params = row["responses_create_params"]
        chat = oc.responses_to_chat(params)
        assert chat["messages"][-1]["role"] in ("user", "system")
        if params.get("tools"):
            assert [t["function"]["name"] for t in chat["tools"]] == [t["name"] for t in params["tools"]]
        if params.get("max_output_tokens") is not None:
            assert chat["max_tokens"] == params["max_output_tokens"]
        assert "input" not in chat and "max_output_tokens" not in chat


def test_reasoning_items_dropped_or_kept():
    path = PEER / "example_tool_call_multireward" / "data" / "example_rollouts.jsonl"
    output = _rows(path)[0]["response"]["output"]
    assert any(i["type"] == "reasoning" for i in output)
    dropped = oc.input_items_to_messages(output)
    assert all("reasoning_content" not in m for m in dropped)
    kept = oc.input_items_to_messages(
        [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]}, *output[1:]],
        keep_reasoning=True,
    )
    assert kept[0]["reasoning_content"] == "think" and kept[0]["tool_calls"]


def test_instructions_developer_and_parts():
    body = {
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "dev rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see"},
                    {"type": "input_image", "image_url": "data:x", "detail": "low"},
                ],
            },
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "tools": [
            {
                "type": "function",
                "name": "f",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
                "strict": True,
            }
        ],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
    }
    chat = oc.responses_to_chat(body)
    assert chat["messages"][:3] == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "dev rules"},
        {"role": "user", "content": "ab"},
    ]
    assert chat["messages"][3]["content"][1] == {"type": "image_url", "image_url": {"url": "data:x", "detail": "low"}}
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["parallel_tool_calls"] is False and chat["temperature"] == 0.5 and chat["top_p"] == 0.9
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True},
    }
    assert oc.responses_to_chat(body, developer_as_system=False)["messages"][1]["role"] == "developer"
    assert oc.responses_to_chat({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


def test_errors_for_unconvertible_requests():
    with pytest.raises(oc.ConversionError, match="only function tools"):
        oc.responses_to_chat({"input": "x", "tools": [{"type": "web_search"}]})
    with pytest.raises(oc.ConversionError, match="previous_response_id"):
        oc.responses_to_chat({"input": "x", "previous_response_id": "resp_1"})
    with pytest.raises(oc.ConversionError, match="item_reference"):
        oc.responses_to_chat({"input": [{"type": "item_reference", "id": "x"}]})


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "message", "role": "assistant", "content": 42}, "content must be a string or a list"),
        ({"type": "message", "role": "user", "content": [1, None]}, "content part must be an object"),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": 42}]},
            "must be a string, got int",
        ),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": ["no"]}]},
            "must be a string, got list",
        ),
        ({"type": "function_call", "arguments": "{}", "call_id": "c"}, "needs a string `name`"),
        ({"type": "function_call_output", "output": "x"}, "needs a `call_id`"),
    ],
)
def test_items_of_the_wrong_json_type_are_conversion_errors(item: dict, message: str):
    # Model output read back from a rollout is untrusted: a typed error, never a TypeError or KeyError.
    with pytest.raises(oc.ConversionError, match=message):
        oc.input_items_to_messages([item])


def test_token_info_marks_turns_and_moves_to_messages():
    ids = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]}
    items = [
        {"role": "user", "content": "q"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "first"}], **ids},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "second"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **ids},
    ]
    messages = oc.input_items_to_messages(items, keep_token_info=True)
    # Two model turns (the token ids close the first one), each with its ids.
    assert [m.get("content") for m in messages] == ["q", "first", "second"]
    assert messages[1]["generation_token_ids"] == [3, 4] and messages[2]["tool_calls"][0]["id"] == "c1"
    assert "generation_token_ids" not in oc.input_items_to_messages(items)[1]
    assert oc.strip_token_info({"input": items})["input"][1].keys() == {"type", "role", "content"}


def _completion(message: dict, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def test_chat_to_response_message_and_calls():
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    completion = _completion(
        {
            "content": "Let me check.",
            "tool_calls": calls,
            "generation_token_ids": [7],
            "prompt_token_ids": [1],
            "generation_log_probs": [-0.5],
        },
        "tool_calls",
    )
    ChatCompletion.model_validate(completion)
    request = {
        "input": "weather?",
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
        "temperature": 0.3,
    }
    response = oc.chat_to_response(completion, request)
    Response.model_validate(response)
    assert response["id"] == "resp_abc" and response["status"] == "completed" and response["temperature"] == 0.3
    assert [i["type"] for i in response["output"]] == ["message", "function_call"]
    assert response["output"][0]["content"][0] == {"type": "output_text", "text": "Let me check.", "annotations": []}
    call = response["output"][1]
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "get_weather", '{"city": "Paris"}')
    assert call["generation_token_ids"] == [7] and "generation_token_ids" not in response["output"][0]
    assert response["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }


def test_chat_to_response_length_is_incomplete():
    response = oc.chat_to_response(_completion({"content": "cut"}, "length"))
    Response.model_validate(response)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_chat_to_response_reasoning_and_empty():
    response = oc.chat_to_response(_completion({"content": None, "reasoning_content": "hmm"}))
    Response.model_validate(response)
    assert [i["type"] for i in response["output"]] == ["reasoning", "message"]
    assert response["output"][1]["content"][0]["text"] == ""


def test_peer_final_answers_survive_chat_round_trip():
    """A peer rollout's model turns, rebuilt as chat completions, convert back to the same output items."""
    for path in ROLLOUT_FILES:
        for row in _rows(path):
            for message in oc.input_items_to_messages(row["response"]["output"]):
                if message["role"] != "assistant":
                    continue
                response = oc.chat_to_response(
                    _completion(message, "tool_calls" if message.get("tool_calls") else "stop")
                )
                Response.model_validate(response)
                assert _comparable(response["output"]) == _comparable(oc.messages_to_input_items([message]))
