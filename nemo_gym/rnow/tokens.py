"""Counting an entry's prompt tokens for the `rollout.max_context_window` check.

The prompt is rendered as ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n` per message, then the opening of
the assistant turn), SmolLM2's chat format, with the tool schemas as JSON text after the messages (how
vllm_model writes tools into the prompt for models whose template has none). It is tokenized with the
policy's `tokenizer.json` (the `tokenizers` package): for `embedded:smollm2`, the one of the converted
model folder under `$NEMO_GYM_HOME/models/smollm2-*` (written by the first vllm_model start); for a local
model folder, its own. Without one (nothing converted yet, or `tokenizers` not installed) the count is an
approximation, 1 token per 4 characters rounded up, and `PromptCounter.exact` is False (said in the error).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.model_servers.embedded import EMBEDDED_PREFIX, embedded_model

__all__ = ["PromptCounter", "tokenizer_file", "render_prompt"]

CHARS_PER_TOKEN = 4


def tokenizer_file(model: str) -> Path | None:
    """The `tokenizer.json` of a resolved model (`embedded:<name>` or a local folder), or None."""
    if model.startswith(EMBEDDED_PREFIX):
        embedded = embedded_model(model)
        candidates = sorted((nemo_gym_home() / "models").glob(f"{embedded.name}-*/tokenizer.json")) if embedded else []
        return candidates[-1] if candidates else None
    path = Path(model) / "tokenizer.json"
    return path if path.is_file() else None


def render_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The ChatML text of the prompt (see the module docstring)."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = json.dumps(message["tool_calls"]) if message.get("tool_calls") else ""
        parts.append(f"<|im_start|>{message.get('role')}\n{content or ''}{calls}<|im_end|>\n")
    if tools:
        parts.append(f"<|im_start|>system\n{json.dumps(tools)}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


class PromptCounter:
    """Prompt length in tokens of `model`'s tokenizer (see the module docstring)."""

    def __init__(self, model: str):
        self.source = tokenizer_file(model)
        self.tokenizer = None
        if self.source is not None:
            try:
                from tokenizers import Tokenizer

                self.tokenizer = Tokenizer.from_file(str(self.source))
            except Exception:  # tokenizers missing or the file unreadable: fall back to the approximation
                self.tokenizer = None

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def describe(self) -> str:
        return (
            f"tokens of {self.source}"
            if self.exact
            else f"approximate tokens (1 per {CHARS_PER_TOKEN} characters: no tokenizer.json of the model found)"
        )

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        text = render_prompt(messages, tools)
        if self.tokenizer is None:
            return math.ceil(len(text) / CHARS_PER_TOKEN)
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
