"""Scoring given token ids with a vLLM server: the per-token log-probs a teacher assigns to a sequence.

Used by on-policy distillation (`nemo_gym.train.distill`): the student samples, the teacher scores the student's
tokens. vLLM's OpenAI `/v1/completions` does it in one forward pass when asked for `prompt_logprobs` on a prompt
given as token ids (`max_tokens: 1`, the one sampled token is ignored): `choices[0].prompt_logprobs` is a list
with one entry per prompt token, `None` for the first and otherwise a mapping `{"<token id>": {"logprob", "rank",
"decoded_token"}}` that always holds the prompt's own token (plus the top-k when k > 0; we ask for k = 0).
The log-probs are the model's raw (temperature 1) distribution.

No torch here: vllm_model (its own venv) imports this module for its `POST /score_token_ids` route.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCORE_ROUTE", "prompt_logprobs_request", "parse_prompt_logprobs"]

SCORE_ROUTE = "/score_token_ids"


def prompt_logprobs_request(model: str, token_ids: list[int]) -> dict[str, Any]:
    """The `/v1/completions` body that scores `token_ids` (one request per sequence)."""
    return {
        "model": model,
        "prompt": list(token_ids),
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
        "skip_special_tokens": False,
    }


def parse_prompt_logprobs(answer: dict[str, Any], token_ids: list[int]) -> list[float | None]:
    """`[n]` log π(token_ids[t] | token_ids[:t]) from a `/v1/completions` answer; entry 0 is None (no context).

    Raises:
        ValueError: the answer has no `prompt_logprobs`, a different length, or lacks a prompt token's entry.
    """
    choices = answer.get("choices") or []
    entries = choices[0].get("prompt_logprobs") if choices and isinstance(choices[0], dict) else None
    if not isinstance(entries, list):
        raise ValueError(
            "the scoring answer has no choices[0].prompt_logprobs (is the server vLLM with prompt_logprobs support?)"
        )
    if len(entries) != len(token_ids):
        raise ValueError(f"prompt_logprobs has {len(entries)} entries for {len(token_ids)} token ids")
    out: list[float | None] = [None]
    for t in range(1, len(token_ids)):
        entry = entries[t] or {}
        found = entry.get(str(token_ids[t]))
        if found is None:
            found = entry.get(token_ids[t])
        if not isinstance(found, dict) or not isinstance(found.get("logprob"), (int, float)):
            raise ValueError(f"prompt_logprobs[{t}] has no entry for token {token_ids[t]}")
        out.append(float(found["logprob"]))
    return out
