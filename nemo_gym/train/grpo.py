"""GRPO (`trainer.algorithm: grpo`, the default), a recipe of `nemo_gym.train.loop.TrainingLoop` (ARCHITECTURE §8).

Per step (rank 0 prepares the batch, the loop broadcasts it):
  1. tasks: the next `batch_size` rows of a fixed per-epoch permutation of the (filtered) task file
     (`nemo_gym.train.policy_gym.PolicyGym.batch`);
  2. rollouts: `group_size` per task through the agents, in memory (`PolicyGym.collect`; the step's files under
     `output_dir/rollouts/`), sampled by vllm_model serving the current weights;
  3. advantages per group (`nemo_gym.rl.compute_advantages`); groups whose rewards do not vary and groups
     with failed rollouts are dropped and counted; a step with no group left is logged loudly (no update);
  4. the loop's optimizer step on the trainer's own log-probs of the generated ids (`PolicyEngine.train_step`);
  5. weight sync to the policy server (`publish_weights`); evaluation: mean reward and pass@1 of rollouts of the
     evaluation tasks.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from nemo_gym.collect import TASK_INDEX_KEY
from nemo_gym.rl import compute_advantages, zero_variance_groups
from nemo_gym.train.batch import TrainingBatch, collate, rollout_to_sequence
from nemo_gym.train.config import TrainerConfig
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.loop import TrainingLoop, value_stats
from nemo_gym.train.policy_gym import GymRecipe, PolicyGym

__all__ = ["GRPORecipe", "GroupedStep", "build_step"]


@dataclass
class GroupedStep:
    """What one step's rollouts gave: the batch to train on (None when nothing is left) and counts."""

    batch: TrainingBatch | None
    rewards: list[float]
    groups_total: int
    groups_zero_variance: int
    groups_incomplete: int
    advantages: torch.Tensor


def build_step(rollouts: list[dict[str, Any]], num_tasks: int, group_size: int, estimator: str, pad_token_id: int) -> GroupedStep:
    """Group rollouts by task, drop incomplete and zero-variance groups, compute advantages, collate."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rollouts:
        groups[row[TASK_INDEX_KEY]].append(row)
    complete = [groups[t] for t in range(num_tasks) if len(groups.get(t, [])) == group_size]
    rewards = [float(row["reward"]) for row in rollouts]
    empty = torch.zeros(0)
    if not complete:
        return GroupedStep(None, rewards, num_tasks, 0, num_tasks, empty)
    rewards_G = torch.tensor([[float(row["reward"]) for row in group] for group in complete], dtype=torch.float32)
    zero_var = zero_variance_groups(rewards_G)
    kept = [group for group, drop in zip(complete, zero_var.tolist()) if not drop]
    counts = dict(groups_total=num_tasks, groups_zero_variance=int(zero_var.sum()), groups_incomplete=num_tasks - len(complete))
    if not kept:
        return GroupedStep(None, rewards, advantages=empty, **counts)
    advantages_G = compute_advantages(rewards_G[~zero_var], estimator=estimator)
    sequences = [rollout_to_sequence(row) for group in kept for row in group]
    batch = collate(sequences, advantages_G.reshape(-1), pad_token_id=pad_token_id)
    return GroupedStep(batch, rewards, advantages=advantages_G.reshape(-1), **counts)


class GRPORecipe(GymRecipe):
    """GRPO through the gym's own servers (see the module docstring); a `nemo_gym.train.loop.Recipe`."""

    batch_on_main = True

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        self.cfg, self.argv = cfg, argv
        self.engine: PolicyEngine | None = None
        self.gym: PolicyGym | None = None  # rank 0 only
        self.loop: TrainingLoop | None = None
        self.has_eval = False

    def setup(self, loop: TrainingLoop) -> None:
        """Rank 0: tasks and servers; every rank: the engine; rank 0: the weight sync."""
        self.loop = loop
        if loop.is_main:  # the other ranks neither read the tasks nor start servers
            self.gym = PolicyGym(self.cfg, self.argv, loop.out)
            self.has_eval = bool(self.gym.eval_tasks)
        self.engine = PolicyEngine(self.cfg.engine, self.cfg.loss, total_steps=self.cfg.num_steps)
        if loop.is_main:
            self.gym.connect(self.engine)

    def prepare_step(self, step: int) -> tuple[dict[str, Any], TrainingBatch | None]:
        """Rank 0: the step's rollouts, grouped; (metrics so far, the batch to train on or None)."""
        cfg = self.cfg
        tasks, rollouts, generation_s = self.step_rollouts(step)
        grouped = build_step(rollouts, len(tasks), cfg.group_size, cfg.advantage_estimator, self.engine.pad_token_id)
        metrics: dict[str, Any] = {
            "step": step + 1,
            "data_position": (step + 1) * cfg.batch_size,
            "rollouts": len(rollouts),
            "rollouts_failed": len(tasks) * cfg.group_size - len(rollouts),
            "groups_total": grouped.groups_total,
            "groups_zero_variance": grouped.groups_zero_variance,
            "groups_incomplete": grouped.groups_incomplete,
            **value_stats("reward", grouped.rewards),
            "pass_rate": sum(r >= cfg.eval.pass_threshold for r in grouped.rewards) / max(1, len(grouped.rewards)),
            **value_stats("advantage", grouped.advantages),
            "time_generation_s": generation_s,
        }
        if grouped.batch is None:
            metrics["trained"] = False
            print(
                f"ng_train: WARNING step {step + 1}: no group left to train on ({grouped.groups_zero_variance} with equal rewards, "
                f"{grouped.groups_incomplete} with failed rollouts, of {grouped.groups_total}); no optimizer step. "
                "Filter the tasks (profile them, keep 0 < pass_rate < 1) or raise group_size",
                file=sys.stderr,
                flush=True,
            )
        return metrics, grouped.batch
