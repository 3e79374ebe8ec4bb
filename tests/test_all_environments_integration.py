"""Every environment at once under one ng_run (the scripted policy instead of SmolLM2), one collection with an
agent_ref per row: no failures, one rollout per row, rewards in each environment's range."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from ng_process import BIN, REPO, NgRun

from nemo_gym.common.jsonl import read_jsonl

pytestmark = pytest.mark.integration


@pytest.mark.long
@pytest.mark.slow
def test_all_environments_under_one_run(tmp_path):
    paths = yaml.safe_load((REPO / "configs/all_environments.yaml").read_text())["config_paths"]
    paths = [p for p in paths if "responses_api_models/" not in p] + ["tests/configs/scripted_policy_and_judge.yaml"]
    out = tmp_path / "rollouts.jsonl"
    rows = (REPO / "data/all_environments/examples.jsonl").read_text().splitlines()
    with NgRun(f"+config_paths=[{','.join(paths)}]", timeout_s=900) as run:
        head = run.wait_ready()
        result = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+head_server_url={head}",
                f"+input_jsonl_fpath={REPO / 'data/all_environments/examples.jsonl'}",
                f"+output_jsonl_fpath={out}",
                "+num_samples_in_parallel=8",
                "+progress=false",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    rollouts = read_jsonl(out)
    assert sorted(r["_ng_task_index"] for r in rollouts) == list(range(len(rows)))
    assert {r["agent_ref"]["name"] for r in rollouts} == {json.loads(line)["agent_ref"]["name"] for line in rows}
    assert all(-1.0 <= r["reward"] <= 1.0 for r in rollouts)
