"""The GRPO recipe's pieces (nemo_gym.train.loop, nemo_gym.train.grpo, nemo_gym.train.gym_connection) and a tiny model
that learns a trivially learnable reward.

The learning test runs the trainer's own path (rollout rows with token information → `build_step` → grouping,
zero-variance drop, advantages → `PolicyEngine.train_step`) with sampling done locally by the tiny model
instead of vLLM, so it is fast and offline.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import make_tiny_model  # noqa: E402

from nemo_gym.train.config import EngineConfig, LossOptions, TaskFilter  # noqa: E402
from nemo_gym.train.grpo import build_step  # noqa: E402
from nemo_gym.train.gym_connection import filter_tasks  # noqa: E402
from nemo_gym.train.loop import TaskSampler  # noqa: E402

PROMPT = [1, 2, 3]
TARGET_IDS = 128  # reward: the share of generated tokens with id < 128 (a quarter of the 512 ids at random)


def rollout_row(
    task: int, index: int, prompt: list[int], generation: list[int], log_probs: list[float], reward: float
) -> dict:
    item = {
        "type": "message",
        "role": "assistant",
        "content": [],
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": log_probs,
    }
    return {"_ng_task_index": task, "_ng_rollout_index": index, "response": {"output": [item]}, "reward": reward}


def test_task_sampler_is_a_function_of_seed_and_step():
    sampler = TaskSampler(num_tasks=5, batch_size=3, seed=7)
    first_epochs = [i for step in range(5) for i in sampler.batch(step)]  # 15 positions = 3 epochs
    assert sorted(first_epochs[:5]) == sorted(first_epochs[5:10]) == list(range(5))  # each epoch a permutation
    assert TaskSampler(5, 3, 7).batch(3) == sampler.batch(3)  # a resumed run takes the same batch
    assert TaskSampler(5, 3, 8).batch(0) != sampler.batch(0) or TaskSampler(5, 3, 8).batch(1) != sampler.batch(1)


def test_filter_on_profile_fields():
    rows = [
        {"pass_rate": 0.0, "std_reward": 0.0},
        {"pass_rate": 0.5, "std_reward": 0.5},
        {"pass_rate": 1.0, "std_reward": 0.0},
        {},
    ]
    kept = filter_tasks(rows, TaskFilter(min_pass_rate=0.01, max_pass_rate=0.99))
    assert kept == [rows[1], rows[3]]
    assert filter_tasks(rows, TaskFilter(min_std_reward=1e-6)) == [rows[1], rows[3]]


def test_build_step_drops_zero_variance_and_incomplete_groups():
    rows = []
    for task, rewards in enumerate([[1.0, 0.0], [1.0, 1.0], [0.0]]):  # varied, zero-variance, incomplete (a failure)
        rows += [rollout_row(task, i, [1, 2], [5 + i], [-0.5], r) for i, r in enumerate(rewards)]
    step = build_step(rows, num_tasks=3, group_size=2, estimator="grpo", pad_token_id=0)
    assert (step.groups_total, step.groups_zero_variance, step.groups_incomplete) == (3, 1, 1)
    assert step.batch is not None and len(step.batch) == 2
    assert step.batch.advantages[0] > 0 > step.batch.advantages[1]
    nothing = build_step(rows[2:4], num_tasks=3, group_size=2, estimator="grpo", pad_token_id=0)
    assert nothing.batch is None and nothing.groups_zero_variance == 1


def sample_group(model, num: int, length: int, generator: torch.Generator) -> tuple[list[list[int]], list[list[float]]]:
    """`num` samples of `length` tokens after PROMPT at temperature 1, with their log-probs (the sampler's)."""
    ids = torch.tensor([PROMPT] * num)
    log_probs = []
    with torch.no_grad():
        for _ in range(length):
            logits = model(input_ids=ids).logits[:, -1].float()
            next_ids = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            log_probs.append(torch.log_softmax(logits, -1).gather(1, next_ids))
            ids = torch.cat([ids, next_ids], dim=1)
    return ids[:, len(PROMPT) :].tolist(), torch.cat(log_probs, dim=1).tolist()


def sampled_rollouts(model, num_tasks: int, num_repeats: int, step: int) -> list[dict]:
    """Rollout rows of `num_tasks` tasks x `num_repeats` generations of 4 tokens sampled from `model` (seeded by
    `step`), rewarded with the share of tokens below TARGET_IDS: what a test trainer's `collect` returns."""
    generator = torch.Generator().manual_seed(step)
    rows = []
    for task in range(num_tasks):
        generations, log_probs = sample_group(model, num_repeats, 4, generator)
        rows += [
            rollout_row(task, i, PROMPT, g, lp, sum(t < TARGET_IDS for t in g) / 4)
            for i, (g, lp) in enumerate(zip(generations, log_probs))
        ]
    return rows


def test_tiny_model_learns_a_trivial_reward(tmp_path):
    from nemo_gym.train.engine import PolicyEngine

    engine = PolicyEngine(
        EngineConfig(
            model_path=str(make_tiny_model(tmp_path / "m", seed=1)), learning_rate=2e-2, micro_batch_size=16, seed=0
        ),
        LossOptions(),
        total_steps=8,
    )
    generator = torch.Generator().manual_seed(0)
    num_tasks, group_size, length = 4, 8, 6
    mean_rewards = []
    for _ in range(8):
        engine.module.eval()
        rows = []
        for task in range(num_tasks):
            generations, log_probs = sample_group(engine.module, group_size, length, generator)
            for i, (generation, lp) in enumerate(zip(generations, log_probs)):
                reward = sum(t < TARGET_IDS for t in generation) / length
                rows.append(rollout_row(task, i, PROMPT, generation, lp, reward))
        mean_rewards.append(sum(r["reward"] for r in rows) / len(rows))
        step = build_step(rows, num_tasks, group_size, "grpo", engine.pad_token_id)
        metrics = engine.train_step(step.batch)
        assert metrics["rollout_logprob_abs_diff_max"] < 1e-4  # trainer and sampler agree before the step
    # seen: [0.27, 0.34, 0.30, 0.51, 0.61, 0.69, 0.85, 0.91]
    assert mean_rewards[0] < 0.45
    assert sum(mean_rewards[-2:]) / 2 > mean_rewards[0] + 0.25, mean_rewards
