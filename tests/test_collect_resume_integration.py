"""The main job on real processes: ng_run → ng_collect_rollouts (killed mid-run, resumed) → ng_profile."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import pytest

from ng_process import BIN, REPO, NgRun
from nemo_gym.jsonl import read_jsonl

pytestmark = pytest.mark.integration
ROWS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
REPEATS = 8


def lines(path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


@pytest.mark.long
def test_collect_kill_resume_profile(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    collect = [str(BIN / "ng_collect_rollouts"), "+agent_name=weather_agent", f"+input_jsonl_fpath={ROWS}", f"+output_jsonl_fpath={out}",
               f"+num_repeats={REPEATS}", "+num_samples_in_parallel=2", "+progress=false"]
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+scripted_delay_s=0.15") as run:
        head = run.wait_ready()
        first = subprocess.Popen([*collect, f"+head_server_url={head}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while len(out.read_text().splitlines()) < 6 if out.exists() else True:
            assert time.monotonic() < deadline and first.poll() is None, "collector ended before it could be killed"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # a crash: no chance to clean up
        first.wait()
        done_before = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in lines(out)}
        assert 0 < len(done_before) < 5 * REPEATS

        second = subprocess.run([*collect, f"+head_server_url={head}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stdout + second.stderr
        rows = lines(out)
        pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)
        assert set(pairs) == {(t, k) for t in range(5) for k in range(REPEATS)}
        assert max(pairs.values()) == 1  # exactly one row per (task, repeat)
        assert all(r["reward"] == 1.0 for r in rows)

        again = subprocess.run([*collect, f"+head_server_url={head}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and len(lines(out)) == 5 * REPEATS  # nothing left to do, nothing duplicated

    profile_path = tmp_path / "profile.jsonl"
    profile = subprocess.run([str(BIN / "ng_profile"), f"+input_jsonl_fpath={ROWS}", f"+rollouts_jsonl_fpath={out}",
                              f"+output_jsonl_fpath={profile_path}", "+pass_threshold=1.0"], capture_output=True, text=True, timeout=120)
    assert profile.returncode == 0, profile.stderr
    profiled = lines(profile_path)
    assert len(profiled) == 5
    assert all(p["avg_reward"] == 1.0 and p["total_samples"] == REPEATS and p["pass_rate"] == 1.0 for p in profiled)


def test_infrastructure_failures_go_to_the_failures_file(tmp_path):
    """A policy endpoint that fails: every rollout lands in the failures file with its class, none as reward 0."""
    out = tmp_path / "rollouts.jsonl"
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true",
               "+policy_model.responses_api_models.scripted_model.error_status=500") as run:
        head = run.wait_ready()
        result = subprocess.run([str(BIN / "ng_collect_rollouts"), "+agent_name=weather_agent", f"+input_jsonl_fpath={ROWS}",
                                 f"+output_jsonl_fpath={out}", "+progress=false", f"+head_server_url={head}", "+max_retries=0"],
                                capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert lines(out) == []
    failures = lines(tmp_path / "rollouts_failures.jsonl")
    assert len(failures) == 5
    assert {f["failure_class"] for f in failures} == {"http_error"} and all("500" in f["message"] for f in failures)
