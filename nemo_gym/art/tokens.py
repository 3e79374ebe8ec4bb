"""Trajectory groups → a `TrainingBatch`: the policy's own token ids, a loss mask, its log-probs, GRPO advantages.

Only `Choice`s are trained. vllm_model puts the token information of a call on the choice's message
(`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`: docs/architecture.md, Processes and the wire
protocol); the openai client keeps these extra fields. A trajectory whose calls chain exactly (each call's prompt
starts with the previous call's prompt + generation: what vllm_model does when the previous assistant turn is passed
back with its token ids, as `Trajectory.messages()` does) is one sequence with every generated token masked in
(`nemo_gym.train.batch.rollout_to_sequence`). When they do not chain (the rollout rebuilt the messages without the
token ids, so later prompts re-tokenized earlier turns), each call becomes its own sequence, all with the
trajectory's advantage: the same tokens are trained, each in the context it was sampled in.

Groups: advantages are computed per group (`nemo_gym.rl.compute_advantages`); groups of fewer than two
trajectories and groups whose rewards do not vary carry no signal and are dropped (and counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from openai.types.chat.chat_completion import Choice

from nemo_gym.art.trajectories import TOKEN_KEYS, Trajectory, TrajectoryGroup
from nemo_gym.common.errors import DataError
from nemo_gym.rl import compute_advantages, zero_variance_groups
from nemo_gym.train.batch import TrainingBatch, TrainingSequence, collate, rollout_to_sequence

__all__ = ["choice_token_info", "trajectory_sequences", "GroupsBatch", "groups_to_batch", "mean_metrics"]


def choice_token_info(choice: Choice) -> dict[str, Any] | None:
    """`{prompt_token_ids, generation_token_ids, generation_log_probs}` of a choice, None when it has none."""
    extra = {**(choice.model_extra or {}), **(choice.message.model_extra or {})}
    if extra.get("generation_token_ids") is None:
        return None
    return {key: extra.get(key) for key in TOKEN_KEYS}


def _chains(calls: list[dict[str, Any]]) -> bool:
    for previous, current in zip(calls, calls[1:]):
        context = list(previous["prompt_token_ids"] or []) + list(previous["generation_token_ids"])
        if list(current["prompt_token_ids"] or [])[: len(context)] != context:
            return False
    return True


def trajectory_sequences(trajectory: Trajectory) -> list[TrainingSequence]:
    """The training sequences of a trajectory: one when its calls chain, else one per call (module docstring).

    Returns [] for a trajectory without any `Choice` (nothing the policy generated to train on).

    Raises:
        DataError: a choice without token information (not sampled through vllm_model with
            `return_token_id_information`), or log-probs and generation ids of different lengths.
    """
    calls = []
    for index, choice in enumerate(trajectory.choices()):
        info = choice_token_info(choice)
        if info is None:
            raise DataError(
                f"choice {index} of the trajectory carries no token ids: sample with `model.openai_client()` of a"
                " registered TrainableModel (vllm_model returns prompt_token_ids, generation_token_ids,"
                " generation_log_probs)"
            )
        calls.append(info)
    if not calls:
        return []
    if _chains(calls):
        return [rollout_to_sequence({"response": {"output": calls}})]
    return [rollout_to_sequence({"response": {"output": [call]}}) for call in calls]


@dataclass
class GroupsBatch:
    """What a list of groups gives for one optimizer step.

    Attributes:
        batch: the padded batch, None when no group carries signal.
        rewards: [n] every trajectory's reward (all groups, kept or not).
        advantages: [B] the advantage of each sequence of `batch` (empty when `batch` is None).
        num_groups, groups_too_small, groups_zero_variance: counts; `num_exceptions`: failed rollouts.
    """

    batch: TrainingBatch | None
    rewards: list[float]
    advantages: torch.Tensor
    num_groups: int
    groups_too_small: int = 0
    groups_zero_variance: int = 0
    num_exceptions: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def _group_advantages(rewards: list[list[float]], estimator: str) -> list[list[float]]:
    """Advantages per group; groups of equal size are computed together (reinforce_pp needs the batch)."""
    if len({len(r) for r in rewards}) == 1:
        return compute_advantages(torch.tensor(rewards, dtype=torch.float64), estimator=estimator).tolist()  # type: ignore[arg-type]
    if estimator == "reinforce_pp":
        raise ValueError("reinforce_pp normalises over the batch: give groups of equal size")
    return [
        compute_advantages(torch.tensor([r], dtype=torch.float64), estimator=estimator)[0].tolist() for r in rewards
    ]  # type: ignore[arg-type]


def mean_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """`metric_<name>`: the mean of each metric over all trajectories that report it.

    Raises:
        ValueError: a metric that is not a number or a bool.
    """
    sums: dict[str, list[float]] = {}
    for trajectory in (t for g in groups for t in g):
        trajectory.check_metrics()
        for name, value in trajectory.metrics.items():
            sums.setdefault(name, []).append(float(value))
    return {f"metric_{name}": sum(values) / len(values) for name, values in sums.items()}


def groups_to_batch(
    groups: Iterable[TrajectoryGroup], *, estimator: str = "grpo", pad_token_id: int = 0
) -> GroupsBatch:
    """Advantages per group, sequences per trajectory, one padded `TrainingBatch` (see the module docstring).

    Raises:
        DataError: a trained trajectory without token information (see `trajectory_sequences`).
        ValueError: a metric that is not a number or a bool, or an unknown estimator.
    """
    groups = list(groups)
    rewards = [t.reward for g in groups for t in g]
    result = GroupsBatch(
        None,
        rewards,
        torch.zeros(0),
        num_groups=len(groups),
        num_exceptions=sum(len(g.exceptions) for g in groups),
        metrics=mean_metrics(groups),
    )
    sized = [g for g in groups if len(g) >= 2]
    result.groups_too_small = len(groups) - len(sized)
    zero_variance = [bool(zero_variance_groups(torch.tensor([g.rewards], dtype=torch.float64))[0]) for g in sized]
    kept = [g for g, flat in zip(sized, zero_variance) if not flat]
    result.groups_zero_variance = sum(zero_variance)
    if not kept:
        return result
    sequences, advantages = [], []
    for group, group_advantages in zip(kept, _group_advantages([g.rewards for g in kept], estimator)):
        for trajectory, advantage in zip(group, group_advantages):
            for sequence in trajectory_sequences(trajectory):
                sequences.append(sequence)
                advantages.append(advantage)
    if not sequences:
        return result
    result.batch = collate(sequences, advantages, pad_token_id=pad_token_id)
    result.advantages = result.batch.advantages
    return result
