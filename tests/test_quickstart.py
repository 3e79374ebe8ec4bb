"""The main job's inputs, offline (the run itself is tests/test_e2e_main_job.py):
the task file of scripts/quickstart_tasks.py and the training stage's config, configs/train/main_job_grpo.yaml."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances
from nemo_gym.train.config import TrainerConfig
from nemo_gym.train.gym_connection import filter_tasks
from resources_servers.mcqa.app import MCQARequest, extract_answer

REPO = Path(__file__).resolve().parents[1]
MCQA_ROWS = read_jsonl(REPO / "resources_servers/mcqa/data/example.jsonl")


@pytest.fixture(scope="module")
def quickstart_tasks():
    spec = importlib.util.spec_from_file_location("quickstart_tasks", REPO / "scripts/quickstart_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_main_job_mcqa_rows_are_nemo_gym_rows_after_one_worked_example(quickstart_tasks):
    rows = quickstart_tasks.main_job_tasks(REPO / "data/quickstart/reasoning_gym_tasks.jsonl")
    assert len(rows) == 105
    assert {r["agent_ref"]["name"] for r in rows[:100]} == {"reasoning_gym_simple_agent"}
    mcqa = rows[100:]
    assert {r["agent_ref"]["name"] for r in mcqa} == {"mcqa_simple_agent"}
    for row, original in zip(mcqa, MCQA_ROWS, strict=True):
        # everything the grader reads is NeMo Gym's: options, gold letter, grading mode
        assert {k: v for k, v in row.items() if k not in ("responses_create_params", "agent_ref")} == {
            k: v for k, v in original.items() if k != "responses_create_params"
        }
        example, question = row["responses_create_params"]["input"][:2], row["responses_create_params"]["input"][2:]
        assert question == original["responses_create_params"]["input"]
        assert [m["role"] for m in example] == ["user", "assistant"]
        assert example[0]["content"].startswith(quickstart_tasks.MCQA_INSTRUCTION) and original[
            "responses_create_params"
        ]["input"][0]["content"].startswith(quickstart_tasks.MCQA_INSTRUCTION)


def test_the_worked_example_answers_in_the_format_strict_grading_reads(quickstart_tasks):
    """The example's answer is what mcqa's default mode credits for its question; the grading stays strict: a wrong
    letter in the box, the right letter outside one, or options listed back (what SmolLM2 wrote before) read as no
    credit.
    """
    task = MCQARequest(
        responses_create_params={},
        response={},
        options=[{"A": "Oxygen"}, {"B": "Carbon dioxide"}, {"C": "Nitrogen"}, {"D": "Helium"}],
        expected_answer="B",
    )
    assert quickstart_tasks.MCQA_EXAMPLE[0].endswith("A: Oxygen\nB: Carbon dioxide\nC: Nitrogen\nD: Helium")
    assert extract_answer(quickstart_tasks.MCQA_EXAMPLE[1], task, "strict_single_letter_boxed") == "B"
    assert extract_answer("\\boxed{A}", task, "strict_single_letter_boxed") == "A"
    assert extract_answer("B", task, "strict_single_letter_boxed") is None
    assert extract_answer("B: Carbon dioxide\nC: Nitrogen", task, "strict_single_letter_boxed") is None


def test_main_job_training_config_attaches_to_the_main_job_servers_and_keeps_0_lt_pass_rate_lt_1():
    train = load_config(["+config_paths=[configs/train/main_job_grpo.yaml]"], cwd=REPO)
    quickstart = load_config(["+config_paths=[configs/quickstart.yaml]"], cwd=REPO)
    assert {i.name for i in server_instances(train)} == {i.name for i in server_instances(quickstart)}
    cfg = TrainerConfig.model_validate(train.values["trainer"])
    assert (
        cfg.input_jsonl_fpath == "results/quickstart/profile.jsonl"
        and cfg.agent_name is None
        and cfg.algorithm == "grpo"
    )
    assert cfg.num_steps == 2 and cfg.eval.interval == 0
    assert cfg.dynamic_sampling and cfg.max_sampling_rounds > 1  # every step trains: equal-reward groups are refilled
    rows = [{"pass_rate": rate} for rate in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert [r["pass_rate"] for r in filter_tasks(rows, cfg.filter)] == [0.25, 0.5, 0.75]


def test_quickstart_script_ends_with_training_on_its_profile():
    script = (REPO / "scripts/quickstart.sh").read_text()
    train = next(line for line in script.splitlines() if line.startswith(".venv/bin/ng_train"))
    assert "configs/train/main_job_grpo.yaml" in train and "+trainer.head_server_url=$HEAD_URL" in train
    assert script.index("ng_profile") < script.index(".venv/bin/ng_train") < script.index("kill -INT $NG_RUN_PID; wait")
