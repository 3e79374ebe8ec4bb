"""Conversion between the OpenAI Responses API and the Chat Completions API.

- `responses_to_chat(body)`: a Responses create body → a Chat Completions create body.
- `chat_to_response(completion, request)`: a `ChatCompletion` → a Responses `Response` dict.
- `messages_to_input_items(messages)`: chat messages → Responses input items (the inverse of the input part
  of `responses_to_chat`, for endpoints and tests that go the other way).

Input is read leniently: NeMo Gym rollouts keep `function_call_output` items in `response.output` (which
openai's strict `Response` type rejects) and carry training token information (`prompt_token_ids`,
`generation_token_ids`, `generation_log_probs`) on output items. Answers are built to validate against the
`openai` package's `Response` and `ChatCompletion` types.

Mapping (Responses → Chat):
    input string                 → one `user` message
    `instructions`               → a leading `system` message
    message role `developer`     → `system` (unless developer_as_system=False)
    message content parts        → a string when all parts are text, else chat content parts
    `function_call` items        → `tool_calls` of one assistant message (merged with the assistant text of
                                   the same model turn; a turn ends at the item that carries token ids)
    `function_call_output`       → `role: tool` message
    `reasoning` items            → dropped, or `reasoning_content` of the assistant message (keep_reasoning)
    function tools               → chat tools; `max_output_tokens` → `max_tokens`; `text.format` → `response_format`
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

__all__ = [
    "TOKEN_INFO_KEYS",
    "PASSTHROUGH_SAMPLING",
    "ConversionError",
    "responses_to_chat",
    "input_items",
    "input_items_to_messages",
    "messages_to_input_items",
    "tools_to_chat",
    "tool_choice_to_chat",
    "chat_to_response",
    "strip_token_info",
    "token_info",
    "content_text",
]

TOKEN_INFO_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")

# Sampling fields that are not Responses fields but that vLLM and other endpoints accept; passed through.
PASSTHROUGH_SAMPLING = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "n",
)
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ConversionError(ValueError):
    """A request that cannot be converted (e.g. a non-function tool, an unknown input item type, an item or
    content part of the wrong JSON type)."""


# -- helpers -------------------------------------------------------------------------------------------
def content_text(content: Any) -> str:
    """The text of a message's `content` (Responses or chat): the string itself, or its parts' string `text` joined;
    '' otherwise. Parts of unexpected shape are skipped (model output is untrusted), so this never raises."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def token_info(item: dict[str, Any]) -> dict[str, Any]:
    """The training token fields present on an item or message (possibly empty)."""
    return {key: item[key] for key in TOKEN_INFO_KEYS if item.get(key) is not None}


def strip_token_info(value: Any) -> Any:
    """A deep copy of a JSON value without training token fields (before sending it to a foreign endpoint)."""
    if isinstance(value, dict):
        return {k: strip_token_info(v) for k, v in value.items() if k not in TOKEN_INFO_KEYS}
    if isinstance(value, list):
        return [strip_token_info(v) for v in value]
    return value


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _content_to_chat(content: Any) -> str | list[dict[str, Any]]:
    """Responses message content (string or parts) → chat content (string when all parts are text)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ConversionError(f"message content must be a string or a list of parts, got {type(content).__name__}")
    parts = []
    for part in content:
        if not isinstance(part, dict):
            raise ConversionError(f"a content part must be an object, got {type(part).__name__}")
        kind = part.get("type")
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("refusal" if kind == "refusal" else "text", "")
            if not isinstance(text, str):
                raise ConversionError(f"the text of a {kind} part must be a string, got {type(text).__name__}")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            image = {"url": part.get("image_url") or part.get("file_id")}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            parts.append(
                {"type": "file", "file": {k: part[k] for k in ("file_data", "file_id", "filename") if part.get(k)}}
            )
        else:
            raise ConversionError(f"unsupported content part type {kind!r}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _output_to_text(output: Any) -> str:
    """A function_call_output's `output` (string or content parts) as a string."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        converted = _content_to_chat(output)
        return converted if isinstance(converted, str) else json.dumps(output)
    return json.dumps(output)


def _reasoning_text(item: dict[str, Any]) -> str:
    parts = (item.get("content") or []) or (item.get("summary") or [])
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


# -- Responses → Chat ------------------------------------------------------------------------------------
def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `input` of a Responses create body as a list of items (a string becomes one user message)."""
    raw = body.get("input")
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ConversionError("`input` must be a string or a list of items")
    return raw


def input_items_to_messages(
    items: Iterable[dict[str, Any]],
    *,
    instructions: str | None = None,
    developer_as_system: bool = True,
    keep_reasoning: bool = False,
    keep_token_info: bool = False,
) -> list[dict[str, Any]]:
    """Responses input items → chat messages (see the module docstring for the mapping).

    With keep_token_info, an assistant message gets the token fields of the item that closes its turn.

    Raises:
        ConversionError: an item type or content part that has no chat equivalent.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    turn: dict[str, Any] | None = None  # the assistant message being assembled
    for item in items:
        kind = _item_kind(item)
        message = _message_outside_turn(kind, item, developer_as_system)
        if message is not None:
            turn = None
            messages.append(message)
            continue
        if kind not in ("message", "function_call", "reasoning"):
            raise ConversionError(f"input item type {kind!r} has no Chat Completions equivalent")
        if kind != "reasoning" or keep_reasoning:
            if turn is None:
                turn = {"role": "assistant", "content": None}
                messages.append(turn)
            _extend_turn(turn, kind, item)
        # An item that carries token ids closes its model turn.
        info = token_info(item)
        if info and turn is not None:
            if keep_token_info:
                turn.update(info)
            turn = None
    return messages


def _item_kind(item: Any) -> str | None:
    if not isinstance(item, dict):
        raise ConversionError(f"input item must be an object, got {type(item).__name__}")
    return item.get("type") or ("message" if "role" in item else None)


def _message_outside_turn(kind: str | None, item: dict[str, Any], developer_as_system: bool) -> dict[str, Any] | None:
    """The chat message of an item that ends the assistant's turn (a user, system or developer message, a tool
    output); None for the items of an assistant turn and unknown ones."""
    if kind == "message" and item.get("role") != "assistant":
        role = item.get("role", "user")
        if role == "developer" and developer_as_system:
            role = "system"
        return {"role": role, "content": _content_to_chat(item.get("content"))}
    if kind == "function_call_output":
        if "call_id" not in item:
            raise ConversionError("a function_call_output item needs a `call_id`")
        return {"role": "tool", "tool_call_id": item["call_id"], "content": _output_to_text(item.get("output"))}
    return None


def _extend_turn(turn: dict[str, Any], kind: str, item: dict[str, Any]) -> None:
    """Add an assistant message, function call or reasoning item to the assistant message `turn`."""
    if kind == "message":
        # checked and converted first (a part of an unknown type is refused), then its text
        turn["content"] = (turn["content"] or "") + content_text(_content_to_chat(item.get("content")))
    elif kind == "function_call":
        if not isinstance(item.get("name"), str):
            raise ConversionError("a function_call item needs a string `name`")
        call = {
            "id": item.get("call_id") or item.get("id") or _new_id("call"),
            "type": "function",
            "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
        }
        turn.setdefault("tool_calls", []).append(call)
    else:
        turn["reasoning_content"] = (turn.get("reasoning_content") or "") + _reasoning_text(item)


def tools_to_chat(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools → chat tools.

    Raises:
        ConversionError: a tool that is not a function tool (web search, file search ...).
    """
    if not tools:
        return None
    converted = []
    for tool in tools:
        if tool.get("type") != "function":
            raise ConversionError(
                f"tool type {tool.get('type')!r} is not supported; only function tools convert to chat"
            )
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        converted.append({"type": "function", "function": function})
    return converted


def tool_choice_to_chat(tool_choice: Any) -> Any:
    """`auto`/`none`/`required` pass; `{"type": "function", "name": X}` → `{"type": "function", "function": {"name":
    X}}`."""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and "name" in tool_choice:
        return {"type": "function", "function": {"name": tool_choice["name"]}}
    return tool_choice


def _text_format_to_chat(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


def responses_to_chat(
    body: dict[str, Any],
    *,
    developer_as_system: bool = True,
    keep_reasoning: bool = False,
    keep_token_info: bool = False,
) -> dict[str, Any]:
    """A Responses create body → a Chat Completions create body (without `stream`).

    Raises:
        ConversionError: the body uses something with no chat equivalent (`previous_response_id`, a
            non-function tool, an unknown item type).
    """
    if body.get("previous_response_id"):
        raise ConversionError("previous_response_id is not supported: send the whole conversation in `input`")
    chat: dict[str, Any] = {
        "messages": input_items_to_messages(
            input_items(body),
            instructions=body.get("instructions"),
            developer_as_system=developer_as_system,
            keep_reasoning=keep_reasoning,
            keep_token_info=keep_token_info,
        )
    }
    if body.get("model"):
        chat["model"] = body["model"]
    tools = tools_to_chat(body.get("tools"))
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = tool_choice_to_chat(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "user", "metadata", "store", "service_tier", *PASSTHROUGH_SAMPLING):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("top_logprobs"):
        chat["logprobs"] = True
        chat["top_logprobs"] = body["top_logprobs"]
    response_format = _text_format_to_chat(body.get("text"))
    if response_format:
        chat["response_format"] = response_format
    return chat


def messages_to_input_items(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages → Responses input items (system/user messages, assistant text and tool calls, tool outputs)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": _output_to_text(message.get("content")),
                }
            )
        elif role == "assistant":
            turn: list[dict[str, Any]] = []
            if message.get("reasoning_content"):
                turn.append(
                    {
                        "type": "reasoning",
                        "id": _new_id("rs"),
                        "summary": [{"type": "summary_text", "text": message["reasoning_content"]}],
                    }
                )
            content = message.get("content")
            if content:
                text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
                turn.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                )
            for call in message.get("tool_calls") or []:
                turn.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"].get("arguments") or "{}",
                    }
                )
            if turn:
                turn[-1].update(token_info(message))
            items.extend(turn)
        else:
            content = message.get("content")
            if isinstance(content, list):
                content = [_chat_part_to_input(p) for p in content]
            items.append({"type": "message", "role": role, "content": content})
    return items


def _chat_part_to_input(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "text":
        return {"type": "input_text", "text": part["text"]}
    if part.get("type") == "image_url":
        return {
            "type": "input_image",
            "image_url": part["image_url"]["url"],
            "detail": part["image_url"].get("detail", "auto"),
        }
    raise ConversionError(f"unsupported chat content part {part.get('type')!r}")


# -- Chat → Responses ------------------------------------------------------------------------------------
_REQUEST_ECHO = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "temperature",
    "top_p",
    "text",
    "reasoning",
    "user",
    "truncation",
    "top_logprobs",
)


def _usage_to_response(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": usage.get("prompt_tokens", 0),
        "input_tokens_details": {"cached_tokens": prompt_details.get("cached_tokens") or 0, "cache_write_tokens": 0},
        "output_tokens": usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": completion_details.get("reasoning_tokens") or 0},
        "total_tokens": usage.get("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)),
    }


def _message_to_output_items(message: dict[str, Any], suffix: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{suffix}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    tool_calls = message.get("tool_calls") or []
    if content or message.get("refusal") or not tool_calls:
        parts: list[dict[str, Any]] = []
        if content or not message.get("refusal"):
            parts.append({"type": "output_text", "text": content or "", "annotations": []})
        if message.get("refusal"):
            parts.append({"type": "refusal", "refusal": message["refusal"]})
        items.append(
            {"type": "message", "id": f"msg_{suffix}", "role": "assistant", "status": "completed", "content": parts}
        )
    for index, call in enumerate(tool_calls):
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{suffix}_{index}",
                "call_id": call.get("id") or _new_id("call"),
                "name": function.get("name", ""),
                "arguments": function.get("arguments") or "{}",
                "status": "completed",
            }
        )
    info = token_info(message)
    if info:
        items[-1].update(info)
    return items


def chat_to_response(completion: dict[str, Any], request: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `ChatCompletion` dict (first choice) → a Responses `Response` dict.

    `request` is the Responses create body; its parameters (tools, tool_choice, temperature ...) are echoed
    as the Responses API does. Token fields on the choice's message go to the last output item.
    finish_reason `length` → status `incomplete` with `incomplete_details.reason = "max_output_tokens"`.

    Raises:
        ConversionError: the completion has no choices.
    """
    request = request or {}
    choices = completion.get("choices") or []
    if not choices:
        raise ConversionError("chat completion has no choices")
    choice = choices[0]
    suffix = str(completion.get("id") or uuid.uuid4().hex).removeprefix("chatcmpl-")
    output = _message_to_output_items(choice.get("message") or {}, suffix)
    finish_reason = choice.get("finish_reason")
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish_reason or "")
    response: dict[str, Any] = {
        "id": f"resp_{suffix}",
        "object": "response",
        "created_at": float(completion.get("created") or time.time()),
        "model": completion.get("model") or request.get("model") or "",
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "error": None,
        "output": output,
        "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice") or "auto",
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "usage": _usage_to_response(completion.get("usage")),
    }
    for key in _REQUEST_ECHO:
        response[key] = request.get(key)
    return response
