"""ng_eval on real processes: ng_run (weather environment, scripted policy) → ng_eval collects 5 tasks x 4 samples."""

from __future__ import annotations

import json
import subprocess

import pytest

from ng_process import BIN, REPO, NgRun
from nemo_gym.jsonl import read_jsonl

pytestmark = pytest.mark.integration
ROWS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"


def test_ng_eval_collects_and_reports(tmp_path):
    # The scripted policy calls get_weather whenever the request offers tools (reward 1) and answers with text
    # otherwise (reward 0): tasks 1 and 3 lose their tools, so 3 of 5 tasks pass every sample.
    tasks = []
    for index, line in enumerate(ROWS.read_text().splitlines()):
        row = json.loads(line)
        if index in (1, 3):
            row["responses_create_params"].pop("tools")
        tasks.append(row)
    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    report_path, rollouts_path = tmp_path / "eval.json", tmp_path / "eval_rollouts.jsonl"
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true") as run:
        head = run.wait_ready()
        command = [str(BIN / "ng_eval"), "+agent_name=weather_agent", f"+input_jsonl_fpath={tasks_path}", f"+output_json_fpath={report_path}",
                   "+num_samples=4", "+k=[1,2,4]", "+temperature=0.7", "+max_output_tokens=64", "+max_turns=3", "+progress=false",
                   f"+head_server_url={head}"]
        first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)  # resumes: nothing to collect
        assert again.returncode == 0, again.stdout + again.stderr

    rollouts = read_jsonl(rollouts_path)
    assert len(rollouts) == 5 * 4
    assert all(r["responses_create_params"]["temperature"] == 0.7 and r["responses_create_params"]["max_output_tokens"] == 64 for r in rollouts)
    report = json.loads(report_path.read_text())
    # per task c = 4 or 0 of n = 4: pass@k = pass^k = 3/5 for every k; mean reward = 12 / 20
    overall = report["overall"]
    assert (overall["num_tasks"], overall["num_samples"], overall["num_tasks_excluded"]) == (5, 20, 0)
    for k in (1, 2, 4):
        assert overall[f"pass@{k}"] == pytest.approx(0.6) and overall[f"pass^{k}"] == pytest.approx(0.6)
    assert report["environments"]["weather_agent"] == overall
    assert report["max_turns"] == {"requested": 3, "applied": False}
    assert "max_turns=3 is not applied" in first.stderr
    assert "20/20" in first.stdout and "0 this run" in again.stdout  # the collector's summary; the rerun resumed
    table = first.stdout
    for text in ("weather_agent", "overall", "pass@4", "pass^4", "0.6000", str(report_path)):
        assert text in table
