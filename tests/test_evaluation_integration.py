"""ng_eval on real processes: ng_run (weather environment, scripted policy) → ng_eval collects 5 tasks x 4 samples."""

from __future__ import annotations

import json
import subprocess

import pytest
from ng_process import BIN, REPO, NgRun

from nemo_gym.common.jsonl import read_jsonl

pytestmark = pytest.mark.integration
ROWS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"


@pytest.mark.long
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
        command = [
            str(BIN / "ng_eval"),
            "+agent_name=weather_agent",
            f"+input_jsonl_fpath={tasks_path}",
            f"+output_json_fpath={report_path}",
            "+num_samples=4",
            "+k=[1,2,4]",
            "+temperature=0.7",
            "+max_output_tokens=64",
            "+max_turns=3",
            "+progress=false",
            f"+head_server_url={head}",
        ]
        first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        again = subprocess.run(
            command, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )  # resumes: nothing to collect
        assert again.returncode == 0, again.stdout + again.stderr

    rollouts = read_jsonl(rollouts_path)
    assert len(rollouts) == 5 * 4
    assert all(
        r["responses_create_params"]["temperature"] == 0.7 and r["responses_create_params"]["max_output_tokens"] == 64
        for r in rollouts
    )
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


@pytest.mark.long
def test_ng_eval_compares_two_rollout_files(tmp_path):
    """`ng_eval +from_rollouts=after +baseline_rollouts=before` as a command, on NeMo Gym's example_single_tool_call
    rollouts before/after (tests/test_evaluation.py::peer_before_after): both side by side, the difference and its
    interval in the table and the JSON report."""
    from test_evaluation import PEER_SINGLE_TOOL_CALL, peer_before_after

    if not PEER_SINGLE_TOOL_CALL.is_file():
        pytest.skip("NeMo Gym peer data not found (../shared/peer_data)")
    before, after = peer_before_after(tmp_path)
    report_path = tmp_path / "compare.json"
    command = [
        str(BIN / "ng_eval"),
        f"+from_rollouts={after}",
        f"+baseline_rollouts={before}",
        f"+output_json_fpath={report_path}",
        "+bootstrap_resamples=2000",
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    paired = json.loads(report_path.read_text())["comparison"]["paired"]
    # tasks 0-3 in both: baseline rewards [0, 0, 1, 1], candidate [1, 1, 1, 1]: pass@1 0.5 -> 1.0; task 4 baseline only
    assert (
        paired["overall"]["baseline"]["pass@1"],
        paired["overall"]["candidate"]["pass@1"],
        paired["overall"]["difference"]["pass@1"],
    ) == (0.5, 1.0, 0.5)
    assert paired["mean_reward_difference"]["mean"] == 0.5 and paired["mean_reward_difference"]["resamples"] == 2000
    low, high = paired["mean_reward_difference"]["ci95"]
    out = result.stdout
    assert (
        "baseline vs candidate on the 4 tasks scored in both" in out
        and f"95 % bootstrap interval [{low:+.4f}, {high:+.4f}]" in out
    )
    assert "Tasks scored in one file only (not compared): baseline 1, candidate 0." in out


@pytest.mark.long
def test_ng_eval_collects_two_policies_and_compares(tmp_path):
    """`ng_eval +agent_name=... +baseline_agent_name=...`: two policies in one ng_run, each behind its own agent, the
    same 5 tasks x 2 samples through both; the baseline's policy never calls get_weather (reward 0), the candidate's
    always does (reward 1)."""
    report_path = tmp_path / "compare.json"
    with NgRun(
        "+config_paths=[tests/configs/weather_scripted.yaml,tests/configs/weather_two_policies.yaml]", "+skip_venv=true"
    ) as run:
        head = run.wait_ready()
        command = [
            str(BIN / "ng_eval"),
            "+agent_name=weather_agent",
            "+baseline_agent_name=weather_agent_before",
            f"+input_jsonl_fpath={ROWS}",
            f"+output_json_fpath={report_path}",
            "+num_samples=2",
            "+progress=false",
            f"+head_server_url={head}",
        ]
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    baseline_rollouts = tmp_path / "compare_baseline_rollouts.jsonl"
    rows = [json.loads(line) for line in baseline_rollouts.read_text().splitlines()]
    assert (
        len(rows) == 10
        and {r["agent_ref"]["name"] for r in rows} == {"weather_agent_before"}
        and {r["reward"] for r in rows} == {0.0}
    )
    report = json.loads(report_path.read_text())
    assert report["comparison"]["baseline_agent_name"] == "weather_agent_before"
    paired = report["comparison"]["paired"]
    # keyed by _ng_task_index (one input file): 5 tasks in both; pass@1 0 -> 1; every per-task delta is +1
    assert paired["num_tasks"] == 5 and paired["overall"]["difference"]["pass@1"] == 1.0
    assert paired["mean_reward_difference"]["ci95"] == [1.0, 1.0] and paired["mean_reward_difference"]["improved"] == 5
    assert (
        paired["overall"]["baseline"]["tool_calls_per_sample"] == 0.0
        and paired["overall"]["candidate"]["tool_calls_per_sample"] == 1.0
    )
    assert "+1.0000" in result.stdout
