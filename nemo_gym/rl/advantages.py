"""Group-relative advantage estimators for outcome rewards (one scalar reward per rollout).

Shape suffix: `_G` marks a tensor laid out `[num_groups, group_size]`, one row per task, one column per rollout
of that task (the `group_size` rollouts of a GRPO step). Every estimator returns one advantage per rollout, in
the same layout; the loss broadcasts it over the rollout's generated tokens.

Estimators (`Estimator`):
    grpo          (r - mean_g) / (std_g + eps)              DeepSeekMath, Shao et al. 2024, §4.1.2
    dr_grpo       r - mean_g                                Liu et al. 2025, "Understanding R1-Zero-like
                                                            training" (arXiv:2503.20783), Dr. GRPO
    rloo          r_i - mean_{j != i} r_j                   Ahmadian et al. 2024, "Back to Basics"
                                                            (arXiv:2402.14740), RLOO (after Kool et al. 2019)
    reinforce_pp  (r - mean_g) / (std_batch + eps)          Hu et al. 2025, REINFORCE++ (arXiv:2501.03262),
                                                            "REINFORCE++ w/ baseline" variant

Deviations from the papers and reference implementations (all deliberate):
    - std is the unbiased sample std (divide by n - 1), as in verl `compute_grpo_outcome_advantage`
      (`torch.std`) and TRL `GRPOTrainer` (`nanstd`); DeepSeekMath writes std(r) without saying which.
    - eps defaults to 1e-6 (verl); TRL adds 1e-4 to the std. Pass `eps=1e-4` to match TRL exactly.
    - reinforce_pp normalises the group-centred rewards by their std over the whole batch, one value per
      rollout. verl (`compute_reinforce_plus_plus_baseline_outcome_advantage`) and OpenRLHF whiten the same
      quantity broadcast over tokens, i.e. a token-weighted mean/std, so long rollouts weigh more there. Our
      batch mean of group-centred rewards is 0 by construction, so we only divide. TRL's `scale_rewards="batch"`
      divides by the std of the raw rewards instead, which is a different quantity.
    - Rewards must be finite: a failed rollout is a value to drop before this point, never a NaN reward or a
      silent 0 (TRL instead nan-masks unscorable completions).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

__all__ = ["Estimator", "compute_advantages", "zero_variance_groups"]

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)


def compute_advantages(rewards_G: torch.Tensor, estimator: Estimator = "grpo", *, eps: float = 1e-6) -> torch.Tensor:
    """Advantage of every rollout relative to its group (and, for reinforce_pp, the batch).

    Args:
        rewards_G: [num_groups, group_size] float rewards, one row per task.
        estimator: which formula (see the module docstring and the per-estimator functions below).
        eps: added to the std in `grpo` and `reinforce_pp` so a zero-variance group gives advantage 0, not NaN.

    Returns:
        [num_groups, group_size] advantages, same dtype and device as `rewards_G`, no grad.

    Raises:
        ValueError: `rewards_G` is not 2-D, holds a non-finite value, the group size is 1 (no group baseline),
            or `estimator` is unknown.

    Example (one group, rewards [1, 0, 0, 1]): mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735, so
    grpo gives [0.866, -0.866, -0.866, 0.866] and dr_grpo [0.5, -0.5, -0.5, 0.5].
    """
    _check_rewards(rewards_G)
    rewards_G = rewards_G.detach()
    if estimator == "grpo":
        return _grpo(rewards_G, eps)
    if estimator == "dr_grpo":
        return _dr_grpo(rewards_G)
    if estimator == "rloo":
        return _rloo(rewards_G)
    if estimator == "reinforce_pp":
        return _reinforce_pp(rewards_G, eps)
    raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")


def zero_variance_groups(rewards_G: torch.Tensor, *, atol: float = 1e-8) -> torch.Tensor:
    """Which groups carry no learning signal because all their rollouts got (nearly) the same reward.

    Such groups have advantage 0 under every estimator here (up to `atol`), so they only dilute the batch;
    DAPO's dynamic sampling (Yu et al. 2025, §3.2) drops them. The trainer drops them and counts them in its logs;
    with `trainer.dynamic_sampling` it also refills the step from further tasks (`nemo_gym.train.grpo.fill_step`).

    Args:
        rewards_G: [num_groups, group_size] float rewards.
        atol: a group whose max - min reward is at most this counts as zero-variance.

    Returns:
        [num_groups] bool, True where the group has zero reward variance.

    Raises:
        ValueError: `rewards_G` is not 2-D or holds a non-finite value.
    """
    _check_rewards(rewards_G, min_group_size=1)
    spread = rewards_G.amax(dim=1) - rewards_G.amin(dim=1)
    return spread <= atol


def _grpo(rewards_G: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO outcome-supervision advantage, DeepSeekMath (Shao et al. 2024, arXiv:2402.03300) §4.1.2:
    Â_i,t = (r_i - mean(r)) / std(r), the same for every token of rollout i; used in the objective Eq. (3).
    Matches verl `compute_grpo_outcome_advantage` (norm_adv_by_std_in_grpo=True) and TRL `scale_rewards="group"`.
    """
    mean = rewards_G.mean(dim=1, keepdim=True)
    std = rewards_G.std(dim=1, keepdim=True)  # unbiased (n - 1)
    return (rewards_G - mean) / (std + eps)


def _dr_grpo(rewards_G: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantage, Liu et al. 2025 (arXiv:2503.20783), Fig. 1: Â_i = r_i - mean(r), the std division
    removed (it up-weights too-easy and too-hard questions). Matches verl `norm_adv_by_std_in_grpo=False` and
    TRL `scale_rewards="none"`.
    """
    return rewards_G - rewards_G.mean(dim=1, keepdim=True)


def _rloo(rewards_G: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out baseline, Ahmadian et al. 2024 (arXiv:2402.14740), RLOO (Kool et al. 2019):
    A_i = r_i - 1/(k-1) Σ_{j≠i} r_j  =  (k r_i - Σ_j r_j) / (k - 1).
    Matches verl `compute_rloo_outcome_advantage` (which writes it as r_i k/(k-1) - mean k/(k-1)).
    """
    group_size = rewards_G.shape[1]
    total = rewards_G.sum(dim=1, keepdim=True)
    return (group_size * rewards_G - total) / (group_size - 1)


def _reinforce_pp(rewards_G: torch.Tensor, eps: float) -> torch.Tensor:
    """REINFORCE++ with baseline, Hu et al. 2025 (arXiv:2501.03262), "REINFORCE++ w/ baseline": subtract the
    group mean (local baseline), then normalise by the std over the whole batch (global normalisation):
    A_i = (r_i - mean_g) / (std_batch(r - mean_g) + eps). The batch mean of r - mean_g is 0, so no re-centring.
    """
    centred = _dr_grpo(rewards_G)
    if centred.numel() < 2:
        return centred
    return centred / (centred.std() + eps)


def _check_rewards(rewards_G: torch.Tensor, *, min_group_size: int = 2) -> None:
    if rewards_G.dim() != 2:
        raise ValueError(f"rewards_G must be [num_groups, group_size], got shape {tuple(rewards_G.shape)}")
    if rewards_G.shape[1] < min_group_size:
        raise ValueError(
            f"group_size is {rewards_G.shape[1]}; group-relative advantages need at least {min_group_size} "
            "rollouts per task"
        )
    if not torch.isfinite(rewards_G).all():
        raise ValueError("rewards_G holds NaN/inf; drop failed rollouts before computing advantages")
