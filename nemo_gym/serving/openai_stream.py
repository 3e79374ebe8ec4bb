"""Server-sent events for `stream: true`, built from a finished answer.

Model servers compute the whole answer first (the token information of a training call is only complete at
the end), then replay it in the OpenAI streaming formats, which the `openai` client consumes:

- `responses_sse(response)`: Responses events `response.created`, `response.in_progress`, per output item
  `response.output_item.added`, content/arguments deltas and dones, `response.output_item.done`, then
  `response.completed` (or `response.incomplete` / `response.failed`).
- `chat_sse(completion)`: `chat.completion.chunk` objects (role, content, tool call deltas, finish reason,
  usage), then `data: [DONE]`.

Text is sent as one delta per content part: the answer is already complete, so more events would only cost.
Training token fields of the last output item ride along on the items of the `done` events and on the
final chat chunk's delta.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson
from fastapi.responses import StreamingResponse

from nemo_gym.serving.openai_convert import token_info

__all__ = ["responses_events", "responses_sse", "chat_chunks", "chat_sse", "sse_lines"]

_FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def sse_lines(events: Iterator[dict[str, Any]], *, named: bool, done_marker: bool) -> Iterator[bytes]:
    """Encode events as SSE frames (`event: <type>` lines when named), optionally ending with `data: [DONE]`."""
    for event in events:
        head = f"event: {event['type']}\n".encode() if named else b""
        yield head + b"data: " + orjson.dumps(event) + b"\n\n"
    if done_marker:
        yield b"data: [DONE]\n\n"


def _item_events(item: dict[str, Any], output_index: int) -> Iterator[dict[str, Any]]:
    """Events of one output item between its `added` and `done` events."""
    item_id = item.get("id") or ""
    if item.get("type") == "message":
        for content_index, part in enumerate(item.get("content") or []):
            where = {"item_id": item_id, "output_index": output_index, "content_index": content_index}
            empty = {**part, "text": ""} if part.get("type") == "output_text" else {**part, "refusal": ""}
            yield {"type": "response.content_part.added", **where, "part": empty}
            if part.get("type") == "output_text":
                yield {"type": "response.output_text.delta", **where, "delta": part.get("text", ""), "logprobs": []}
                yield {"type": "response.output_text.done", **where, "text": part.get("text", ""), "logprobs": []}
            else:
                yield {"type": "response.refusal.delta", **where, "delta": part.get("refusal", "")}
                yield {"type": "response.refusal.done", **where, "refusal": part.get("refusal", "")}
            yield {"type": "response.content_part.done", **where, "part": part}
    elif item.get("type") == "function_call":
        where = {"item_id": item_id, "output_index": output_index}
        yield {"type": "response.function_call_arguments.delta", **where, "delta": item.get("arguments", "")}
        yield {
            "type": "response.function_call_arguments.done",
            **where,
            "name": item.get("name"),
            "arguments": item.get("arguments", ""),
        }


def _added_form(item: dict[str, Any]) -> dict[str, Any]:
    """An item as announced in `output_item.added`: in progress, with empty content and no token fields."""
    added = {k: v for k, v in copy.deepcopy(item).items() if k not in token_info(item)}
    if "status" in added:
        added["status"] = "in_progress"
    if added.get("type") == "message":
        added["content"] = []
    elif added.get("type") == "function_call":
        added["arguments"] = ""
    return added


def responses_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Responses streaming events of a finished `Response` dict, numbered by `sequence_number`."""
    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response.get("output") or []):
        events.append({"type": "response.output_item.added", "output_index": index, "item": _added_form(item)})
        events.extend(_item_events(item, index))
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    final_type = _FINAL_EVENT.get(response.get("status") or "completed", "response.completed")
    events.append({"type": final_type, "response": response})
    for sequence_number, event in enumerate(events):
        event["sequence_number"] = sequence_number
        yield event


def responses_sse(response: dict[str, Any]) -> StreamingResponse:
    """A `text/event-stream` answer replaying a finished `Response` dict as Responses streaming events."""
    return StreamingResponse(
        sse_lines(responses_events(response), named=True, done_marker=False), media_type="text/event-stream"
    )


def chat_chunks(completion: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a finished `ChatCompletion` dict (all choices)."""
    base = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        yield {
            **base,
            "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
        if message.get("content"):
            yield {
                **base,
                "choices": [{"index": index, "delta": {"content": message["content"]}, "finish_reason": None}],
            }
        for call_index, call in enumerate(message.get("tool_calls") or []):
            delta = {
                "tool_calls": [
                    {
                        "index": call_index,
                        "id": call.get("id"),
                        "type": "function",
                        "function": call.get("function", {}),
                    }
                ]
            }
            yield {**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
        final = {"index": index, "delta": token_info(message), "finish_reason": choice.get("finish_reason") or "stop"}
        if choice.get("logprobs") is not None:
            final["logprobs"] = choice["logprobs"]
        yield {**base, "choices": [final]}
    if completion.get("usage"):
        yield {**base, "choices": [], "usage": completion["usage"]}


def chat_sse(completion: dict[str, Any]) -> StreamingResponse:
    """A `text/event-stream` answer replaying a finished `ChatCompletion` dict as chunks, then `data: [DONE]`."""
    return StreamingResponse(
        sse_lines(chat_chunks(completion), named=False, done_marker=True), media_type="text/event-stream"
    )
