"""The policy under training: a transformers causal LM inside a DeepSpeed engine.

One `train_step(batch)` is one optimizer step: the batch is cut into micro-batches of
`micro_batch_size` sequences; each gets its forward pass, the trainer's log-probs of exactly the generated
token ids (`token_logprobs` on the logits), `policy_loss` normalised by the *step's* token and sequence counts,
and a backward pass; gradients accumulate; then one clipped AdamW step and one LR-schedule step.

Precision: float32 on CPU, bfloat16 on GPU (`dtype`; bfloat16 also runs on a CPU, slowly, with a warning: it is how
the GPU path's bf16 code is tested here). ZeRO stage 0-3 from the config; stage 0 on one CPU process. Devices:
DeepSpeed puts the model on its accelerator (`cuda:<LOCAL_RANK>` on GPUs, the CPU otherwise); each micro-batch is
moved there (`device`), and `logprobs` returns CPU tensors. DeepSpeed runs in unmanaged gradient-accumulation mode
(`managed_gradient_accumulation: false`):
`step()` is the boundary, so a step may hold any number of micro-batches (groups with zero reward variance are
dropped, so the count varies), and the loss is scaled by us (global token count), never by DeepSpeed.

Several ranks (`nemo_gym.train.distributed`): every rank gets the whole step batch and trains on its contiguous
share of the sequences. The loss keeps the *global* normaliser (the batch's token or sequence count, known on every
rank since every rank holds the batch) and is multiplied by the world size, because DeepSpeed averages the
gradients over ranks: the averaged gradient is then the one-rank gradient of the same batch. Every rank runs the
same number of micro-batches (ZeRO-2/3 reduce on each backward), a short rank padding with a zero-weight one.
Gradient clipping: with ZeRO 0 in float32 the optimizer is the plain AdamW, and we clip in its step pre-hook, after
DeepSpeed's all-reduce, which also gives the global pre-clip norm; otherwise DeepSpeed clips and reports the norm.

On-policy simplification: one optimizer step per batch, so the "old" policy of the PPO ratio is the current
one, detached (ratio 1 in value, gradient of the log-prob); the vLLM/trainer mismatch is corrected by the
truncated importance-sampling weight on `rollout_logprobs` inside `policy_loss`.

Checkpoints are loaded without unpickling code (`nemo_gym.train.safe_checkpoint`); a checkpoint tag must name a
folder inside the checkpoint folder (`nemo_gym.common.paths.resolve_inside`).
"""

from __future__ import annotations

import copy
import inspect
import math
import os
import random
from pathlib import Path
from typing import Any

import torch

from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.common.paths import resolve_inside
from nemo_gym.common.processes import free_port
from nemo_gym.model_servers.embedded import EMBEDDED_PREFIX, embedded_model
from nemo_gym.rl import LossConfig, policy_loss, token_entropy, token_logprobs
from nemo_gym.train import crash_points, distributed, safe_checkpoint
from nemo_gym.train.batch import TrainingBatch
from nemo_gym.train.config import EngineConfig, LossOptions

__all__ = ["set_single_process_env", "resolve_model_path", "lr_lambda", "PolicyEngine"]


def set_single_process_env() -> dict[str, str]:
    """Set the torch.distributed variables of a single-process run where unset; returns the ones it set.

    DeepSpeed always initialises torch.distributed, even for one process on a CPU (DEVELOPERS.md).
    """
    wanted = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    if "MASTER_PORT" not in os.environ:
        wanted["MASTER_PORT"] = str(free_port())
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    return added


def resolve_model_path(model_path: str) -> Path:
    """A local HF folder; `embedded:smollm2` → its converted folder in $NEMO_GYM_HOME/models (made by vllm_model).

    Raises:
        FileNotFoundError: no such folder, or the embedded model has not been converted yet.
    """
    if model_path.startswith(EMBEDDED_PREFIX):
        found = embedded_model(model_path)
        candidates = sorted((nemo_gym_home() / "models").glob(f"{found.name}-*/config.json"))
        if not candidates:
            raise FileNotFoundError(
                f"{model_path} is not converted yet: start vllm_model once (ng_run) so it converts the GGUF into"
                f" {nemo_gym_home() / 'models'}"
            )
        return candidates[-1].parent
    path = Path(model_path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a HF model folder (no config.json)")
    return path


def lr_lambda(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the peak LR after `step` optimizer steps: linear warm-up, then constant/linear/cosine to 0."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


class PolicyEngine:
    """A causal LM under DeepSpeed with GRPO-style training steps, HF export and checkpoints."""

    def __init__(self, config: EngineConfig, loss: LossOptions, *, total_steps: int = 1):
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        set_single_process_env()
        self.config = config
        self.loss_config = LossConfig(**loss.model_dump())
        torch.manual_seed(config.seed)
        random.seed(config.seed)  # Python's RNG too: a run's draws depend on the seed only, and a resume restores both
        self.model_path = resolve_model_path(config.model_path)
        dtype = getattr(torch, config.dtype)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path) if _has_tokenizer(self.model_path) else None
        self.pad_token_id = _pad_token_id(model.config, self.tokenizer)
        self.reference = None
        if self.loss_config.kl_coef > 0:  # frozen copy of the initial policy for the KL term
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if config.lora is not None:
            from peft import LoraConfig as PeftLoraConfig
            from peft import get_peft_model

            lora = config.lora
            model = get_peft_model(
                model,
                PeftLoraConfig(
                    r=lora.rank, lora_alpha=lora.alpha, target_modules=lora.target_modules, lora_dropout=lora.dropout
                ),
            )
        parameters = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            parameters, lr=config.learning_rate, betas=config.adam_betas, weight_decay=config.weight_decay
        )
        self._clips_itself = config.zero_stage == 0 and config.dtype == "float32"  # DeepSpeed keeps the plain AdamW
        self._grad_norm: float | None = None
        if self._clips_itself:
            optimizer.register_step_pre_hook(self._clip_gradients)
        steps = config.total_steps or total_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: lr_lambda(s, warmup_steps=config.warmup_steps, total_steps=steps, schedule=config.lr_schedule),
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self._deepspeed_config()
        )
        self._keeps_logits = "logits_to_keep" in inspect.signature(type(_causal_lm(model)).forward).parameters
        self.device = torch.device(self.engine.device)  # where DeepSpeed put the model: cuda:<LOCAL_RANK> or cpu
        if self.reference is not None:
            self.reference.to(self.device)

        safe_checkpoint.install(self.engine)  # checkpoint loads refuse pickled code
        self.step = 0
        if crash_points.armed("optimizer_step"):  # test hook (nemo_gym.train.crash_points): nothing otherwise
            optimizer.register_step_post_hook(lambda *_: crash_points.reached("optimizer_step", self.step + 1))

    def _deepspeed_config(self) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": self.config.micro_batch_size,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,  # step() is the boundary; see the module docstring
            "gradient_clipping": 0.0 if self._clips_itself else self.config.max_grad_norm,
            "zero_optimization": {"stage": self.config.zero_stage},
            "bf16": {"enabled": self.config.dtype == "bfloat16"},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 2**31 - 1,
        }

    @property
    def module(self) -> torch.nn.Module:
        """The model (PEFT-wrapped when LoRA is on) inside the engine."""
        return self.engine.module

    # -- forward -------------------------------------------------------------------------------------
    def _logits(self, model: torch.nn.Module, batch: TrainingBatch, *, first: int = 0) -> torch.Tensor:
        """[b, T - 1 - first, V] logits for the targets `input_ids[:, 1 + first:]`, divided by the sampling
        temperature. With `first` > 0 the LM head runs only from position `first` on (transformers' `logits_to_keep`):
        a prompt's positions cost the layers but not the [T, V] head, its log-softmax and their backward."""
        if first and self._keeps_logits:
            output = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                logits_to_keep=batch.input_ids.shape[1] - first,
            )
            logits = output.logits[:, :-1]
        else:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, first:-1]
        return logits.float() / self.config.temperature

    def _target_logprobs(
        self, model: torch.nn.Module, batch: TrainingBatch, *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([b, T - 1] log-probs of the targets `input_ids[:, 1:]`, [b, T - 1] entropies or None), computed from the
        batch's first trained position on (`first_target`) and 0 before it (where `loss_mask` is 0 in every row).
        The entropy is detached unless the loss has an entropy bonus."""
        first = first_target(batch.loss_mask)
        logits = self._logits(model, batch, first=first)
        logprobs = torch.nn.functional.pad(token_logprobs(logits, batch.input_ids[:, 1 + first :]), (first, 0))
        if not entropy:
            return logprobs, None
        values = token_entropy(logits if self.loss_config.entropy_coef > 0 else logits.detach())
        return logprobs, torch.nn.functional.pad(values, (first, 0))

    def logprobs(self, batch: TrainingBatch) -> torch.Tensor:
        """[B, T - 1] the current policy's log-probs of the targets (no gradient, float32, on the CPU), for tests and
        evaluation."""
        with torch.no_grad():
            chunks = [
                token_logprobs(self._logits(self.module, micro), micro.input_ids[:, 1:]).cpu()
                for micro in self._micro_batches(batch)
            ]
        width = batch.loss_mask.shape[1]
        return torch.cat([torch.nn.functional.pad(c, (0, width - c.shape[1])) for c in chunks])

    def _micro_batches(self, batch: TrainingBatch) -> list[TrainingBatch]:
        """`batch` cut into micro-batches of `micro_batch_size` rows, each on the engine's device."""
        size = self.config.micro_batch_size
        return [batch.select(slice(i, i + size)).to(self.device) for i in range(0, len(batch), size)]

    def _rank_micro_batches(self, batch: TrainingBatch) -> list[tuple[TrainingBatch, float]]:
        """(micro-batch, weight) pairs of this rank: its share of `batch` (`distributed.shard`) cut into micro-batches,
        padded to the count of the largest share with weight-0 copies of row 0 (same backward count on every rank)."""
        world = distributed.world_size()
        rows = distributed.shard(len(batch), distributed.rank(), world)
        micros = self._micro_batches(batch.select(rows)) if rows.stop > rows.start else []
        count = math.ceil(math.ceil(len(batch) / world) / self.config.micro_batch_size)
        return [(micro, 1.0) for micro in micros] + [(batch.select(slice(0, 1)).to(self.device), 0.0)] * (
            count - len(micros)
        )

    # -- training ------------------------------------------------------------------------------------
    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One optimizer step on `batch`; returns the loss metrics (token-weighted over micro-batches),
        `grad_norm`, `learning_rate`, `num_tokens`, `num_sequences`.

        With several ranks every rank calls it with the same whole batch (each trains on its share; the metrics,
        gathered from all ranks, are those of the whole batch on every rank).

        Raises:
            ValueError: the batch has no generated token (nothing to learn from).
        """
        num_tokens = batch.num_generated_tokens
        if num_tokens == 0:
            raise ValueError("train_step: the batch has no generated token")
        self.engine.train()
        world = distributed.world_size()
        per_micro: list[tuple[float, dict[str, float]]] = []
        for micro, weight in self._rank_micro_batches(batch):
            loss, metrics = self._micro_loss(micro, num_tokens=num_tokens, num_sequences=len(batch))
            self.engine.backward(loss * (world * weight), scale_wrt_gas=False)  # DeepSpeed averages over ranks
            crash_points.reached("backward", self.step + 1)  # a test hook; nothing unless NEMO_GYM_CRASH_AT is set
            if weight:
                per_micro.append((micro.num_generated_tokens / num_tokens, metrics))
        learning_rate = self.scheduler.get_last_lr()[0]
        self._grad_norm = None
        self.engine.step()  # all-reduce, clip, AdamW, LR schedule
        self.step += 1
        grad_norm = self._grad_norm if self._clips_itself else self.engine.get_global_grad_norm()  # before clipping
        return {
            **_combine([item for rank_items in distributed.all_gather(per_micro) for item in rank_items]),
            "grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
            "learning_rate": learning_rate,
            "num_tokens": float(num_tokens),
            "num_sequences": float(len(batch)),
        }

    def _clip_gradients(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """AdamW step pre-hook (ZeRO 0, float32): clip the all-reduced gradients by their global L2 norm, as
        DeepSpeed's `gradient_clipping` would (coefficient max_norm / (norm + 1e-6) when below 1), and keep the norm."""
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self._grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm))

    def _micro_loss(
        self, micro: TrainingBatch, *, num_tokens: int, num_sequences: int
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        logprobs, entropy = self._target_logprobs(self.engine, micro, entropy=True)
        ref_logprobs = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logprobs, _ = self._target_logprobs(self.reference, micro)
        return policy_loss(
            logprobs,
            logprobs.detach(),
            micro.advantages,
            micro.loss_mask,
            self.loss_config,
            rollout_logprobs=micro.rollout_logprobs,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
            num_tokens_global=num_tokens,
            num_sequences_global=num_sequences,
        )

    # -- export --------------------------------------------------------------------------------------
    def export_state_dict(self, *, on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full weights as a HF state dict (LoRA merged, ZeRO-3 gathered), untied: `lm_head.weight` is a real tensor.

        A collective under ZeRO-3 (every rank calls it; see `join_export`). Tensors are in the training dtype; copies on
        the CPU, or with `on_device` the tensors where they are (no copy of the whole model: the broadcast weight sync,
        which moves one tensor at a time; they may alias the live parameters, so read them before the next optimizer
        step). ZeRO-3's gathered dict is on the CPU
        either way.

        Raises:
            NotImplementedError: LoRA together with ZeRO stage 3.
        """
        module = self.module
        if self.config.lora is not None:
            if self.config.zero_stage == 3:
                raise NotImplementedError("exporting LoRA under ZeRO-3 is not supported; use zero_stage <= 2 with LoRA")
            module = copy.deepcopy(module).merge_and_unload()
            state = module.state_dict()
        elif self.config.zero_stage == 3:
            state = self.engine._zero3_consolidated_16bit_state_dict()
        else:
            state = module.state_dict()
        if on_device:
            state = {name: tensor.detach() for name, tensor in state.items()}
        else:
            state = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in state.items()}
        embed = state.get("model.embed_tokens.weight")
        if embed is not None and ("lm_head.weight" not in state or module.config.tie_word_embeddings):
            state["lm_head.weight"] = embed if on_device else embed.clone()
        return state

    def join_export(self) -> None:
        """A rank other than 0 while rank 0 exports the weights (`export_state_dict`, `save_hf`, a weight sync): under
        ZeRO-3 the export gathers every rank's shards, so this rank must take part; otherwise nothing to do."""
        if self.config.zero_stage == 3:
            self.export_state_dict()

    def save_hf(self, out_dir: str | Path) -> Path:
        """Write a HF model folder vLLM can serve: model.safetensors, config (untied), tokenizer, generation config.

        Written to `<out_dir>.tmp` and renamed, so a reader never sees a half-written folder. With several ranks,
        every rank calls it (under ZeRO-3 the export gathers the shards from all ranks) and only rank 0 writes.
        """
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        if not distributed.is_main():
            self.join_export()
            return out_dir
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(self.export_state_dict(), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        base = self.module.get_base_model() if self.config.lora is not None else self.module
        config = copy.deepcopy(base.config)
        config.tie_word_embeddings = False
        config.save_pretrained(tmp)
        if getattr(base, "generation_config", None) is not None:
            base.generation_config.save_pretrained(tmp)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)
        for extra in ("chat_template.jinja",):  # keep files the tokenizer may not rewrite
            if (self.model_path / extra).is_file() and not (tmp / extra).is_file():
                (tmp / extra).write_bytes((self.model_path / extra).read_bytes())
        if out_dir.exists():
            import shutil

            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
        return out_dir

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint_dir: str | Path, tag: str) -> None:
        """Model, optimizer, LR scheduler and the engine's step under `checkpoint_dir/tag` (DeepSpeed layout).
        A collective: every rank calls it; DeepSpeed writes each file from the rank that owns it."""
        self.engine.checkpoint_engine.crash_step = self.step  # for the test hook `checkpoint_file` (crash_points)
        self.engine.save_checkpoint(str(checkpoint_dir), tag=tag, client_state={"nemo_gym_step": self.step})

    def load_checkpoint(self, checkpoint_dir: str | Path, tag: str) -> None:
        """Restore what `save_checkpoint` wrote.

        Raises:
            FileNotFoundError: no checkpoint `tag` under `checkpoint_dir`.
            nemo_gym.common.paths.PathEscapeError: `tag` names a folder outside `checkpoint_dir`.
            nemo_gym.train.safe_checkpoint.UnsafeCheckpointError: a checkpoint file holds pickled code.
        """
        resolve_inside(checkpoint_dir, tag, what=f"checkpoint tag (in {checkpoint_dir})")
        path, client_state = self.engine.load_checkpoint(
            str(checkpoint_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"no checkpoint {tag!r} in {checkpoint_dir}")
        self.step = int(client_state.get("nemo_gym_step", 0))


def _combine(per_micro: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Step metrics from micro-batch metrics: losses add up (each is already divided by the step's global
    count), `*_max` / `*_min` take the max / min, the rest are means weighted by the micro-batch's tokens."""
    combined: dict[str, float] = {}
    for weight, metrics in per_micro:
        for key, value in metrics.items():
            value = float(value)
            if key in ("loss", "policy_loss"):
                combined[key] = combined.get(key, 0.0) + value
            elif key.endswith("_max"):
                combined[key] = max(combined.get(key, value), value)
            elif key.endswith("_min"):
                combined[key] = min(combined.get(key, value), value)
            else:
                combined[key] = combined.get(key, 0.0) + weight * value
    return combined


def first_target(loss_mask: torch.Tensor) -> int:
    """Index of the first column of `loss_mask` ([b, T - 1]) that is 1 in some row; 0 when none is."""
    columns = loss_mask.any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (or `model` itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))


def _pad_token_id(model_config: Any, tokenizer: Any) -> int:
    for value in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(model_config, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(value, int):
            return value
    return 0
