"""Policy-gradient losses on per-token log-probs, for GRPO-style training on rollouts.

Shapes: `[batch, seq]` tensors are aligned on the generated positions of `batch` rollouts; `mask` is 1 on the
tokens the policy generated and that count (0 on prompt, tool output and padding). `advantages` is `[batch]`,
one per rollout (see `nemo_gym.rl.advantages`), broadcast over its tokens, or `[batch, seq]`, one per token
(on-policy distillation, `nemo_gym.train.distill`).

Per-token objective (`LossConfig.loss_type`), with r = exp(logprobs - old_logprobs) and A the advantage:
    ppo                  -min(r A, clip(r, 1-ε_low, 1+ε_high) A)      PPO-clip with DAPO's clip-higher
    cispo                -sg(min(r, 1+ε_high)) A log π                 MiniMax-M1 CISPO
    gspo                 -min(s A, clip(s, 1-ε_low, 1+ε_high) A),      GSPO, s = exp(mean_t(logprobs - old))
                          s one value per sequence
    importance_sampling  -r A                                          REINFORCE with an importance weight
then, per token: × TIS weight w = sg(min(exp(old_logprobs - rollout_logprobs), tis_cap)),
+ kl_coef × k3(π_θ, π_ref); normalised over tokens or sequences; minus entropy_coef × mean entropy.

Normalisation (`LossConfig.normalization`):
    token     Σ_{i,t} ℓ_it m_it / N_tokens          DAPO token-level loss (Yu et al. 2025, §3.3);
                                                    TRL `loss_type="dapo"` (global N) / `"bnpo"` (local N)
    sequence  Σ_i (Σ_t ℓ_it m_it / |o_i|) / N_seq   GRPO's 1/G Σ_i 1/|o_i| Σ_t (DeepSeekMath Eq. 3);
                                                    TRL `loss_type="grpo"`
N_tokens / N_seq default to this call's counts; pass the counts over the whole optimizer step
(`num_tokens_global`, `num_sequences_global`) when the step is split into micro-batches: the micro-batch losses
then SUM to the loss of one big batch, with identical gradients. Do not also divide by the number of
micro-batches (note that DeepSpeed's `engine.backward` divides by `gradient_accumulation_steps` by default:
multiply the loss back or pass `scale_wrt_gas=False`).

Deviations from the papers and reference implementations:
    - log(r) is clamped to [-20, 20] before exp (as verl does) so an extreme ratio cannot overflow; TRL does not
      clamp. Values inside the range are unchanged.
    - cispo caps the IS weight at 1 + clip_eps_high and has no lower bound. MiniMax-M1 (§3.1) writes a two-sided
      clip(r, 1-ε_IS_low, 1+ε_IS_high) but tunes only the upper bound (the lower one effectively off); TRL caps at
      `epsilon_high` itself (its ε_high for cispo is the absolute cap, i.e. our 1 + clip_eps_high).
    - gspo uses the sequence ratio s_i directly (TRL `importance_sampling_level="sequence"`); verl's
      "GSPO-token" form sg(s_i) π_t / sg(π_t) has the same value and, with sequence normalisation, the same
      gradient. GSPO's paper clips s with ε ≈ 3e-4/4e-4, far tighter than the token-level defaults here: set
      clip_eps_low/high accordingly. Token normalisation with gspo weights sequences by length (TRL warns).
    - The KL term is the plain k3 of DeepSeekMath Eq. 4 (TRL `use_bias_correction_kl=False`); TRL's default
      multiplies it by the ratio r (DeepSeek-V3.2's unbiased reverse-KL gradient), which we do not.
    - The TIS weight multiplies the policy term only, not the KL term (as in TRL); it uses the old trainer
      log-probs vs vLLM's (Yao et al. 2025), TRL `vllm_importance_sampling_mode="token_truncate"` with no lower clip.
    - The entropy bonus is normalised like the policy term (token or sequence, with the same global counts), so
      micro-batches still sum to the big batch; TRL always uses a per-micro-batch token mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["LossConfig", "masked_mean", "policy_loss", "token_entropy", "token_logprobs"]

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class LossConfig:
    """Which policy loss and which corrections.

    Attributes:
        loss_type: "ppo" | "cispo" | "gspo" | "importance_sampling" (module docstring).
        clip_eps_low: ratio lower clip 1 - ε_low (ppo, gspo).
        clip_eps_high: ratio upper clip 1 + ε_high (ppo, gspo; cispo's weight cap). DAPO's clip-higher: 0.28.
        normalization: "token" (DAPO) or "sequence" (GRPO).
        tis_cap: truncated importance sampling cap C on exp(old_logprobs - rollout_logprobs); None = off.
        kl_coef: β of the k3 KL penalty to the reference model; 0 = off.
        entropy_coef: weight of the entropy bonus (subtracted from the loss); 0 = off.
    """

    loss_type: Literal["ppo", "cispo", "gspo", "importance_sampling"] = "ppo"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    normalization: Literal["token", "sequence"] = "token"
    tis_cap: float | None = 2.0
    kl_coef: float = 0.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.loss_type not in ("ppo", "cispo", "gspo", "importance_sampling"):
            raise ValueError(f"unknown loss_type {self.loss_type!r}")
        if self.normalization not in ("token", "sequence"):
            raise ValueError(f"unknown normalization {self.normalization!r}")
        if not 0.0 <= self.clip_eps_low < 1.0 or self.clip_eps_high < 0.0:
            raise ValueError("clip_eps_low must be in [0, 1) and clip_eps_high >= 0")
        if self.tis_cap is not None and self.tis_cap <= 0.0:
            raise ValueError("tis_cap must be positive (or None to turn TIS off)")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1.

    Args:
        values: any shape.
        mask: same shape as `values`, 0/1 (bool or float).
        dim: reduce this dimension only; None = all elements.

    Returns:
        The mean (a scalar, or `values` reduced over `dim`); 0 where the mask is empty.
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each chosen token, log softmax(logits)[token], computed in float32.

    `logits[:, t]` must be the distribution that produced `token_ids[:, t]`: for a causal LM over `input_ids`,
    pass `logits[:, :-1]` with `input_ids[:, 1:]` (and divide the logits by the sampling temperature first).

    Args:
        logits: [B, T, V] unnormalised scores (any float dtype).
        token_ids: [B, T] int64 token ids in [0, V).

    Returns:
        [B, T] float32 log-probs (≤ 0), differentiable w.r.t. `logits`.
    """
    logits = logits.float()
    chosen = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = -Σ_v p_v log p_v of the next-token distribution at every position, in nats, in float32.

    Args:
        logits: [B, T, V] unnormalised scores.

    Returns:
        [B, T] float32 entropies in [0, log V], differentiable w.r.t. `logits`.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    rollout_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens_global: float | None = None,
    num_sequences_global: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar policy loss for one (micro-)batch of rollouts, and its metrics.

    Sources per loss_type in the module docstring (PPO-clip Schulman et al. 2017 Eq. 7 with DAPO clip-higher
    §3.1 and token-level loss §3.3; CISPO MiniMax-M1 §3.1; GSPO Eq. 5; TIS Yao et al. 2025; k3 Schulman 2020).
    Matches TRL `GRPOTrainer._compute_loss` (loss_type dapo/bnpo/grpo/cispo, importance_sampling_level
    "sequence" for gspo; equal losses and gradients in tests/test_rl_math.py) and verl
    `core_algos.compute_policy_loss_vanilla` / `compute_policy_loss_gspo` up to the deviations listed there.

    Args:
        logprobs: [batch, seq] trainer log-probs of the generated tokens (requires grad).
        old_logprobs: [batch, seq] trainer log-probs at sampling time (no grad; equal to `logprobs.detach()` for
            a single on-policy step, where every ratio is 1).
        advantages: [batch] one advantage per rollout, or [batch, seq] one per token.
        mask: [batch, seq] 1 for generated tokens that count, 0 for prompt, tool output and padding.
        config: the loss.
        rollout_logprobs: [batch, seq] vLLM's log-probs of the same tokens, for the TIS weight; None = no TIS.
        ref_logprobs: [batch, seq] reference-model log-probs; required when `config.kl_coef` != 0.
        entropy: [batch, seq] per-token entropy of the trainer's distribution (`token_entropy`); required when
            `config.entropy_coef` != 0, logged when given.
        num_tokens_global: token normaliser for the whole optimizer step; None = `mask.sum()` of this call.
        num_sequences_global: sequence normaliser for the whole step; None = rollouts of this call with at least
            one counted token.

    Returns:
        (loss, metrics). `loss` is a 0-dim tensor to call `.backward()` on. `metrics` (floats, means over this
        call's counted tokens unless named otherwise): loss, policy_loss, ratio_mean, ratio_max, ratio_min,
        clip_fraction_low, clip_fraction_high (tokens whose gradient the clip removed: r < 1-ε_low with A < 0,
        r > 1+ε_high with A > 0; for cispo the fraction capped with A > 0), num_tokens, num_sequences; with
        rollout_logprobs: tis_weight_mean, tis_fraction_capped, rollout_logprob_abs_diff_mean/max; with
        ref_logprobs: kl; with entropy: entropy.

    Raises:
        ValueError: mismatched shapes, or a KL / entropy coefficient without the tensor it needs.

    Example (ppo, ε 0.2/0.28, token normalisation, one rollout of 2 tokens, A = 1, ratios 1.5 and 1.0):
    per-token -min(1.5, 1.28) = -1.28 and -1.0, loss (-1.28 - 1.0) / 2 = -1.14, clip_fraction_high 0.5.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, rollout_logprobs, ref_logprobs, entropy, config)
    mask = mask.to(logprobs.dtype)
    old_logprobs = old_logprobs.detach()
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # [batch, 1], or [batch, seq] per-token advantages
    log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    lengths = mask.sum(dim=1)  # [batch]

    if config.loss_type == "gspo":
        ratio = _gspo_ratio(log_ratio, mask, lengths)  # [batch, 1]
    else:
        ratio = torch.exp(log_ratio)  # [batch, seq]
    per_token, low, high = _surrogate(ratio, adv, logprobs, config)
    per_token = per_token.expand_as(logprobs)

    metrics: dict[str, float] = {}
    if rollout_logprobs is not None:
        tis = _tis_weight(old_logprobs, rollout_logprobs.detach(), mask, config.tis_cap, metrics)
        if tis is not None:
            per_token = per_token * tis
    if ref_logprobs is not None:
        kl = _k3_kl(logprobs, ref_logprobs.detach())
        metrics["kl"] = masked_mean(kl.detach(), mask).item()
        if config.kl_coef != 0.0:
            per_token = per_token + config.kl_coef * kl

    normalise = _normaliser(config, mask, lengths, num_tokens_global, num_sequences_global)
    pg_loss = normalise(per_token)
    loss = pg_loss
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), mask).item()
        if config.entropy_coef != 0.0:
            loss = loss - config.entropy_coef * normalise(entropy)

    ratio_tok = ratio.detach().expand_as(logprobs)
    on = mask > 0
    metrics.update(
        loss=loss.item(),
        policy_loss=pg_loss.item(),
        ratio_mean=masked_mean(ratio_tok, mask).item(),
        ratio_max=ratio_tok[on].max().item() if on.any() else 1.0,
        ratio_min=ratio_tok[on].min().item() if on.any() else 1.0,
        clip_fraction_low=masked_mean(low.expand_as(logprobs).to(mask.dtype), mask).item(),
        clip_fraction_high=masked_mean(high.expand_as(logprobs).to(mask.dtype), mask).item(),
        num_tokens=mask.sum().item(),
        num_sequences=(lengths > 0).sum().item(),
    )
    return loss, metrics


def _surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, logprobs: torch.Tensor, config: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token (or per-sequence, gspo) loss before TIS/KL/normalisation, and the low/high clip indicators."""
    lo, hi = 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high
    if config.loss_type in ("ppo", "gspo"):
        # PPO-clip (Schulman et al. 2017, Eq. 7) with decoupled ε_low/ε_high (DAPO, Yu et al. 2025, §3.1
        # "Clip-Higher"); for gspo on the sequence ratio s_i (GSPO, Zheng et al. 2025, Eq. 5). TRL `_compute_loss`
        # ("grpo"/"bnpo"/"dapo"), verl `compute_policy_loss_vanilla` / `compute_policy_loss_gspo`.
        loss = -torch.min(ratio * adv, torch.clamp(ratio, lo, hi) * adv)
        return loss, (ratio < lo) & (adv < 0), (ratio > hi) & (adv > 0)
    if config.loss_type == "cispo":
        # CISPO (MiniMax-M1, arXiv:2506.13585, §3.1): J = E[1/Σ|o_i| Σ_i Σ_t sg(r̂_it) Â_it log π_θ(o_it)],
        # r̂ the clipped IS weight. TRL `_compute_loss` loss_type="cispo".
        weight = torch.clamp(ratio, max=hi).detach()
        return -weight * adv * logprobs, torch.zeros_like(ratio, dtype=torch.bool), (ratio > hi) & (adv > 0)
    # importance_sampling: REINFORCE with an importance weight, -r A; gradient -r A ∇log π (the form Tinker's
    # "importance_sampling" loss uses). No clipping.
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return -ratio * adv, none, none


def _gspo_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """GSPO sequence ratio s_i = (π_θ(o_i)/π_old(o_i))^(1/|o_i|) = exp(mean_t log r_it), Zheng et al. 2025
    (arXiv:2507.18071), defined with the objective Eq. (5). Returns [batch, 1]."""
    mean_log_ratio = (log_ratio * mask).sum(dim=1) / lengths.clamp(min=1.0)
    return torch.exp(mean_log_ratio).unsqueeze(1)


def _tis_weight(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float | None,
    metrics: dict[str, float],
) -> torch.Tensor | None:
    """Truncated importance sampling weight w = min(π_old_trainer / π_vLLM, C) per token (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training", TIS). Logs the mismatch; None if off."""
    diff = old_logprobs - rollout_logprobs
    abs_diff = diff.abs()
    on = mask > 0
    metrics["rollout_logprob_abs_diff_mean"] = masked_mean(abs_diff, mask).item()
    metrics["rollout_logprob_abs_diff_max"] = abs_diff[on].max().item() if on.any() else 0.0
    if cap is None:
        return None
    raw = torch.exp(torch.clamp(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = torch.clamp(raw, max=cap)
    metrics["tis_weight_mean"] = masked_mean(weight, mask).item()
    metrics["tis_fraction_capped"] = masked_mean((raw > cap).to(mask.dtype), mask).item()
    return weight


def _k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π_θ || π_ref) per token: exp(ref - logp) - (ref - logp) - 1 ≥ 0 (Schulman 2020,
    "Approximating KL Divergence"; DeepSeekMath Eq. 4). TRL `per_token_kl`, verl `kl_penalty(..., "low_var_kl")`
    (which also clamps to [-10, 10]; we do not)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def _normaliser(
    config: LossConfig,
    mask: torch.Tensor,
    lengths: torch.Tensor,
    num_tokens_global: float | None,
    num_sequences_global: float | None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Returns f([batch, seq] per-token values) -> scalar, the token- or sequence-level masked average."""
    if config.normalization == "token":
        denom = float(num_tokens_global) if num_tokens_global is not None else mask.sum().clamp(min=1.0)
        return lambda x: (x * mask).sum() / denom
    n_seq = float(num_sequences_global) if num_sequences_global is not None else (lengths > 0).sum().clamp(min=1)
    return lambda x: ((x * mask).sum(dim=1) / lengths.clamp(min=1.0)).sum() / n_seq


def _check_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    config: LossConfig,
) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [batch, seq], got shape {tuple(logprobs.shape)}")
    named = {"old_logprobs": old_logprobs, "mask": mask, "rollout_logprobs": rollout_logprobs}
    named |= {"ref_logprobs": ref_logprobs, "entropy": entropy}
    for name, tensor in named.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, logprobs {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1] and advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [batch] = [{logprobs.shape[0]}] or [batch, seq] = {list(logprobs.shape)}, got"
            f" {tuple(advantages.shape)}"
        )
    if config.kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError("kl_coef != 0 needs ref_logprobs")
    if config.entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy")
