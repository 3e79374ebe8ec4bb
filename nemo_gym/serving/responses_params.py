"""The keys of a `responses_create_params` object (a dataset row's, or a `+responses_create_params=` override's).

Allowed: the create parameters of the OpenAI Responses API, read from the `openai` package's types
(`openai.types.responses.response_create_params`, streaming and not), and the sampling fields that vLLM and other
OpenAI-compatible servers accept besides them (`nemo_gym.serving.openai_convert.PASSTHROUGH_SAMPLING`: `seed`, `top_k`,
...). Any other key is an error with a suggestion, because the model servers would drop it silently: `max_tokens` (the
Chat Completions name) left generation at the endpoint's default length, 16 tokens on vLLM's completions API. Only the
top-level keys are checked; the endpoint validates the values.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Annotated, Any

from openai.types.responses import response_create_params
from pydantic import AfterValidator

from nemo_gym.config import did_you_mean
from nemo_gym.serving.openai_convert import PASSTHROUGH_SAMPLING

__all__ = ["RESPONSES_CREATE_KEYS", "ResponsesCreateParams", "check_keys", "metadata_object", "unknown_keys"]

RESPONSES_CREATE_KEYS: frozenset[str] = frozenset(
    key
    for params in (
        response_create_params.ResponseCreateParamsNonStreaming,
        response_create_params.ResponseCreateParamsStreaming,
    )
    for key in typing.get_type_hints(params)
) | frozenset(PASSTHROUGH_SAMPLING)

# Chat Completions (and other APIs') names of Responses parameters: what their authors mean.
_RESPONSES_NAMES = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "max_new_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text (its `format`)",
    "reasoning_effort": "reasoning (its `effort`)",
    "logprobs": "top_logprobs",
    "system": "instructions",
}


def unknown_keys(params: Mapping[str, Any]) -> list[str]:
    """One problem per key of `params` that is no Responses create parameter: `key 'max_tokens' is not a Responses
    API create parameter (did you mean 'max_output_tokens'?)`; empty when every key is one."""
    problems = []
    for key in params:
        if key in RESPONSES_CREATE_KEYS:
            continue
        hint = (
            f" (did you mean {_RESPONSES_NAMES[key]!r}?)"
            if key in _RESPONSES_NAMES
            else did_you_mean(key, sorted(RESPONSES_CREATE_KEYS))
        )
        problems.append(f"key {key!r} is not a Responses API create parameter{hint}")
    return problems


def check_keys(params: dict[str, Any]) -> dict[str, Any]:
    """`params` when every key is a Responses create parameter (a pydantic after-validator).

    Raises:
        ValueError: the unknown keys, each with a suggestion (see `unknown_keys`).
    """
    problems = unknown_keys(params)
    if problems:
        raise ValueError(
            "; ".join(problems)
            + "; see the Responses API (https://platform.openai.com/docs/api-reference/responses/create)"
        )
    return params


ResponsesCreateParams = Annotated[dict[str, Any], AfterValidator(check_keys)]
"""A `responses_create_params` field of a config: a dict whose keys are checked by `check_keys`."""


def metadata_object(metadata: Any, key: str) -> dict[str, Any]:
    """`metadata[key]` of a Responses request, a JSON object written as a string (NeMo Gym's form, e.g.
    `metadata.extra_body = '{"seed": 2}'`: Responses metadata values are strings); {} when absent or empty.

    Raises:
        ValueError: (naming `metadata.<key>`) the value is not JSON, or not a JSON object.
    """
    raw = metadata.get(key) if isinstance(metadata, Mapping) else None
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise ValueError(f"metadata.{key} is not JSON ({exc.msg} at character {exc.pos}): {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"metadata.{key} must be a JSON object, e.g. '{{\"seed\": 3}}'; got {raw!r:.200}")
    return value
