"""End to end: examples/art_style_train.py trains the embedded SmolLM2 served by vllm_model (vLLM on CPU) with
the ART-style API, then a second run of the script resumes from the model folder's last step.

Run: `.venv/bin/python -m pytest tests/test_art_e2e.py -m e2e -q -s` (minutes: vLLM starts twice).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--groups-per-step",
    "3",
    "--group-size",
    "4",
    "--max-tokens",
    "48",
    "--learning-rate",
    "1e-5",
    "--seed",
    "0",
]  # seeded: reproducible samples


def run_example(path: Path, steps: int, *extra: str) -> str:
    command = [
        sys.executable,
        str(ROOT / "examples" / "art_style_train.py"),
        "--path",
        str(path),
        "--steps",
        str(steps),
        *SMALL,
        *extra,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, (
        f"exit {done.returncode}\nstdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    )
    return done.stdout


def test_example_trains_and_resumes(tmp_path):
    first = run_example(tmp_path, 2)
    assert "at step 0" in first
    folder = tmp_path / "arithmetic" / "models" / "smollm2-arithmetic"
    assert json.loads((folder / "state.json").read_text())["step"] == 2
    second = run_example(tmp_path, 3, "--ruler")
    assert "at step 2" in second  # resumed: the new process serves and trains the step-2 weights
    history = read_jsonl(folder / "history.jsonl")
    assert [row["step"] for row in history] == [1, 2, 3]
    assert all(0.0 <= row["reward_mean"] <= 1.0 for row in history)
    trained = [row for row in history if row["trained"]]
    assert trained, "no step had a group whose rewards varied"
    assert all(row["num_tokens"] > 0 and row["grad_norm"] == row["grad_norm"] for row in trained)  # not NaN
    logged = read_jsonl(folder / "trajectories" / "train" / "000001.jsonl")
    choice = logged[0]["messages_and_choices"][-1]
    assert len(choice["message"]["generation_token_ids"]) == len(choice["message"]["generation_log_probs"]) > 0
    state = json.loads((folder / "state.json").read_text())
    assert state["step"] == 3 and state["checkpoint"] == f"step_{trained[-1]['step']:06d}"  # the last step that trained
    assert [p.name for p in (folder / "checkpoints").iterdir() if p.is_dir()] == [
        state["checkpoint"]
    ]  # keep_checkpoints=1
