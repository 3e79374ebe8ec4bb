"""The main job as README's first command runs it, `bash scripts/quickstart.sh`, on the real SmolLM2-135M-Instruct
served by vLLM on CPU: prepare → ng_run → ng_collect_rollouts → ng_profile → ng_train (GRPO on the profile, on the
same servers) → stop.

One run of the script for the module (OUT = a temporary folder); each test reads what it wrote. It runs with
REPEATS=8 (the job's default is 4), MAX_OUTPUT_TOKENS=128 (default 256) and TASKS_PER_GENERATOR=5 (default 25; 25
tasks instead of 105, 200 rollouts, for CI's time): SmolLM2 answers mcqa's ten-option questions right about one time
in eight, and 5 tasks x 4 rollouts would all score 0 one run in twenty (0.87^20); 5 x 8 leaves that at 0.4 %. From an
empty NEMO_GYM_HOME (CI's) the run builds the engine venv, converts the model and builds the server venvs first: the
module's time limit is the run's, not pytest's default per test.
Run: `.venv/bin/python -m pytest tests/test_e2e_main_job.py -m e2e -q`.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from ng_process import LAUNCHER_ENV, REPO

from nemo_gym.common.jsonl import read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3300)]  # the fixture runs the whole job (subprocess timeout 3000 s)
pytest.importorskip("deepspeed")

REPEATS = 8
MAX_OUTPUT_TOKENS = 128
TRAIN_STEPS = 2
TASKS_PER_GENERATOR = 5  # reasoning_gym's four generators


@dataclass
class MainJob:
    out: Path
    stdout: str

    def rows(self, name: str) -> list[dict]:
        return read_jsonl(self.out / name)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> MainJob:
    out = tmp_path_factory.mktemp("quickstart")
    env = {
        k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV
    }  # ng_train must not take itself for a rank of this process
    env |= {
        "OUT": str(out),
        "REPEATS": str(REPEATS),
        "MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
        "TRAIN_STEPS": str(TRAIN_STEPS),
        "TASKS_PER_GENERATOR": str(TASKS_PER_GENERATOR),
    }
    done = subprocess.run(
        ["bash", "scripts/quickstart.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    return MainJob(out, done.stdout)


def model_calls(output: list[dict]) -> list[dict]:
    """The last item of each model call in a trajectory: the item before a tool output or at the end."""
    calls = []
    for index, item in enumerate(output):
        if item.get("type") == "function_call_output":
            continue
        following = output[index + 1] if index + 1 < len(output) else None
        if following is None or following.get("type") == "function_call_output":
            calls.append(item)
    return calls


def test_smollm2_rollouts_carry_training_token_information(main_job):
    tasks = main_job.rows("tasks.jsonl")
    rollouts = main_job.rows("rollouts.jsonl")
    assert len(rollouts) == REPEATS * len(tasks) == REPEATS * (4 * TASKS_PER_GENERATOR + 5)
    assert (
        not (main_job.out / "rollouts_failures.jsonl").exists()
        or not (main_job.out / "rollouts_failures.jsonl").read_text().strip()
    )
    for rollout in rollouts:
        assert 0.0 <= rollout["reward"] <= 1.0
        calls = model_calls(rollout["response"]["output"])
        assert calls
        for item in calls:
            assert item["prompt_token_ids"] and all(isinstance(t, int) for t in item["prompt_token_ids"])
            assert 0 < len(item["generation_token_ids"]) <= MAX_OUTPUT_TOKENS
            assert len(item["generation_log_probs"]) == len(item["generation_token_ids"])
            assert all(lp <= 0.0 for lp in item["generation_log_probs"])
    assert len(main_job.rows("profile.jsonl")) == len(tasks)


def test_real_vllm_rollouts_build_training_sequences(main_job):
    """The trainer's batches from rollouts that vllm_model + simple_agent wrote on SmolLM2: each sequence starts with
    its last model call's prompt ids and trains exactly the generated tokens."""
    from nemo_gym.train.batch import collate, rollout_to_sequence
    from nemo_gym.train.batch import model_calls as trainer_model_calls

    rows = main_job.rows("rollouts.jsonl")[:8]
    sequences = [rollout_to_sequence(row) for row in rows]
    for row, sequence in zip(rows, sequences):
        call = trainer_model_calls(row)[-1]
        assert sequence.input_ids[: len(call.prompt_token_ids)] == call.prompt_token_ids
        assert sequence.num_generated_tokens == len(call.generation_token_ids)
    batch = collate(sequences, [0.0] * len(sequences))
    assert batch.num_generated_tokens == sum(s.num_generated_tokens for s in sequences)


def test_every_environment_shows_a_learnable_signal(main_job):
    """mcqa used to score 0 on every rollout (SmolLM2 never wrote the box its strict grading reads)."""
    rollouts = main_job.rows("rollouts.jsonl")
    mcqa = [r for r in rollouts if r["agent_ref"]["name"] == "mcqa_simple_agent"]
    reasoning = [r for r in rollouts if r["agent_ref"]["name"] == "reasoning_gym_simple_agent"]
    assert len(mcqa) == 5 * REPEATS
    # NeMo Gym's grading, untouched: strict boxed letter, credit only for the gold letter
    assert {r["grading_mode"] for r in mcqa} == {"strict_single_letter_boxed"}
    assert all(r["reward"] == float(r["extracted_answer"] == r["expected_answer"]) for r in mcqa)
    answered = [r for r in mcqa if r["extracted_answer"] is not None]
    assert len(answered) >= len(mcqa) / 2, (
        f"SmolLM2 answered inside \\boxed{{}} in {len(answered)} of {len(mcqa)} mcqa rollouts"
    )
    for name, rows in (("mcqa", mcqa), ("reasoning_gym", reasoning)):
        rewards = [r["reward"] for r in rows]
        assert 0.0 < sum(rewards) / len(rewards) < 1.0, f"{name}: mean reward {sum(rewards) / len(rewards)}"
    assert re.search(r"agent:mcqa_simple_agent: mean reward 0\.\d*[1-9]", main_job.stdout), main_job.stdout[-3000:]


def test_the_main_job_trains_on_its_profile(main_job):
    """The main job ends with GRPO steps on the profiled tasks, and every step trains (dynamic sampling refills
    the groups with equal rewards)."""
    train = main_job.out / "train"
    steps = read_jsonl(train / "metrics.jsonl")
    assert [m["step"] for m in steps] == list(range(1, TRAIN_STEPS + 1))
    assert all(
        m["rollouts"] == m["groups_total"] * 6 and m["groups_total"] >= 2 and m["rollouts_failed"] == 0 for m in steps
    ), steps
    assert all(m["trained"] for m in steps), (
        "a step had no group with varying rewards, even after dynamic sampling's refills"
    )
    for step in range(1, TRAIN_STEPS + 1):
        tasks = read_jsonl(train / f"rollouts/step_{step:06d}_tasks.jsonl")
        assert len(tasks) == 2 and all(0.0 < task["pass_rate"] < 1.0 for task in tasks), (
            tasks
        )  # profiled rows, filtered
    assert (train / "final/model.safetensors").is_file() and (train / "final/config.json").is_file()
    # what a newcomer reads: each step's metrics, where the trained model is, and the time of each stage
    assert re.search(rf"^step 1/{TRAIN_STEPS}\s+reward ", main_job.stdout, re.M), main_job.stdout[-3000:]
    assert f"Trained model: {train / 'final'}" in main_job.stdout
    assert re.search(
        r"Main job done in \d+ s \(install \d+s prepare \d+s servers \d+s collection \d+s profile \d+s training \d+s\)",
        main_job.stdout,
    )
