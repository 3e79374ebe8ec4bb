"""The main job on real processes: ng_run → ng_collect_rollouts (killed mid-run, resumed) → ng_profile; and the
collector when ng_run is killed under it (it stops, resume completes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter

import httpx
import pytest
from ng_process import BIN, REPO, NgRun

from nemo_gym.collect.command import SERVERS_GONE_EXIT
from nemo_gym.common.jsonl import read_jsonl

pytestmark = pytest.mark.integration
ROWS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
REPEATS = 8


def lines(path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


@pytest.mark.long
def test_collect_kill_resume_profile(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    collect = [
        str(BIN / "ng_collect_rollouts"),
        "+agent_name=weather_agent",
        f"+input_jsonl_fpath={ROWS}",
        f"+output_jsonl_fpath={out}",
        f"+num_repeats={REPEATS}",
        "+num_samples_in_parallel=2",
        "+progress=false",
    ]
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+scripted_delay_s=0.15") as run:
        head = run.wait_ready()
        first = subprocess.Popen(
            [*collect, f"+head_server_url={head}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while len(out.read_text().splitlines()) < 6 if out.exists() else True:
            assert time.monotonic() < deadline and first.poll() is None, "collector ended before it could be killed"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # a crash: no chance to clean up
        first.wait()
        done_before = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in lines(out)}
        assert 0 < len(done_before) < 5 * REPEATS

        second = subprocess.run(
            [*collect, f"+head_server_url={head}"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 0, second.stdout + second.stderr
        rows = lines(out)
        pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)
        assert set(pairs) == {(t, k) for t in range(5) for k in range(REPEATS)}
        assert max(pairs.values()) == 1  # exactly one row per (task, repeat)
        assert all(r["reward"] == 1.0 for r in rows)

        again = subprocess.run(
            [*collect, f"+head_server_url={head}"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert again.returncode == 0 and len(lines(out)) == 5 * REPEATS  # nothing left to do, nothing duplicated

    profile_path = tmp_path / "profile.jsonl"
    profile = subprocess.run(
        [
            str(BIN / "ng_profile"),
            f"+input_jsonl_fpath={ROWS}",
            f"+rollouts_jsonl_fpath={out}",
            f"+output_jsonl_fpath={profile_path}",
            "+pass_threshold=1.0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert profile.returncode == 0, profile.stderr
    profiled = lines(profile_path)
    assert len(profiled) == 5
    assert all(p["avg_reward"] == 1.0 and p["total_samples"] == REPEATS and p["pass_rate"] == 1.0 for p in profiled)


@pytest.mark.long
def test_infrastructure_failures_go_to_the_failures_file(tmp_path):
    """A policy endpoint that fails: every rollout lands in the failures file with its class, none as reward 0."""
    out = tmp_path / "rollouts.jsonl"
    with NgRun(
        "+config_paths=[tests/configs/weather_scripted.yaml]",
        "+skip_venv=true",
        "+policy_model.responses_api_models.scripted_model.error_status=500",
    ) as run:
        head = run.wait_ready()
        result = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                "+agent_name=weather_agent",
                f"+input_jsonl_fpath={ROWS}",
                f"+output_jsonl_fpath={out}",
                "+progress=false",
                f"+head_server_url={head}",
                "+max_retries=0",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert lines(out) == []
    failures = lines(tmp_path / "rollouts_failures.jsonl")
    assert len(failures) == 5
    assert {f["failure_class"] for f in failures} == {"http_error"} and all("500" in f["message"] for f in failures)


@pytest.mark.long
def test_ng_run_killed_mid_collection_stops_the_collector_and_resume_completes(tmp_path):
    """ng_run's process group is SIGKILLed mid-collection (its servers, each in its own group, get SIGTERM
    as their parent dies). The collector stops within seconds, exit 3, with a message naming the head server and
    the agent and saying how to resume; the rollouts done are in the output, the others are no failure records;
    with ng_run started again, the same command completes every (task, repeat) exactly once."""
    repeats, out = 16, tmp_path / "rollouts.jsonl"
    run_args = ("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true", "+scripted_delay_s=0.1")
    collect = [
        str(BIN / "ng_collect_rollouts"),
        "+agent_name=weather_agent",
        f"+input_jsonl_fpath={ROWS}",
        f"+output_jsonl_fpath={out}",
        f"+num_repeats={repeats}",
        "+num_samples_in_parallel=16",
        "+progress=false",
    ]
    with NgRun(*run_args) as run:
        head = run.wait_ready()
        server_pids = [s["pid"] for s in httpx.get(f"{head}/servers", headers=run.headers, timeout=10).json()]
        collector = subprocess.Popen(
            [*collect, f"+head_server_url={head}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while len(lines(out)) < 10:
                assert time.monotonic() < deadline and collector.poll() is None, (
                    "collector ended before ng_run could be killed"
                )
                time.sleep(0.05)
            os.killpg(run.process.pid, signal.SIGKILL)
            killed_s = time.monotonic()
            output = collector.communicate(timeout=60)[0]
            stopped_after_s = time.monotonic() - killed_s
        finally:
            for pid in [collector.pid, *server_pids]:  # whatever is still there (nothing, normally)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            collector.wait()
    print(f"collector stopped {stopped_after_s:.1f} s after ng_run was killed")
    assert collector.returncode == SERVERS_GONE_EXIT, output
    assert stopped_after_s < 10, (
        output
    )  # the head server is probed every second (2 s measured on a loaded 2-core machine)
    assert re.search(
        rf"the servers stopped answering: the head server {re.escape(head)} refuses connections .*agent 'weather_agent'"
        r" \(http://\S+\) refuses connections",
        output,
    ), output
    done = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in lines(out))
    assert 10 <= len(done) < 5 * repeats and max(done.values()) == 1
    assert f"{len(done)} finished rollouts are saved in {out}" in output and "rerun the same command" in output, output
    assert not (tmp_path / "rollouts_failures.jsonl").exists(), (
        "rollouts cut off by the servers' end were recorded as failures"
    )

    with NgRun(*run_args) as run:
        resumed = subprocess.run(
            [*collect, f"+head_server_url={run.wait_ready()}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"Resuming: {len(done)}/{5 * repeats} rollouts already" in resumed.stderr
    pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in lines(out))
    assert set(pairs) == {(t, k) for t in range(5) for k in range(repeats)} and max(pairs.values()) == 1
