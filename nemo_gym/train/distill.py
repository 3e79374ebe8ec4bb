"""On-policy distillation (`trainer.algorithm: on_distill`): the student samples, a teacher grades every token.

Method: Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes"
(GKD, with the reverse KL and student-generated data, λ = 1), in the form of Thinking Machines, "On-Policy
Distillation" (Lu & Thinking Machines Lab, 2025) and tinker-cookbook's `distillation` recipe: the per-token
advantage is the negative reverse KL sample of the student's own token x_t,
    A_t = -(log π_student(x_t | x_<t) - log π_teacher(x_t | x_<t)),
with log π_student the sampler's (vLLM's) log-prob of the token it sampled, and the policy-gradient loss is
`importance_sampling`, -r_t A_t with r_t = π_θ / π_sampler (`nemo_gym.rl.policy_loss`, per-token advantages),
so minimising it lowers the reverse KL(π_θ || π_teacher) along the student's trajectories.

Per step (a recipe of `nemo_gym.train.loop.TrainingLoop`, which owns the steps, checkpoints, evaluation schedule and
multi-rank handling; tasks, rollouts and weight sync as GRPO's, `nemo_gym.train.gym_connection`): `batch_size` tasks ×
`group_size` student rollouts through the gym's agents,
served by vllm_model with the current weights → the teacher's log-probs of each rollout's whole token sequence
→ per-token advantages on the generated tokens (mask 1) → one optimizer step → weight sync. Rewards are recorded
(reward_* metrics) but do not enter the loss; no group is dropped for equal rewards.

The teacher: a model server that returns log-probs of given token ids (`nemo_gym.model_servers.teacher_scoring`): a
vllm_model instance of the config (`teacher.instance`, its `POST /score_token_ids`), or any vLLM OpenAI server
(`teacher.base_url`, its `/v1/completions` with `prompt_logprobs`). A server, not a model loaded in the trainer:
the teacher is typically much bigger than the student, and vLLM scores a sequence in one prefill on its own
devices while the trainer's memory stays the student's. The teacher must use the student's tokenizer (the
advantages compare log-probs of the same token ids), as in the papers' same-family pairs.

Deviations: the teacher log-prob is the raw (temperature 1) distribution, while the student's is the sampler's at
the rollouts' temperature (use temperature 1.0 for the exact reverse KL); like tinker-cookbook we use no discount
over future tokens (each token's advantage is its own KL term); `loss.loss_type` defaults to `importance_sampling`
(when the config does not set it), and the TIS correction of `loss.tis_cap` still applies.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx
import torch

from nemo_gym.common.errors import ConfigError, ServerError
from nemo_gym.model_servers.teacher_scoring import SCORE_ROUTE, parse_prompt_logprobs, prompt_logprobs_request
from nemo_gym.rl import policy_loss
from nemo_gym.serving.auth import TOKEN_HEADER
from nemo_gym.serving.head import run_token_for_url
from nemo_gym.train.batch import TrainingBatch, TrainingSequence, collate, rollout_to_sequence
from nemo_gym.train.config import TeacherOptions, TrainerConfig
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.gym_connection import OnPolicyRecipe
from nemo_gym.train.loop import TrainingLoop, value_stats

__all__ = [
    "DistillBatch",
    "distill_advantages",
    "distill_batch",
    "TeacherClient",
    "DistillEngine",
    "OnPolicyDistillRecipe",
]


def distill_advantages(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token advantages A_t = -(log π_student - log π_teacher) on masked tokens, 0 elsewhere.

    Args (all [B, T - 1], aligned on the targets `input_ids[:, 1:]`): `student_logprobs`, the sampler's log-probs
    of the sampled tokens; `teacher_logprobs`, the teacher's of the same tokens; `mask`, 1 on generated tokens.
    Example: student -0.5, teacher -2.0 → A = -(-0.5 + 2.0) = -1.5 (the student is over-confident there).
    """
    return -(student_logprobs - teacher_logprobs) * mask.to(student_logprobs.dtype)


@dataclass
class DistillBatch(TrainingBatch):
    """A `TrainingBatch` with per-token advantages `token_advantages: [B, T - 1]` (`advantages` [B] unused, 0)."""

    token_advantages: torch.Tensor | None = None

    def select(self, index: slice | torch.Tensor) -> DistillBatch:
        sub = super().select(index)
        width = sub.loss_mask.shape[1]
        return DistillBatch(**vars(sub), token_advantages=self.token_advantages[index, :width])


def distill_batch(
    sequences: list[TrainingSequence], teacher_logprobs: list[list[float | None]], *, pad_token_id: int = 0
) -> DistillBatch:
    """Collate the student's sequences and attach A_t = -(student - teacher) on their generated tokens.

    `teacher_logprobs[b]` has one entry per token of sequence b (entry 0, without context, is None).

    Raises:
        ServerError: a teacher answer whose length differs from its sequence's.
    """
    batch = collate(sequences, [0.0] * len(sequences), pad_token_id=pad_token_id)
    teacher_T = torch.zeros_like(batch.rollout_logprobs)
    for b, values in enumerate(teacher_logprobs):
        if len(values) != len(sequences[b].input_ids):
            raise ServerError(
                f"teacher returned {len(values)} log-probs for a sequence of {len(sequences[b].input_ids)} tokens",
                path=SCORE_ROUTE,
            )
        teacher_T[b, : len(values) - 1] = torch.tensor(
            [v if v is not None else 0.0 for v in values[1:]], dtype=torch.float32
        )
    advantages = distill_advantages(batch.rollout_logprobs, teacher_T, batch.loss_mask)
    return DistillBatch(**vars(batch), token_advantages=advantages)


class DistillEngine(PolicyEngine):
    """`PolicyEngine` whose loss takes the batch's per-token advantages (`policy_loss` with [B, T - 1] advantages)."""

    def _micro_loss(
        self, micro: TrainingBatch, *, num_tokens: int, num_sequences: int
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        assert isinstance(micro, DistillBatch) and micro.token_advantages is not None
        logprobs, entropy = self._target_logprobs(self.engine, micro, entropy=True)
        return policy_loss(
            logprobs,
            logprobs.detach(),
            micro.token_advantages,
            micro.loss_mask,
            self.loss_config,
            rollout_logprobs=micro.rollout_logprobs,
            entropy=entropy,
            num_tokens_global=num_tokens,
            num_sequences_global=num_sequences,
        )


class TeacherClient:
    """Log-probs of token sequences from the teacher server (see the module docstring), `parallel` requests at once."""

    def __init__(self, options: TeacherOptions, url: str, *, run_token: str | None = None, parallel: int = 16):
        self.options, self.url, self.parallel = options, url.rstrip("/"), parallel
        headers: dict[str, str] = {}
        if options.base_url and options.api_key_env:
            key = os.environ.get(options.api_key_env)
            if not key:
                raise ConfigError(f"trainer.teacher.api_key_env: environment variable {options.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        elif run_token:
            headers[TOKEN_HEADER] = run_token
        self.headers = headers
        self.model = options.model

    def score(self, sequences: list[list[int]]) -> list[list[float | None]]:
        """`[n_i]` teacher log-probs per sequence (entry 0 None).

        Raises:
            ServerError: the teacher is unreachable, answers an error, or its answer has no usable log-probs.
        """
        return asyncio.run(self._score_all(sequences))

    async def _score_all(self, sequences: list[list[int]]) -> list[list[float | None]]:
        limit = asyncio.Semaphore(self.parallel)
        async with httpx.AsyncClient(
            headers=self.headers, timeout=httpx.Timeout(self.options.timeout_s, connect=10.0)
        ) as client:
            if self.options.base_url and self.model is None:
                self.model = (await self._call(client, "GET", "/v1/models", None))["data"][0]["id"]

            async def one(ids: list[int]) -> list[float | None]:
                async with limit:
                    if self.options.base_url:
                        answer = await self._call(
                            client, "POST", "/v1/completions", prompt_logprobs_request(self.model or "", ids)
                        )
                        try:
                            return parse_prompt_logprobs(answer, ids)
                        except ValueError as exc:
                            raise ServerError(f"teacher {self.url}: {exc}", path="/v1/completions") from exc
                    return (await self._call(client, "POST", SCORE_ROUTE, {"token_ids": ids}))["logprobs"]

            return list(await asyncio.gather(*(one(ids) for ids in sequences)))

    async def _call(
        self, client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        try:
            answer = await client.request(method, f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            raise ServerError(f"teacher {self.url}{path} unreachable: {exc!r}", path=path) from exc
        if answer.status_code in (404, 405) and path == SCORE_ROUTE:
            raise ServerError(
                f"teacher {self.url} has no POST {SCORE_ROUTE}: teacher.instance must be a vllm_model instance (or use"
                " teacher.base_url of a vLLM server)",
                path=path,
            )
        if answer.status_code >= 400:
            raise ServerError(
                f"teacher {self.url}{path} answered {answer.status_code}: {answer.text[:2000]}", path=path
            )
        return answer.json()


class OnPolicyDistillRecipe(OnPolicyRecipe):
    """On-policy distillation (see the module docstring): GRPO's gym and loop, the teacher's per-token advantages
    instead of group-relative rewards; a `nemo_gym.train.loop.Recipe`."""

    engine_class = DistillEngine

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        if "loss_type" not in cfg.loss.model_fields_set:  # the method's loss unless the config chose another
            cfg = cfg.model_copy(update={"loss": cfg.loss.model_copy(update={"loss_type": "importance_sampling"})})
        super().__init__(cfg, argv)
        self.teacher: TeacherClient | None = None  # rank 0 only

    def setup(self, loop: TrainingLoop) -> None:
        """`OnPolicyRecipe.setup` (tasks, servers, the engine, the weight sync); rank 0 also: the teacher's client."""
        super().setup(loop)
        if loop.is_main:
            teacher = self.cfg.teacher
            assert teacher is not None  # check_algorithm
            url = teacher.base_url or self.gym.servers.server_url(teacher.instance)
            token = None if teacher.base_url else run_token_for_url(self.gym.servers.head_url)
            self.teacher = TeacherClient(teacher, url, run_token=token, parallel=self.cfg.num_samples_in_parallel)

    def prepare_step(self, step: int) -> tuple[dict[str, Any], TrainingBatch | None]:
        """Rank 0: the step's student rollouts, scored by the teacher; (metrics so far, the batch or None)."""
        cfg = self.cfg
        tasks, rollouts, generation_s = self.step_rollouts(step)
        rewards = [float(row["reward"]) for row in rollouts]
        metrics = self.rollout_metrics(
            step, (step + 1) * cfg.batch_size, rewards, len(tasks) * cfg.group_size, generation_s
        )
        sequences = [rollout_to_sequence(row) for row in rollouts]
        sequences = [s for s in sequences if s.num_generated_tokens > 0]
        if not sequences:
            metrics["trained"] = False
            print(f"ng_train: WARNING step {step + 1}: no rollout with generated tokens; no optimizer step", flush=True)
            return metrics, None
        started = time.monotonic()
        with self.loop.stop.abandonable():
            teacher = self.teacher.score([s.input_ids for s in sequences])
        metrics["time_teacher_s"] = time.monotonic() - started
        batch = distill_batch(sequences, teacher, pad_token_id=self.engine.pad_token_id)
        kl = -batch.token_advantages[batch.loss_mask > 0]  # log π_student - log π_teacher on the sampled tokens
        metrics.update(
            teacher_kl_mean=kl.mean().item(), teacher_kl_max=kl.max().item(), **value_stats("advantage", -kl)
        )
        return metrics, batch
