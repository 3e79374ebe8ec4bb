"""GRPO (`trainer.algorithm: grpo`, the default), a recipe of `nemo_gym.train.loop.TrainingLoop`
(docs/architecture.md, Training).

Per step (rank 0 prepares the batch, the loop broadcasts it):
  1. tasks: the next `batch_size` rows of a fixed per-epoch permutation of the (filtered) task file
     (`nemo_gym.train.loop.TaskSampler`);
  2. rollouts: `group_size` per task through the agents, in memory (`GymConnection.collect`; the step's files under
     `output_dir/rollouts/`), sampled by vllm_model serving the current weights;
  3. advantages per group (`nemo_gym.rl.compute_advantages`); groups whose rewards do not vary and groups
     with failed or masked rollouts (NeMo Gym 0.7.0's `mask_sample`: the reward measures nothing) are dropped and
     counted. With `trainer.dynamic_sampling` (DAPO's dynamic sampling,
     `fill_step`) the dropped groups are refilled from further tasks, in up to `max_sampling_rounds` collections;
     a step with no group left is logged loudly (no update);
  4. the loop's optimizer step on the trainer's own log-probs of the generated ids (`PolicyEngine.train_step`);
  5. weight sync to the policy server (`publish_weights`); evaluation: mean reward and pass@1 of rollouts of the
     evaluation tasks.

Data position (`data_position` in the metrics and in a checkpoint's trainer_state.json): the number of positions of
the task order read so far. Without dynamic sampling it is (step + 1) * batch_size and the batch of step k is a
function of (seed, k); with it, a step reads on from where the previous one stopped (its base batch and its
refills), and a resumed run reads on from the checkpoint's data_position, as the uninterrupted run did.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_gym.common.jsonl import TASK_INDEX_KEY
from nemo_gym.env.metrics import mask_reason
from nemo_gym.rl import compute_advantages, zero_variance_groups
from nemo_gym.train.batch import TrainingBatch, collate, rollout_to_sequence
from nemo_gym.train.config import TrainerConfig
from nemo_gym.train.gym_connection import OnPolicyRecipe, step_collection_name
from nemo_gym.train.loop import TaskSampler, value_stats

__all__ = ["GRPORecipe", "GroupedStep", "StepDraws", "StepGroups", "build_step", "fill_step"]

Row = dict[str, Any]  # a task row or a rollout row


@dataclass
class GroupedStep:
    """What one step's rollouts gave: the batch to train on (None when nothing is left) and counts (over all of the
    step's sampling rounds)."""

    batch: TrainingBatch | None
    rewards: list[float]
    groups_total: int
    groups_zero_variance: int
    groups_incomplete: int
    advantages: torch.Tensor
    sampling_rounds: int = 1
    masked: dict[str, int] = field(default_factory=dict)  # failure_kind -> masked rollouts


@dataclass
class StepGroups:
    """The groups of one step, collection by collection (`add`): the complete groups with unequal rewards (`kept`, to
    train on) and what was dropped. `rewards` holds every collected rollout's reward, dropped groups included, masked
    rollouts (`nemo_gym.env.metrics.mask_reason`) excepted: they are counted by reason in `masked`, and their group
    is incomplete."""

    group_size: int
    kept: list[list[Row]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    rollouts_expected: int = 0
    groups_total: int = 0
    groups_zero_variance: int = 0
    groups_incomplete: int = 0
    rounds: int = 0
    masked: Counter[str] = field(default_factory=Counter)

    def add(self, rollouts: list[Row], num_tasks: int) -> None:
        """The rollouts of one collection of `num_tasks` tasks (`TASK_INDEX_KEY` = the task's index in it; failed
        rollouts absent): a group is kept when complete and its rewards vary; a masked rollout leaves its group
        incomplete (GRPO's baseline is the group's mean reward, which a reward that measures nothing would bias)."""
        by_task: dict[int, list[Row]] = defaultdict(list)
        measured = []
        for row in rollouts:
            reason = mask_reason(row)
            if reason is not None:
                self.masked[reason] += 1
                continue
            measured.append(row)
            by_task[row[TASK_INDEX_KEY]].append(row)
        complete = [by_task[t] for t in range(num_tasks) if len(by_task.get(t, [])) == self.group_size]
        self.rounds += 1
        self.rollouts_expected += num_tasks * self.group_size
        self.rewards += [float(row["reward"]) for row in measured]
        self.groups_total += num_tasks
        self.groups_incomplete += num_tasks - len(complete)
        if complete:
            zero_var = zero_variance_groups(_rewards_G(complete)).tolist()
            self.groups_zero_variance += sum(zero_var)
            self.kept += [group for group, drop in zip(complete, zero_var) if not drop]

    def to_step(self, estimator: str, pad_token_id: int) -> GroupedStep:
        """Advantages of the kept groups (computed together: `reinforce_pp` normalises over the batch), collated."""
        counts = dict(
            groups_total=self.groups_total,
            groups_zero_variance=self.groups_zero_variance,
            groups_incomplete=self.groups_incomplete,
            sampling_rounds=self.rounds,
            masked=dict(self.masked),
        )
        if not self.kept:
            return GroupedStep(None, self.rewards, advantages=torch.zeros(0), **counts)
        advantages = compute_advantages(_rewards_G(self.kept), estimator=estimator).reshape(-1)
        sequences = [rollout_to_sequence(row) for group in self.kept for row in group]
        return GroupedStep(
            collate(sequences, advantages, pad_token_id=pad_token_id), self.rewards, advantages=advantages, **counts
        )


def _rewards_G(groups: list[list[Row]]) -> torch.Tensor:
    """[num_groups, group_size] float32 rewards of `groups`."""
    return torch.tensor([[float(row["reward"]) for row in group] for group in groups], dtype=torch.float32)


def build_step(rollouts: list[Row], num_tasks: int, group_size: int, estimator: str, pad_token_id: int) -> GroupedStep:
    """One collection's rollouts: group by task, drop incomplete and zero-variance groups, compute advantages,
    collate."""
    groups = StepGroups(group_size)
    groups.add(rollouts, num_tasks)
    return groups.to_step(estimator, pad_token_id)


def fill_step(
    draw: Callable[[int], list[Row]],
    collect: Callable[[list[Row], int], list[Row]],
    batch_size: int,
    group_size: int,
    max_rounds: int,
) -> StepGroups:
    """The groups of one step with DAPO's dynamic sampling: collect, drop the groups without signal, refill.

    Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv:2503.14476), §3.2
    "Dynamic Sampling", the constraint 0 < |{o_i | is_equivalent(a, o_i)}| < G of the DAPO objective: over-sample and
    filter out the prompts whose G outputs are all right or all wrong (zero advantage, no gradient), until the batch is
    full of groups with non-zero advantage. Reference implementation: verl `recipe/dapo/dapo_ray_trainer.py`
    (`algorithm.filter_groups.enable`, `max_num_gen_batches`, metric `train/num_gen_batches` = our `sampling_rounds`).

    Round 1 collects the groups of `draw(batch_size)`; while fewer than `batch_size` groups are kept and fewer than
    `max_rounds` rounds ran, round r collects the groups of `draw(missing)` further tasks. `max_rounds=1` is plain
    GRPO: one collection, whatever it keeps.

    Deviations from verl: (1) verl generates whole batches of `data.gen_batch_size` prompts and cuts the kept groups
    to `train_batch_size`; a refill round here draws exactly the missing number of tasks, so no collected group is
    thrown away, at the price of more rounds when most groups are dropped (each round keeps the same share, so the
    shortfall shrinks geometrically). (2) verl raises an error once `max_num_gen_batches` is reached (0: no bound);
    here the bound is required and, once reached, the step trains on the groups it has (none: no optimizer step).
    (3) A group with a failed rollout is dropped and refilled too (verl has no failed rollouts); a group is a task's
    `group_size` rollouts, never fewer (verl keeps 1-rollout groups). (4) The filter is on the environment's reward
    (verl: `filter_groups.metric`, e.g. acc or seq_reward). (5) No task twice in a step (`StepDraws`).

    Args:
        draw: `count` -> up to `count` tasks not yet in the step (`[]` when none is left).
        collect: (tasks, round, 1-based) -> their rollouts (`TASK_INDEX_KEY` = index in `tasks`; failed ones absent).
        batch_size: groups a step trains on; group_size: rollouts per task; max_rounds: most collections (>= 1).

    Example (batch_size 2, rewards of a task's group of 2): round 1 draws A [1, 1] and B [0, 0], keeps none; round 2
    draws C [1, 0] and D [0, 0], keeps C; round 3 draws E [0, 1] and keeps it: 2 groups kept, 5 drawn, 3 dropped for
    zero variance, 3 rounds. With max_rounds=2 it stops after round 2 with C alone.
    """
    groups = StepGroups(group_size)
    while groups.rounds < max_rounds and len(groups.kept) < batch_size:
        tasks = draw(batch_size - len(groups.kept))
        if not tasks:  # every task of the data set is in the step
            break
        groups.add(collect(tasks, groups.rounds + 1), len(tasks))
    return groups


class StepDraws:
    """The tasks of one step under dynamic sampling (`fill_step`'s `draw`): distinct tasks read from the task order
    (`TaskSampler.draw`) from data position `position` on; `position` is then past what the step read."""

    def __init__(self, sampler: TaskSampler, tasks: list[Row], position: int):
        self.sampler, self.tasks, self.position = sampler, tasks, position
        self.taken: set[int] = set()

    def __call__(self, count: int) -> list[Row]:
        indices, self.position = self.sampler.draw(self.position, count, exclude=self.taken)
        self.taken.update(indices)
        return [self.tasks[i] for i in indices]


class GRPORecipe(OnPolicyRecipe):
    """GRPO through the gym's own servers (see the module docstring); a `nemo_gym.train.loop.Recipe` (its set-up:
    `OnPolicyRecipe.setup`)."""

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        super().__init__(cfg, argv)
        self.data_position = 0  # positions of the task order read by the finished steps (module docstring)

    def step_groups(self, step: int) -> StepGroups:
        """Rank 0: the groups of step `step` (0-based; `fill_step`); sets the data position the step reached."""
        cfg, gym = self.cfg, self.gym

        def collect(tasks: list[Row], sampling_round: int) -> list[Row]:
            return self.group_rollouts(tasks, step_collection_name(step, sampling_round))

        if (
            not cfg.dynamic_sampling
        ):  # one collection (`count` is batch_size): the batch of step k, a function of (seed, k)
            groups = fill_step(lambda count: gym.batch(step), collect, cfg.batch_size, cfg.group_size, max_rounds=1)
            self.data_position = (step + 1) * cfg.batch_size
            return groups
        draws = StepDraws(gym.sampler, gym.tasks, self.data_position)
        groups = fill_step(draws, collect, cfg.batch_size, cfg.group_size, cfg.max_sampling_rounds)
        self.data_position = draws.position  # only once the step's rollouts are in (a stop abandons the step before)
        return groups

    def prepare_step(self, step: int) -> tuple[dict[str, Any], TrainingBatch | None]:
        """Rank 0: the step's rollouts, grouped; (metrics so far, the batch to train on or None)."""
        cfg = self.cfg
        started = time.monotonic()
        groups = self.step_groups(step)
        generation_s = time.monotonic() - started
        grouped = groups.to_step(cfg.advantage_estimator, self.engine.pad_token_id)
        masked = sum(grouped.masked.values())  # finished, but not measured: neither rollouts nor rollouts_failed
        metrics = self.rollout_metrics(
            step, self.data_position, grouped.rewards, groups.rollouts_expected - masked, generation_s
        )
        metrics.update(
            groups_total=grouped.groups_total,
            groups_zero_variance=grouped.groups_zero_variance,
            groups_incomplete=grouped.groups_incomplete,
            rollouts_masked=masked,
            **{f"rollouts_masked/{kind}": n for kind, n in sorted(grouped.masked.items())},
            **({"sampling_rounds": grouped.sampling_rounds} if cfg.dynamic_sampling else {}),
            **value_stats("advantage", grouped.advantages),
        )
        if grouped.batch is None:
            metrics["trained"] = False
            self._warn_no_group(step, grouped)
        elif cfg.dynamic_sampling and len(groups.kept) < cfg.batch_size:
            print(
                f"ng_train: step {step + 1}: dynamic sampling kept {len(groups.kept)} of {cfg.batch_size} groups in"
                f" {grouped.sampling_rounds} collections ({grouped.groups_zero_variance} of {grouped.groups_total} with"
                " equal rewards); training on them",
                file=sys.stderr,
                flush=True,
            )
        return metrics, grouped.batch

    def _warn_no_group(self, step: int, grouped: GroupedStep) -> None:
        cfg = self.cfg
        if cfg.dynamic_sampling:
            where = f" in {grouped.sampling_rounds} collections"
            advice = (
                f"Raise +trainer.max_sampling_rounds (now {cfg.max_sampling_rounds}), filter the tasks (profile them,"
                " keep 0 < pass_rate < 1) or raise group_size"
            )
        else:
            where = ""
            advice = (
                "Filter the tasks (profile them, keep 0 < pass_rate < 1), raise group_size or refill such steps from"
                " further tasks: +trainer.dynamic_sampling=true"
            )
        print(
            f"ng_train: WARNING step {step + 1}: no group left to train on ({grouped.groups_zero_variance} with equal"
            f" rewards, {grouped.groups_incomplete} with failed or masked rollouts, of {grouped.groups_total}{where});"
            f" no optimizer step. {advice}",
            file=sys.stderr,
            flush=True,
        )

    def state_dict(self) -> dict[str, Any]:
        """The data position the finished steps reached (the loop's `data_position`, which is step * batch_size
        without dynamic sampling)."""
        return {"data_position": self.data_position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """On resume: the data position of the checkpoint."""
        self.data_position = int(state.get("data_position", state["step"] * self.cfg.batch_size))
