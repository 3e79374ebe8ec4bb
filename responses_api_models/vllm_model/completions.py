"""Between OpenAI chat and vLLM's completions API, which vllm_model calls with the prompt as token ids: the sampling
fields passed through, the request fields set outside the OpenAI API (`extra_body` and `chat_template_kwargs`, NeMo
Gym's per-request `metadata` form included), the structured-output constraint of a `response_format`, and the
completion answer turned back into a chat completion (steps 3 and 4 of the calls in the module docstring of `app.py`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException

from nemo_gym.model_servers import tool_calls
from nemo_gym.serving.responses_params import metadata_object

from .schemas import RESERVED_EXTRA_FIELDS

__all__ = [
    "SAMPLING_FIELDS",
    "chat_completion",
    "request_extras",
    "response_format_constraint",
]

# Chat sampling fields that vLLM's /v1/completions accepts under the same name.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
TEMPLATE_KWARGS = "chat_template_kwargs"


def _metadata_object(metadata: Any, key: str) -> dict[str, Any]:
    """`responses_params.metadata_object`, its error a 400."""
    try:
        return metadata_object(metadata, key)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def request_extras(
    body: Mapping[str, Any], extra_body: Mapping[str, Any], chat_template_kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The vLLM request fields and chat template arguments of one call, beyond the sampling fields of the API.

    `extra_body` and `chat_template_kwargs` are the server's (its config); the request's `metadata.extra_body` and
    `metadata.chat_template_kwargs` (JSON objects in strings, as NeMo Gym's datasets and collector write them, e.g.
    `num_repeats_add_seed`'s `{"seed": 2}`) are merged over them key by key, and a chat request's own top-level
    `chat_template_kwargs` (vLLM's extension) over those. A `chat_template_kwargs` inside an extra_body counts as
    template arguments. The caller merges the request's own sampling fields over the returned fields (NeMo Gym
    0.7.0's vllm_model: `extra_body | body`).

    Returns:
        (fields for vLLM's completions request, arguments for the chat template at `/tokenize`)

    Raises:
        HTTPException: 400 when a metadata value is not a JSON object or an extra_body sets a field of
            RESERVED_EXTRA_FIELDS.
    """
    metadata = body.get("metadata")
    fields = {**extra_body, **_metadata_object(metadata, "extra_body")}
    template = {**chat_template_kwargs}
    for source in (
        fields.pop(TEMPLATE_KWARGS, None),
        _metadata_object(metadata, TEMPLATE_KWARGS),
        body.get(TEMPLATE_KWARGS),
    ):
        if source is None:
            continue
        if not isinstance(source, Mapping):
            raise HTTPException(400, f"{TEMPLATE_KWARGS} must be an object, got {source!r:.200}")
        template.update(source)
    if reserved := sorted(set(fields) & set(RESERVED_EXTRA_FIELDS)):
        raise HTTPException(
            400,
            f"extra_body may not set {', '.join(reserved)}: vllm_model sets them (the prompt as ids, token"
            " information)",
        )
    return fields, template


def response_format_constraint(response_format: Any) -> dict[str, Any] | None:
    """vLLM `structured_outputs` for an OpenAI `response_format` (`json_schema` → its schema, `json_object` → any JSON).

    `None` for absent or `{"type": "text"}`. Raises HTTPException 400 for any other shape."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    schema = (response_format.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
    if isinstance(schema, dict):
        return {"json": schema}
    raise HTTPException(
        400, f"unsupported response_format {response_format!r}: use type text, json_object or json_schema with a schema"
    )


def chat_completion(
    answer: dict[str, Any],
    prompt_ids: list[int],
    *,
    model: str | None,
    parse_tools: bool,
    forced: bool = False,
    token_info: bool = True,
) -> dict[str, Any]:
    """vLLM's `/v1/completions` answer to a prompt of `prompt_ids` as an OpenAI chat completion of `model`: the
    `<tool_call>` blocks of each choice's text as tool calls (`parse_tools`; `forced`: the text is one required call's
    JSON), and with `token_info` the ids and log-probs on the assistant message (`prompt_token_ids`,
    `generation_token_ids`, `generation_log_probs`)."""
    choices = []
    for choice in answer.get("choices") or []:
        text = choice.get("text") or ""
        content, calls = tool_calls.parse_tool_calls(text) if parse_tools else (text, [])
        forced_call = tool_calls.parse_forced_call(text) if forced and not calls else None
        if forced_call is not None:
            content, calls = None, [forced_call]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        if token_info:
            generation_ids = list(choice.get("token_ids") or [])
            log_probs = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
            message.update(
                prompt_token_ids=prompt_ids, generation_token_ids=generation_ids, generation_log_probs=log_probs
            )
        finish = choice.get("finish_reason") or "stop"
        choices.append(
            {
                "index": choice.get("index", 0),
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls and finish == "stop" else finish,
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(answer.get("created") or time.time()),
        "model": model,
        "choices": choices,
        "usage": answer.get("usage"),
    }
