"""Trainer resume is exact: the real GRPO loop (`TrainingLoop` with the GRPO recipe, rollouts sampled from a tiny model
in-process by
`train_distributed_worker.LocalTrainer`, no servers) stopped after its step-2 checkpoint and resumed with
`+trainer.resume=true` ends with the same weights, optimizer state, data order and metrics as one uninterrupted run.

Every step's sampling generator is seeded by the step, so a difference can only come from the restored state:
the engine (weights, AdamW moments, LR schedule, step), the task sampler position, the RNG states.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import make_tiny_model  # noqa: E402
from train_distributed_worker import LocalTrainer, loop_config, write_tasks  # noqa: E402

from nemo_gym.train.stopping import run_stoppable  # noqa: E402


def run(model: Path, out: Path, num_steps: int, *, resume: bool = False) -> LocalTrainer:
    cfg = loop_config(model, out).model_copy(update={"num_steps": num_steps, "resume": resume})
    trainer = LocalTrainer(cfg, [])
    assert run_stoppable(trainer) == 0
    return trainer


def metrics(out: Path) -> list[dict]:
    keep = ("step", "reward_mean", "trained", "loss", "grad_norm", "num_tokens", "learning_rate")
    return [{k: row.get(k) for k in keep} for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.long
@pytest.mark.integration
def test_stopped_and_resumed_run_ends_like_an_uninterrupted_one(tmp_path):
    model = make_tiny_model(tmp_path / "tiny" / "model", seed=3)
    write_tasks(model)
    whole = run(model, tmp_path / "whole", 3)

    run(model, tmp_path / "parts", 2)
    resumed = run(model, tmp_path / "parts", 3, resume=True)
    assert resumed.step == 3
    assert (tmp_path / "parts" / "checkpoints" / "latest_step").read_text() == "step_000003"

    assert any(row["trained"] for row in metrics(tmp_path / "whole"))
    assert metrics(tmp_path / "parts") == metrics(
        tmp_path / "whole"
    )  # steps 1-2, then 3 after the resume: same data, same numbers
    for (name, a), (_, b) in zip(
        whole.engine.module.named_parameters(), resumed.engine.module.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    state_a, state_b = whole.engine.optimizer.state_dict()["state"], resumed.engine.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(state_a[index][key]), torch.as_tensor(state_b[index][key])), (index, key)
    assert whole.engine.scheduler.get_last_lr() == resumed.engine.scheduler.get_last_lr()
