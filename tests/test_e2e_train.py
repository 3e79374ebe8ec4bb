"""End to end: `ng_train` trains the embedded SmolLM2 through a real `ng_run` (vllm_model on vLLM-CPU, simple_agent,
reasoning_gym), evaluates, checkpoints, syncs weights to vLLM and resumes.

One `ng_run` of configs/train/quickstart_grpo.yaml's servers; two `ng_train` processes attach to it
(`+trainer.head_server_url`), as a user would:
1. two steps with an evaluation before and after each, a checkpoint every step, TensorBoard on: every step
   is logged with its time split; a trained step's rollouts were sampled by vLLM with the weights the
   trainer holds (|Δ log-prob| small, the TIS ratio ~1) and its weights were pushed back (`time_sync_s`);
2. `+trainer.resume=true` with num_steps 3: continues at step 3 from the step-2 checkpoint, exactly the
   batch the uninterrupted run would have taken (the tasks file of step 3 equals the sampler's choice);
3. the final model folder is the policy of a fresh `ng_run` (`+policy_model...vllm_model.model=<final>`): rollouts
   collected through it carry log-probs equal to those the trainer computes from that folder (< 1e-3).
The tasks are reasoning_gym spell_backward (partial credit per letter), so a group's rewards almost always
vary and a step has something to train on.
Run: `.venv/bin/python -m pytest tests/test_e2e_train.py -m e2e -q -s`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import NgRun

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "+config_paths=[configs/train/quickstart_grpo.yaml]"


def ng_train(head_url: str, out: Path, tasks: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).parent / "ng_train"),
        CONFIG,
        f"++trainer.head_server_url={head_url}",
        f"++trainer.output_dir={out}",
        f"++trainer.input_jsonl_fpath={tasks}",
        "++trainer.batch_size=2",
        "++trainer.group_size=4",
        "++trainer.responses_create_params.max_output_tokens=24",
        "++trainer.eval.interval=1",
        "++trainer.eval.limit=2",
        "++trainer.eval.num_repeats=2",
        "++trainer.eval.responses_create_params.max_output_tokens=24",
        "++trainer.checkpoint_interval=1",
        "++trainer.engine.micro_batch_size=8",
        *overrides,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)


def test_ng_train_runs_evaluates_syncs_and_resumes(tmp_path):
    rows = read_jsonl(ROOT / "data/quickstart/reasoning_gym_tasks.jsonl")
    tasks = tmp_path / "spell_backward.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows if r["dataset"] == "spell_backward"))
    out = tmp_path / "train"
    with NgRun(CONFIG, timeout_s=1500) as run:
        head_url = run.wait_ready()
        first = ng_train(head_url, out, tasks, "++trainer.num_steps=2")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        resumed = ng_train(head_url, out, tasks, "++trainer.num_steps=3", "++trainer.resume=true")
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    lines = read_jsonl(out / "metrics.jsonl")
    steps = [m for m in lines if "time_generation_s" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["rollouts"] == 8 and m["rollouts_failed"] == 0 for m in steps)
    evals = [m for m in lines if "eval_reward_mean" in m]
    assert [m["step"] for m in evals][:3] == [0, 1, 2] and all(m["eval_rollouts"] == 4 for m in evals)
    trained = [m for m in steps if m["trained"]]
    assert trained, "no step had a group with varying rewards"
    for m in trained:
        # vLLM sampled with exactly the weights the trainer holds (initial, or synced after the previous step)
        assert m["rollout_logprob_abs_diff_max"] < 1e-3, m
        assert m["time_sync_s"] > 0 and m["grad_norm"] > 0 and m["num_tokens"] > 0
    # step 3 of the resumed run took the batch the uninterrupted run would have taken: the sampler's choice
    from nemo_gym.train.loop import TaskSampler

    sampler = TaskSampler(len(rows) // 4, 2, seed=0)
    taken = [
        json.loads(line)["question"] for line in (out / "rollouts/step_000003_tasks.jsonl").read_text().splitlines()
    ]
    expected = [json.loads(tasks.read_text().splitlines()[i])["question"] for i in sampler.batch(2)]
    assert taken == expected
    assert (out / "checkpoints/latest_step").read_text().strip() == "step_000003"
    assert (out / "final/model.safetensors").is_file() and (out / "final/config.json").is_file()
    assert any((out / "tensorboard").iterdir())
    assert_final_model_is_servable(out / "final", tasks, tmp_path)


def assert_final_model_is_servable(final: Path, tasks: Path, tmp_path: Path) -> None:
    """A fresh ng_run serves `final` as its policy; the served log-probs are the trainer's on that folder."""
    from nemo_gym.train.batch import collate, rollout_to_sequence
    from nemo_gym.train.config import EngineConfig, LossOptions
    from nemo_gym.train.engine import PolicyEngine

    rollouts = tmp_path / "final_rollouts.jsonl"
    served = f"++policy_model.responses_api_models.vllm_model.model={final}"
    with NgRun(CONFIG, served, timeout_s=1500) as run:
        head_url = run.wait_ready()
        collect = subprocess.run(
            [
                str(Path(sys.executable).parent / "ng_collect_rollouts"),
                f"+head_server_url={head_url}",
                f"+input_jsonl_fpath={tasks}",
                f"+output_jsonl_fpath={rollouts}",
                "+agent_name=reasoning_gym_simple_agent",
                "+limit=2",
                "+num_repeats=1",
                "+responses_create_params={temperature: 1.0, max_output_tokens: 24}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    rows = read_jsonl(rollouts)
    assert len(rows) == 2
    assert all(row["response"]["model"] == str(final) for row in rows), (
        "the fresh ng_run did not serve the final folder"
    )
    engine = PolicyEngine(EngineConfig(model_path=str(final), dtype="float32", micro_batch_size=1), LossOptions())
    for row in rows:
        batch = collate([rollout_to_sequence(row)], [0.0])
        mask = batch.loss_mask[0].bool()
        diff = (engine.logprobs(batch)[0][mask] - batch.rollout_logprobs[0][mask]).abs().max()
        assert float(diff) < 1e-3, f"served log-probs differ from final/'s by {float(diff):.2e}"
