"""Rollouts → training sequences: token ids, a loss mask over the generated tokens, and vLLM's log-probs.

A rollout's `response.output` holds the whole trajectory. The last output item of each model call carries the
training token information (docs/architecture.md, Processes and the wire protocol): `prompt_token_ids`,
`generation_token_ids`, `generation_log_probs`. Each call's prompt extends the previous call's prompt + generation
exactly (the model server splices, never re-tokenizes), so the final call's prompt + generation is the whole
trajectory and the tokens generated in turn k sit at offset `len(prompt_k)`. Everything else (the first prompt, tool
outputs, the chat template's tokens between turns) is context: mask 0.

Alignment (shape suffixes: `B` sequences, `T` padded length): `input_ids [B, T]` is what the model reads;
`loss_mask`, `rollout_logprobs` are `[B, T - 1]` and refer to the *targets* `input_ids[:, 1:]`, i.e. entry
`t` is about token `t + 1`, predicted from the logits at position `t`. That is the layout of
`token_logprobs(logits[:, :-1], input_ids[:, 1:])`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_gym.common.errors import DataError

__all__ = ["ModelCall", "TrainingSequence", "TrainingBatch", "model_calls", "rollout_to_sequence", "collate"]


@dataclass(frozen=True)
class ModelCall:
    """The training token information of one model call (one turn of the policy)."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


@dataclass(frozen=True)
class TrainingSequence:
    """One rollout as the trainer sees it (unpadded; see the module docstring for the alignment).

    Attributes:
        input_ids: [n] the whole trajectory's token ids (the last call's prompt + generation).
        loss_mask: [n] 1 where the policy generated the token (any turn), else 0.
        rollout_logprobs: [n] the sampler's log-prob of each generated token, 0.0 elsewhere.
    """

    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class TrainingBatch:
    """Padded tensors of B sequences plus one advantage per sequence.

    Attributes:
        input_ids: [B, T] int64, right-padded with `pad_token_id`.
        attention_mask: [B, T] int64, 1 on real tokens.
        loss_mask: [B, T - 1] float32, 1 on generated *target* tokens (`input_ids[:, 1:]`).
        rollout_logprobs: [B, T - 1] float32, the sampler's log-probs of the targets (0 where mask is 0).
        advantages: [B] float32.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_generated_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> TrainingBatch:
        """The same batch with every tensor on `device` (the engine's: a CUDA device on GPU; no copy when already
        there)."""
        values = {
            field.name: getattr(self, field.name) for field in dataclasses.fields(self)
        }  # a subclass's fields too
        return type(self)(
            **{name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in values.items()}
        )

    def select(self, index: slice | torch.Tensor) -> TrainingBatch:
        """The sub-batch of rows `index` (a micro-batch), trimmed to its own longest sequence."""
        attention = self.attention_mask[index]
        length = max(int(attention.sum(dim=1).max().item()), 2) if len(attention) else 2
        return TrainingBatch(
            input_ids=self.input_ids[index, :length],
            attention_mask=attention[:, :length],
            loss_mask=self.loss_mask[index, : length - 1],
            rollout_logprobs=self.rollout_logprobs[index, : length - 1],
            advantages=self.advantages[index],
        )


def model_calls(rollout: dict[str, Any]) -> list[ModelCall]:
    """The model calls of a rollout, in order: every `response.output` item that carries generation ids.

    Raises:
        DataError: the rollout has no `response.output`, no item carries token information (the model server
            was not configured to return it), or a call's log-probs and generation ids differ in length.
    """
    output = (rollout.get("response") or {}).get("output") if isinstance(rollout.get("response"), dict) else None
    if not isinstance(output, list):
        raise DataError(f"rollout {_where(rollout)} has no response.output list")
    calls = []
    for item in output:
        if not isinstance(item, dict) or item.get("generation_token_ids") is None:
            continue
        prompt = list(item.get("prompt_token_ids") or [])
        generation = list(item["generation_token_ids"])
        log_probs = list(item.get("generation_log_probs") or [])
        if len(log_probs) != len(generation):
            raise DataError(
                f"rollout {_where(rollout)}, model call {len(calls)}: {len(generation)} generation ids but"
                f" {len(log_probs)} generation_log_probs"
            )
        calls.append(ModelCall(prompt, generation, [float(x) for x in log_probs]))
    if not calls:
        raise DataError(
            f"rollout {_where(rollout)} carries no training token information (no output item with"
            " generation_token_ids): serve the policy with vllm_model and return_token_id_information: true; for an"
            " agent that drops them (e.g. openai_client_agent), start ng_run with +token_id_capture.enabled=true"
        )
    return calls


def rollout_to_sequence(rollout: dict[str, Any]) -> TrainingSequence:
    """One rollout → its training sequence (the whole multi-turn trajectory, generated tokens masked in).

    Raises:
        DataError: no token information (see `model_calls`), or drift: a call's prompt does not start with the
            previous call's prompt + generation (the message says at which token they first differ).
    """
    calls = model_calls(rollout)
    for k in range(1, len(calls)):
        previous = calls[k - 1].prompt_token_ids + calls[k - 1].generation_token_ids
        prompt = calls[k].prompt_token_ids
        if prompt[: len(previous)] != previous:
            first = next(
                (i for i, (a, b) in enumerate(zip(previous, prompt)) if a != b), min(len(previous), len(prompt))
            )
            raise DataError(
                f"rollout {_where(rollout)}: token drift between model calls {k - 1} and {k}: call {k}'s prompt "
                f"({len(prompt)} ids) does not extend call {k - 1}'s prompt + generation ({len(previous)} ids); "
                f"first difference at token {first}. The model server must splice prompts, not re-tokenize the text"
            )
    last = calls[-1]
    input_ids = last.prompt_token_ids + last.generation_token_ids
    loss_mask = [0] * len(input_ids)
    rollout_logprobs = [0.0] * len(input_ids)
    for call in calls:
        start = len(call.prompt_token_ids)
        for offset, log_prob in enumerate(call.generation_log_probs):
            loss_mask[start + offset] = 1
            rollout_logprobs[start + offset] = log_prob
    return TrainingSequence(input_ids, loss_mask, rollout_logprobs)


def collate(
    sequences: Sequence[TrainingSequence], advantages: Sequence[float] | torch.Tensor, pad_token_id: int = 0
) -> TrainingBatch:
    """Right-pad sequences into a `TrainingBatch` (targets-aligned masks; see the module docstring).

    Raises:
        ValueError: no sequences, or not one advantage per sequence.
    """
    if not sequences:
        raise ValueError("collate needs at least one sequence")
    advantages_B = torch.as_tensor(advantages, dtype=torch.float32).reshape(-1)
    if len(advantages_B) != len(sequences):
        raise ValueError(f"{len(sequences)} sequences but {len(advantages_B)} advantages")
    length = max(max(len(s.input_ids) for s in sequences), 2)
    batch_size = len(sequences)
    input_ids = torch.full((batch_size, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
    loss_mask = torch.zeros((batch_size, length), dtype=torch.float32)
    rollout_logprobs = torch.zeros((batch_size, length), dtype=torch.float32)
    for b, sequence in enumerate(sequences):
        n = len(sequence.input_ids)
        input_ids[b, :n] = torch.tensor(sequence.input_ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(sequence.loss_mask, dtype=torch.float32)
        rollout_logprobs[b, :n] = torch.tensor(sequence.rollout_logprobs, dtype=torch.float32)
    return TrainingBatch(input_ids, attention_mask, loss_mask[:, 1:], rollout_logprobs[:, 1:], advantages_B)


def _where(rollout: dict[str, Any]) -> str:
    return f"(task {rollout.get('_ng_task_index', '?')}, rollout {rollout.get('_ng_rollout_index', '?')})"
