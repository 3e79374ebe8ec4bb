"""examples/grpo_loop.py computes the same advantages and loss as the real trainer on the same batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import make_tiny_model  # noqa: E402
from test_train_loop import rollout_row  # noqa: E402

from nemo_gym.train.config import EngineConfig, LossOptions  # noqa: E402
from nemo_gym.train.grpo import build_step  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grpo_loop.py"


def load_example():
    spec = importlib.util.spec_from_file_location("grpo_loop_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def groups_of_rollouts() -> list[list[dict]]:
    """Two varied groups and one zero-variance group; sampler log-probs spread so some TIS weights are capped."""
    generator = torch.Generator().manual_seed(3)
    groups = []
    for task, rewards in enumerate([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0], [0.2, 1.0, 0.0]]):
        group = []
        for i, reward in enumerate(rewards):
            n = 2 + i + task
            generation = torch.randint(4, 500, (n,), generator=generator).tolist()
            log_probs = (-torch.rand(n, generator=generator) * 12).tolist()
            group.append(rollout_row(task, i, [1, 2, 3 + task], generation, log_probs, reward))
        groups.append(group)
    return groups


def test_example_loss_equals_trainer_loss(tmp_path):
    from transformers import AutoModelForCausalLM

    from nemo_gym.train.engine import PolicyEngine

    example = load_example()
    path = make_tiny_model(tmp_path / "m")
    groups = groups_of_rollouts()
    example_batch = example.make_batch(groups)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    example_loss = example.grpo_loss(model, example_batch)

    engine = PolicyEngine(
        EngineConfig(model_path=str(path), micro_batch_size=2),
        LossOptions(clip_eps_low=0.2, clip_eps_high=0.28, tis_cap=2.0),
    )
    step = build_step([r for g in groups for r in g], num_tasks=3, group_size=3, estimator="grpo", pad_token_id=0)
    assert step.groups_zero_variance == 1
    assert torch.allclose(step.batch.advantages, example_batch["advantages"], atol=1e-6)
    metrics = engine.train_step(step.batch)
    assert metrics["tis_fraction_capped"] > 0  # the comparison covers the TIS cap
    assert metrics["loss"] == pytest.approx(example_loss.item(), rel=1e-5, abs=1e-6)
