"""Supervised modes of `ng_train`: `sft` (chat fine-tuning; off-policy distillation) and `pretrain` (plain text).

Recipe (of `nemo_gym.train.loop.TrainingLoop`, which owns the steps, checkpoints, resume and evaluation schedule, as
for GRPO; here a fixed tokenized dataset takes the place of the rollouts; no servers, no vLLM):
  1. data, tokenized once before the first step (every bad row is reported as `file:line: ...` before training):
     - sft: one conversation per row, tokenized with the model's chat template; the loss mask is 1 exactly on
       the tokens of assistant turns (`chat_sequence`). Rows are chat (`messages` [+ `tools`]), a Responses body
       plus an answer (`responses_create_params` + `completion`), or `ng_collect_rollouts` output
       (`responses_create_params` + `response`, optionally kept only when `reward >= supervised.min_reward`):
       SFT of a student on a teacher's rollouts is off-policy distillation (Hinton et al. 2015 "sequence-level
       KD", Kim & Rush 2016).
     - pretrain: documents (`text` field of a JSONL, or a .txt file), tokenized, joined with EOS and cut into
       blocks of `max_seq_len` tokens (`pack_documents`); every token is a target.
  2. per step `batch_size` sequences of a fixed per-epoch permutation (`TaskSampler`: the batch of step k depends
     only on (seed, k), so resume continues exactly); `num_epochs` sets num_steps.
  3. one optimizer step of `SupervisedEngine` (the `PolicyEngine`: AdamW, LR schedule, clipping, ZeRO, LoRA,
     micro-batches, several ranks), whose loss is the token-mean cross-entropy over the step's target tokens:
         L = -(1 / N) Σ_{b,t} m_bt log π_θ(x_b,t+1 | x_b,≤t),   N = Σ m over the whole step (all micro-batches),
     so micro-batches sum to the loss of one big batch (the normalisation of `nemo_gym.rl.losses`, "token").
  4. evaluation every `eval.interval` steps: `eval_loss` (same token mean) on `eval.input_jsonl_fpath`;
     checkpoints, resume and `final/` exactly as GRPO.

Deviations from common practice, on purpose:
    - Assistant spans come from incremental templating (the rendering of messages[:i] with the generation prompt
      is a prefix of the rendering of messages[:i+1]; the difference is turn i), mapped to tokens through the fast
      tokenizer's character offsets, so it works with any prefix-stable template (SmolLM2's has no `{% generation %}`
      markers, so `return_assistant_tokens_mask` is not available). The span stops after the turn's last EOS token
      (`<|im_end|>`), so the template's newline after it is not trained (the model never generates it).
    - Tools: by default tool calls and results are written as Hermes `<tool_call>` text, exactly as vllm_model
      renders them for serving (`render_tools_in_prompt`), so the trained format is the served one.
    - pretrain keeps the last partial block (HF `run_clm` drops it), and attention crosses document boundaries
      inside a block (as `run_clm` and nanoGPT).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import iter_jsonl
from nemo_gym.model_servers import tool_calls
from nemo_gym.serving import openai_convert
from nemo_gym.train.batch import TrainingBatch, TrainingSequence, collate
from nemo_gym.train.config import SupervisedOptions, TrainerConfig
from nemo_gym.train.engine import PolicyEngine, resolve_model_path
from nemo_gym.train.loop import TaskSampler, TrainingLoop

__all__ = [
    "row_conversation",
    "chat_sequence",
    "load_sft_sequences",
    "read_documents",
    "pack_documents",
    "load_pretrain_sequences",
    "DatasetStats",
    "SupervisedEngine",
    "SupervisedRecipe",
    "cross_entropy",
    "check_supervised",
]


# -- sft data --------------------------------------------------------------------------------------------------
def row_conversation(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(chat messages, chat tools or None) of one SFT row; the messages include the assistant turns to learn.

    Accepted rows (checked in this order):
      - `messages`: OpenAI chat messages (assistant `tool_calls` with JSON-string `arguments`, `tool` results);
        `tools`: chat or Responses function tools;
      - `responses_create_params` + `response`: a rollout of `ng_collect_rollouts` (the Responses `output` items,
        messages, function calls and their outputs, follow the input);
      - `responses_create_params` + `completion`: a Responses body and the answer (a string or one assistant
        chat message).

    Raises:
        ValueError: the row has none of these shapes, or an item cannot be converted (the message says which).
    """
    tools = row.get("tools")
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("'messages' must be a list of chat message objects")
        return [dict(m) for m in messages], _chat_tools(tools)
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise ValueError(
            "a row needs 'messages' (chat), or 'responses_create_params' with 'response' (a rollout) or 'completion'"
            " (the answer)"
        )
    body = {k: v for k, v in params.items() if k in ("input", "instructions", "tools")}
    items = openai_convert.input_items(body)
    if "response" in row:
        output = row["response"].get("output") if isinstance(row["response"], dict) else None
        if not isinstance(output, list):
            raise ValueError("'response' must be a Responses object with an 'output' list")
        items = items + output  # token fields still close each model call's turn; they are not copied
        messages = openai_convert.input_items_to_messages(items, instructions=body.get("instructions"))
    elif "completion" in row:
        completion = row["completion"]
        answer = {"role": "assistant", "content": completion} if isinstance(completion, str) else completion
        if not isinstance(answer, dict) or answer.get("role") != "assistant":
            raise ValueError("'completion' must be the answer text or one assistant chat message")
        messages = openai_convert.input_items_to_messages(items, instructions=body.get("instructions")) + [dict(answer)]
    else:
        raise ValueError(
            "'responses_create_params' needs the answer: 'response' (an ng_collect_rollouts row) or 'completion'"
        )
    return messages, _chat_tools(body.get("tools"))


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Chat tools (`{"type": "function", "function": {...}}`) as they are; Responses function tools converted."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("'tools' must be a list of tool objects")
    return [tool if "function" in tool else openai_convert.tools_to_chat([tool])[0] for tool in tools]


def _template_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, render_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and tools as the chat template gets them (Hermes text, or the template's own tool support)."""
    if render_tools:
        return [
            {"role": m["role"], "content": m["content"]} for m in tool_calls.render_tool_messages(messages, tools)
        ], None
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None and k not in openai_convert.TOKEN_INFO_KEYS}
        if message.get("tool_calls"):  # templates index arguments as a mapping (`| tojson`, `.items()`)
            message["tool_calls"] = [_parsed_arguments(call) for call in message["tool_calls"]]
            message.setdefault("content", "")
        out.append(message)
    return out, tools


def _parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # not JSON: the template gets the string as it is
    return {**call, "function": function}


def chat_sequence(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    render_tools_in_prompt: bool = True,
) -> TrainingSequence:
    """One conversation → token ids with `loss_mask` 1 exactly on the assistant turns' tokens (up to their EOS).

    `tokenizer` is a fast HF tokenizer with a chat template. `rollout_logprobs` is all zeros (unused by SFT).

    Raises:
        ValueError: no assistant turn, a turn with no token, or a chat template whose rendering of a conversation's
            prefix is not a prefix of the whole rendering (assistant spans cannot be found then).
    """
    chat, template_tools = _template_messages(messages, tools, render_tools_in_prompt)
    if not any(m["role"] == "assistant" for m in chat):
        raise ValueError("the conversation has no assistant turn to learn")

    def render(part: list[dict[str, Any]], generation_prompt: bool) -> str:
        try:
            return tokenizer.apply_chat_template(
                part, tools=template_tools, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as exc:  # jinja2's TemplateError and the template's own raise_exception(...)
            raise ValueError(
                f"the model's chat template cannot render the conversation: {type(exc).__name__}: {exc}"
            ) from exc

    text = render(chat, False)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        before, through = render(chat[:i], True), render(chat[: i + 1], False)
        if not (text.startswith(through) and through.startswith(before)):
            raise ValueError(
                f"the chat template renders messages[:{i}] differently inside the whole conversation; cannot find"
                f" assistant turn {i}"
            )
        end = len(through)
        eos = tokenizer.eos_token
        if eos and eos in through[len(before) :]:
            end = through.rindex(eos, len(before)) + len(eos)
        spans.append((len(before), end))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    mask = [int(any(lo <= start < hi for lo, hi in spans)) for start, _ in offsets]
    for number, (lo, hi) in enumerate(spans):
        if not any(lo <= start < hi for start, _ in offsets):
            raise ValueError(f"assistant turn {number} has no token")
    return TrainingSequence(ids, mask, [0.0] * len(ids))


@dataclass
class DatasetStats:
    """Counts of a tokenized dataset, for the log."""

    rows: int = 0
    kept: int = 0
    dropped_reward: int = 0
    truncated: int = 0
    target_tokens: int = 0
    notes: list[str] = field(default_factory=list)


def _truncate(sequence: TrainingSequence, max_seq_len: int) -> TrainingSequence:
    return TrainingSequence(
        sequence.input_ids[:max_seq_len], sequence.loss_mask[:max_seq_len], sequence.rollout_logprobs[:max_seq_len]
    )


def load_sft_sequences(
    path: str | Path, tokenizer: Any, options: SupervisedOptions
) -> tuple[list[TrainingSequence], DatasetStats]:
    """Every row of an SFT JSONL as a masked sequence (cut to `max_seq_len`), checked before training starts.

    Raises:
        DataError: `file:line: ...` for every bad row (all of them, at most 20 shown), a row without a reward when
            `min_reward` is set, or no row left.
    """
    sequences, problems, stats = [], [], DatasetStats()
    for line_no, row in iter_jsonl(path):
        stats.rows += 1
        if options.min_reward is not None:
            reward = row.get("reward")
            if not isinstance(reward, (int, float)):
                problems.append(
                    f"{path}:{line_no}: supervised.min_reward is set but the row has no numeric 'reward' (use"
                    " ng_collect_rollouts output)"
                )
                continue
            if reward < options.min_reward:
                stats.dropped_reward += 1
                continue
        try:
            messages, tools = row_conversation(row)
            sequence = chat_sequence(tokenizer, messages, tools, render_tools_in_prompt=options.render_tools_in_prompt)
        except (ValueError, TypeError, KeyError, openai_convert.ConversionError) as exc:
            problems.append(f"{path}:{line_no}: {exc}")
            continue
        if len(sequence.input_ids) > options.max_seq_len:
            stats.truncated += 1
            sequence = _truncate(sequence, options.max_seq_len)
            if sum(sequence.loss_mask[1:]) == 0:
                problems.append(
                    f"{path}:{line_no}: no assistant token within supervised.max_seq_len={options.max_seq_len} tokens;"
                    " raise it or shorten the row"
                )
                continue
        sequences.append(sequence)
    _raise_problems(problems, path)
    stats.kept = len(sequences)
    if not sequences:
        raise DataError(
            f"{path}: no row left to train on ({stats.rows} rows, {stats.dropped_reward} below"
            f" supervised.min_reward={options.min_reward})"
        )
    stats.target_tokens = sum(sum(s.loss_mask[1:]) for s in sequences)
    return sequences, stats


def _raise_problems(problems: list[str], path: str | Path) -> None:
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise DataError(f"{path}: {len(problems)} bad row(s):\n  {shown}{more}")


# -- pretrain data ---------------------------------------------------------------------------------------------
def read_documents(path: str | Path, text_field: str = "text") -> list[str]:
    """The documents of a `.txt` file (the whole file is one) or of a JSONL (one `text_field` string a row).

    Raises:
        DataError: a missing file, a row whose `text_field` is not a non-empty string (`file:line`), no document.
    """
    path = Path(path)
    if path.suffix == ".txt":
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        text = path.read_text()
        documents = [text] if text.strip() else []
    else:
        documents, problems = [], []
        for line_no, row in iter_jsonl(path):
            value = row.get(text_field)
            if not isinstance(value, str) or not value.strip():
                problems.append(
                    f"{path}:{line_no}: needs a non-empty string field {text_field!r} (supervised.text_field)"
                )
            else:
                documents.append(value)
        _raise_problems(problems, path)
    if not documents:
        raise DataError(f"{path}: no document")
    return documents


def pack_documents(documents_ids: list[list[int]], eos_token_id: int, block_len: int) -> list[list[int]]:
    """Concatenate tokenized documents, each followed by `eos_token_id`, and cut into blocks of `block_len` ids.

    The last block keeps the remainder (shorter, at least 2 ids; a single leftover id is dropped). E.g. documents
    [1, 2, 3] and [4, 5] with EOS 0 and block_len 3: stream [1, 2, 3, 0, 4, 5, 0] → [[1, 2, 3], [0, 4, 5], ...]
    and the leftover [0] is dropped.

    Raises:
        ValueError: block_len < 2.
    """
    if block_len < 2:
        raise ValueError(f"block_len must be >= 2, got {block_len}")
    stream = [token for ids in documents_ids for token in [*ids, eos_token_id]]
    blocks = [stream[i : i + block_len] for i in range(0, len(stream), block_len)]
    return [block for block in blocks if len(block) >= 2]


def load_pretrain_sequences(
    path: str | Path, tokenizer: Any, options: SupervisedOptions
) -> tuple[list[TrainingSequence], DatasetStats]:
    """Documents → packed blocks with every token a target (see `pack_documents`).

    Raises:
        DataError: see `read_documents`; ConfigError: the tokenizer has no EOS token.
    """
    documents = read_documents(path, options.text_field)
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            "trainer.engine.model_path: the tokenizer has no eos_token; pretrain needs one between documents"
        )
    ids = [list(tokenizer(text, add_special_tokens=True)["input_ids"]) for text in documents]
    blocks = pack_documents(ids, tokenizer.eos_token_id, options.max_seq_len)
    sequences = [TrainingSequence(block, [1] * len(block), [0.0] * len(block)) for block in blocks]
    stats = DatasetStats(rows=len(documents), kept=len(sequences), target_tokens=sum(len(b) - 1 for b in blocks))
    return sequences, stats


# -- engine ----------------------------------------------------------------------------------------------------
def cross_entropy(logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """-(1 / num_tokens) Σ mask · logprobs: the token-mean negative log-likelihood (`logprobs`, `mask`: [b, T - 1])."""
    return -(logprobs * mask.to(logprobs.dtype)).sum() / num_tokens


class SupervisedEngine(PolicyEngine):
    """`PolicyEngine` whose micro-batch loss is the cross-entropy on the masked targets (normalised by the step's
    global target count, so `train_step`'s gradient accumulation over micro-batches and ranks is exact)."""

    def _micro_loss(
        self, micro: TrainingBatch, *, num_tokens: int, num_sequences: int
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        logprobs, _ = self._target_logprobs(self.engine, micro)
        loss = cross_entropy(logprobs, micro.loss_mask, num_tokens)
        return loss, {"loss": loss.item(), "num_tokens": micro.loss_mask.sum().item()}

    def eval_loss(self, batch: TrainingBatch) -> float:
        """Token-mean cross-entropy of `batch` under the current weights (no gradient; nats per token)."""
        return cross_entropy(self.logprobs(batch), batch.loss_mask, max(1, batch.num_generated_tokens)).item()


# -- the recipe ------------------------------------------------------------------------------------------------
class SupervisedRecipe:
    """`sft` / `pretrain` over a fixed tokenized dataset (no servers); a `nemo_gym.train.loop.Recipe` (the loop
    brings the steps, checkpoints, resume and `final/`)."""

    batch_on_main = False  # every rank tokenizes the same data and takes the same batch: nothing to broadcast

    def __init__(self, cfg: TrainerConfig, argv: list[str] | None = None):
        self.cfg = cfg
        self.engine: SupervisedEngine | None = None
        self.loop: TrainingLoop | None = None
        self.sequences: list[TrainingSequence] = []
        self.eval_sequences: list[TrainingSequence] = []
        self.sampler: TaskSampler | None = None
        self.has_eval = False

    def setup(self, loop: TrainingLoop) -> None:
        """Every rank: the data, tokenized and checked (num_steps from `supervised.num_epochs`), the engine."""
        from transformers import AutoTokenizer

        self.loop = loop
        cfg = self.cfg
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.engine.model_path))
        load = load_sft_sequences if cfg.algorithm == "sft" else load_pretrain_sequences
        self.sequences, stats = load(
            cfg.input_jsonl_fpath, tokenizer, cfg.supervised
        )  # every rank: cheap, deterministic
        self.eval_sequences = (
            load(cfg.eval.input_jsonl_fpath, tokenizer, cfg.supervised)[0]
            if cfg.eval.input_jsonl_fpath and cfg.eval.interval
            else []
        )
        self.has_eval = bool(self.eval_sequences)
        self.sampler = TaskSampler(len(self.sequences), cfg.batch_size, cfg.seed)
        if cfg.supervised.num_epochs is not None:
            self.cfg = cfg = cfg.model_copy(
                update={"num_steps": cfg.supervised.num_epochs * math.ceil(len(self.sequences) / cfg.batch_size)}
            )
        if loop.is_main:
            print(
                f"ng_train: {cfg.algorithm} on {cfg.input_jsonl_fpath}: {stats.kept} sequences from {stats.rows} rows"
                f" ({stats.target_tokens} target tokens; {stats.dropped_reward} below min_reward, {stats.truncated} cut"
                f" to {cfg.supervised.max_seq_len} tokens); {cfg.num_steps} steps of {cfg.batch_size}",
                flush=True,
            )
        self.engine = SupervisedEngine(cfg.engine, cfg.loss, total_steps=cfg.num_steps)

    def prepare_step(self, step: int) -> tuple[dict[str, Any], TrainingBatch | None]:
        """The step's sequences (`TaskSampler`), collated; metrics `step`, `data_position`, `epoch`."""
        cfg = self.cfg
        indices = self.sampler.batch(step)
        batch = collate(
            [self.sequences[i] for i in indices], [1.0] * len(indices), pad_token_id=self.engine.pad_token_id
        )
        return {
            "step": step + 1,
            "data_position": (step + 1) * cfg.batch_size,
            "epoch": step * cfg.batch_size / len(self.sequences),
        }, batch

    def publish_weights(self, step: int) -> dict[str, Any]:
        """No policy server to update in the supervised modes."""
        return {}

    def evaluate(self, step: int) -> dict[str, Any]:
        """`eval_loss`: token-mean cross-entropy on the validation data (nats per target token)."""
        if self.loop.stop.requested or not self.eval_sequences:
            return {}
        size = max(self.cfg.batch_size, self.cfg.engine.micro_batch_size)
        total, count = 0.0, 0
        for start in range(0, len(self.eval_sequences), size):
            chunk = self.eval_sequences[start : start + size]
            batch = collate(chunk, [1.0] * len(chunk), pad_token_id=self.engine.pad_token_id)
            tokens = batch.num_generated_tokens
            total += self.engine.eval_loss(batch) * tokens
            count += tokens
        return {"eval_loss": total / max(count, 1), "eval_tokens": float(count)}

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the loop's state: the batch of a step is a function of (seed, step)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see `state_dict`)."""

    def cleanup(self) -> None:
        """Nothing started."""


def check_supervised(cfg: TrainerConfig) -> None:
    """Config checks of the supervised modes (a note on stderr for keys they do not use).

    Raises:
        ConfigError: evaluation with several ranks under ZeRO-3 (rank 0 evaluates alone; ZeRO-3's forward needs every
        rank).
    """
    if cfg.head_server_url:
        print(
            f"ng_train: trainer.head_server_url is not used by algorithm {cfg.algorithm} (no servers)", file=sys.stderr
        )
    if cfg.num_ranks > 1 and cfg.engine.zero_stage == 3 and cfg.eval.interval and cfg.eval.input_jsonl_fpath:
        raise ConfigError(
            "trainer.eval: the supervised modes evaluate on rank 0 alone, which ZeRO-3 cannot do with several ranks;"
            " use zero_stage <= 2 or eval.interval: 0"
        )
