"""The training project templates (`ng_init +template=sft | posttrain | off-distill | on-distill`): each is made into a
project with `nemo_gym.scaffold.projects.init_project`; its configs load from the project folder and validate
(trainer section and algorithm), its bundled data is what its make_data.py writes and reads as its mode needs.
The e2e test runs each project's README commands with the real SmolLM2 for 2 steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.scaffold.projects import find_template, init_project
from nemo_gym.train.config import TrainerConfig, check_algorithm

TRAIN_TEMPLATES = {
    "sft": ["config.yaml"],
    "posttrain": ["config.yaml"],
    "off-distill": ["config.yaml", "train.yaml"],
    "on-distill": ["config.yaml"],
}
BIN = Path(sys.executable).parent


def project_name(template: str) -> str:
    return template.replace("-", "_") + "_project"


def trainer_of(project: Path, config: str, *overrides: str) -> TrainerConfig:
    cwd = os.getcwd()
    os.chdir(project)  # the README runs every command from the project folder
    try:
        values = load_config([f"+config_paths=[{config}]", *overrides]).values
    finally:
        os.chdir(cwd)
    return TrainerConfig.model_validate(values["trainer"])


@pytest.mark.parametrize("template", list(TRAIN_TEMPLATES))
def test_train_template_makes_a_valid_project(template: str, tmp_path: Path) -> None:
    from nemo_gym.train.supervised import read_documents, row_conversation

    assert find_template(template).kind == "train"
    project = init_project(template, project_name(template), tmp_path)
    readme = (project / "README.md").read_text()
    assert readme.startswith(f"# {project_name(template)}\n") and "$" not in readme.replace("$PWD", "")
    data = {p.name: p.read_bytes() for p in (project / "data").iterdir()}
    subprocess.run([sys.executable, "make_data.py"], cwd=project, check=True, timeout=60)
    assert {p.name: p.read_bytes() for p in (project / "data").iterdir()} == data  # deterministic, and what ships
    for config in TRAIN_TEMPLATES[template]:
        assert f'"+config_paths=[{config}]"' in readme, config
    trainers = [
        trainer_of(project, c) for c in TRAIN_TEMPLATES[template] if c != "config.yaml" or template != "off-distill"
    ]
    for trainer in trainers:
        assert trainer.engine.model_path == "embedded:smollm2" and check_algorithm(trainer) == []
    algorithm = trainers[0].algorithm
    assert (
        algorithm == {"sft": "sft", "posttrain": "pretrain", "off-distill": "sft", "on-distill": "on_distill"}[template]
    )
    if template == "sft":
        rows = read_jsonl(project / "data" / "train.jsonl")
        with_tools = [row_conversation(r) for r in rows if "tools" in r]
        assert len(rows) == 48 and len(with_tools) == 12 and all(m[1]["tool_calls"] for m, _ in with_tools)
    if template == "posttrain":
        assert len(read_documents(project / "data" / "train.jsonl")) == 40
    if template in ("off-distill", "on-distill"):
        rows = read_jsonl(project / "data" / "tasks.jsonl")
        assert len(rows) == 32 and all(r["responses_create_params"]["input"] and r["expected_answer"] for r in rows)
    if template == "on-distill":
        assert trainers[0].teacher is not None and trainers[0].teacher.instance == "teacher_model"


# -- end to end with SmolLM2 ------------------------------------------------------------------------------------
def ng(command: str, project: Path, *args: str, timeout_s: float = 1500) -> subprocess.CompletedProcess[str]:
    from ng_process import clean_env

    done = subprocess.run(
        [str(BIN / command), *args], cwd=project, capture_output=True, text=True, timeout=timeout_s, env=clean_env()
    )
    assert done.returncode == 0, f"{command} {' '.join(args)}:\n{(done.stdout + done.stderr)[-4000:]}"
    return done


def metrics_of(project: Path) -> list[dict]:
    return read_jsonl(project / "results" / "train" / "metrics.jsonl")


def assert_servable_final(project: Path) -> None:
    final = project / "results" / "train" / "final"
    assert (
        (final / "config.json").is_file()
        and (final / "model.safetensors").is_file()
        and (final / "tokenizer.json").is_file()
    )


SHORT = (
    "+trainer.num_steps=2",
    "++trainer.batch_size=4",
    "++trainer.engine.micro_batch_size=4",
    "++trainer.checkpoint_interval=0",
    "++trainer.logging.console=false",
)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("template", list(TRAIN_TEMPLATES))
def test_train_template_runs_two_steps_with_smollm2(template: str, tmp_path: Path) -> None:
    from ng_process import NgRun

    project = init_project(template, project_name(template), tmp_path)
    if template in ("sft", "posttrain"):
        ng("ng_train", project, "+config_paths=[config.yaml]", *SHORT, "++trainer.eval.interval=2")
        rows = metrics_of(project)
        evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
        assert [r["step"] for r in rows if r.get("trained")] == [1, 2] and len(evals) == 2 and evals[1] < evals[0], rows
    elif template == "off-distill":
        with NgRun(
            f"+config_paths=[{project / 'config.yaml'}]", timeout_s=1800
        ) as run:  # step 1: the teacher's rollouts
            head = run.wait_ready()
            ng(
                "ng_collect_rollouts",
                project,
                "+agent_name=string_match_simple_agent",
                "+input_jsonl_fpath=data/tasks.jsonl",
                "+limit=4",
                "+output_jsonl_fpath=results/teacher_rollouts.jsonl",
                "+num_repeats=2",
                f"+head_server_url={head}",
                "+progress=false",
                "+responses_create_params={temperature: 0.7, max_output_tokens: 32}",
            )
        assert len((project / "results" / "teacher_rollouts.jsonl").read_text().splitlines()) == 8
        ng("ng_train", project, "+config_paths=[train.yaml]", *SHORT)  # step 2: SFT of the student on them
        rows = metrics_of(project)
        assert [r["step"] for r in rows] == [1, 2] and all(r.get("trained") and r["loss"] > 0 for r in rows), rows
    else:
        ng(
            "ng_train",
            project,
            "+config_paths=[config.yaml]",
            "+trainer.num_steps=2",
            "++trainer.batch_size=2",
            "++trainer.group_size=2",
            "++trainer.eval.interval=0",
            "++trainer.checkpoint_interval=0",
            "++trainer.responses_create_params.max_output_tokens=16",
            "++trainer.logging.console=false",
            timeout_s=2400,
        )
        rows = metrics_of(project)
        assert [r["step"] for r in rows] == [1, 2] and all(r.get("trained") for r in rows), rows
        # the teacher is the student's own initial weights: step 1's KL is only the vLLM/trainer-free sampling noise
        assert abs(rows[0]["teacher_kl_mean"]) < 0.05 and "time_teacher_s" in rows[0], rows
    assert_servable_final(project)
