"""Crash-safe collection: SIGKILL a process of the collection at a random point, restart
what died, rerun the same `ng_collect_rollouts` command: every (task, repeat) has exactly one row or one
terminal failure record; 0 lost, 0 duplicated. Also: a torn last line is repaired, and resume refuses an
output made from another input or config.

Real processes throughout: `ng_run` of the weather environment with the scripted policy (`+skip_venv=true`),
the collector as the `ng_collect_rollouts` command. Kill points are drawn from a seeded RNG (the trial's
seed is in the test id), so a failing trial can be rerun alone.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from chaos import chaos_helpers
from chaos.chaos_helpers import assert_exactly_once, read_rows, side_file
from ng_process import REPO, NgRun

from nemo_gym.collect.command import SERVERS_GONE_EXIT

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

ROWS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
NUM_TASKS, REPEATS = 5, 6
ALL_PAIRS = {(t, r) for t in range(NUM_TASKS) for r in range(REPEATS)}
RUN_ARGS = (
    "+config_paths=[tests/configs/weather_scripted.yaml]",
    "+skip_venv=true",
    "+stop_grace_s=2",
    "+scripted_delay_s=0.03",
)
SERVERS = {"agent": "weather_agent", "resources": "weather", "model": "policy_model"}
TRIALS = {"collector": 2, "agent": 2, "resources": 2, "model": 2, "ng_run": 2}


def collect_command(out: Path, head_url: str, *extra: str, rows: Path = ROWS, repeats: int = REPEATS) -> list[str]:
    return chaos_helpers.collect_command(out, head_url, *extra, rows=rows, repeats=repeats, concurrency=4)


class Cluster:
    """One `ng_run` at a time, restarted when it died; remembers every server PID it saw so that the servers of
    a killed `ng_run` are gone (SIGKILL by PID) before the next one starts."""

    def __init__(self):
        self.run: NgRun | None = None
        self.pids: dict[str, int] = {}

    def ensure(self) -> NgRun:
        if self.run is not None and self.run.process.poll() is None:
            return self.run
        self.close()
        self.run = NgRun(*RUN_ARGS, timeout_s=240).__enter__()
        self.run.wait_ready()
        servers = httpx.get(f"{self.run.head_url}/servers", headers=self.run.headers, timeout=10).json()
        self.pids = {s["name"]: s["pid"] for s in servers}
        return self.run

    def kill_orphans(self) -> None:
        for pid in self.pids.values():
            try:
                os.killpg(pid, signal.SIGKILL)  # each server leads its own process group
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.run is not None:
            self.run.__exit__(None, None, None)
            self.run = None
        self.kill_orphans()


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.close()


def wait_for_rows(out: Path, at_least: int, collector: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(read_rows(out)) < at_least:
        if collector.poll() is not None:
            return  # finished before the kill point: the trial still checks resume of a complete output
        assert time.monotonic() < deadline, f"no {at_least} rows after {timeout_s} s"
        time.sleep(0.02)


def kill(target: str, cluster: Cluster, collector: subprocess.Popen, rng: random.Random) -> None:
    if target == "collector":
        collector.send_signal(signal.SIGKILL)
    elif target == "ng_run":
        cluster.run.process.send_signal(signal.SIGKILL)  # the servers get SIGTERM from Linux and stop, or...
        time.sleep(rng.uniform(0.0, 0.5))
        cluster.kill_orphans()  # ...die too before they are done (an OOM killer, a node going down)
    else:
        os.kill(cluster.pids[SERVERS[target]], signal.SIGKILL)
        assert cluster.run.wait_exit(60) == 1  # ng_run notices, stops the other servers and exits


def tear_last_line(out: Path, rng: random.Random) -> None:
    """Append the first part of a real row without its newline, as a crash in the middle of a write leaves it."""
    rows = out.read_bytes().splitlines(keepends=True) if out.exists() else []
    whole = rows[0] if rows else b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n'
    with out.open("ab") as f:
        f.write(whole[: rng.randint(1, len(whole) - 2)])


@pytest.mark.parametrize(("target", "trial"), [(t, i) for t, n in TRIALS.items() for i in range(n)])
def test_sigkill_then_resume_is_exactly_once(cluster, tmp_path, target, trial):
    rng = random.Random(f"{target}-{trial}")
    out = tmp_path / "rollouts.jsonl"
    head = cluster.ensure().head_url
    # retries would only slow the first run down once everything is dead; the resume uses the defaults
    collector = subprocess.Popen(
        collect_command(out, head, "+max_retries=0"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_rows(out, rng.randint(1, len(ALL_PAIRS) // 2), collector)
        time.sleep(rng.uniform(0.0, 0.2))
        kill(target, cluster, collector, rng)
        first_output = collector.communicate(timeout=180)[0].decode(errors="replace")
    finally:
        if collector.poll() is None:
            os.killpg(collector.pid, signal.SIGKILL)
            collector.wait()
    assert collector.returncode in (0, 1, SERVERS_GONE_EXIT, -signal.SIGKILL), first_output
    if target != "collector":  # the collector ended on its own: its files are consistent (no pair both done and failed)
        # exit 3: it stopped because the servers were gone: the pairs it did not finish are in neither file
        assert_exactly_once(out, ALL_PAIRS, allow_missing=collector.returncode == SERVERS_GONE_EXIT)
    done_before = len(read_rows(out))
    torn = rng.random() < 0.5
    if torn:
        tear_last_line(out, rng)

    resumed = subprocess.run(
        collect_command(out, cluster.ensure().head_url), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, f"first run:\n{first_output}\nresume:\n{resumed.stdout}{resumed.stderr}"
    rows, _ = assert_exactly_once(out, ALL_PAIRS, allow_failures=False)
    assert all(r["reward"] == 1.0 for r in rows.values())
    assert not side_file(out, "failures.jsonl").exists()
    if torn:
        assert "Dropped an incomplete last line" in resumed.stderr
    assert f"{done_before}/{len(ALL_PAIRS)} rollouts already" in resumed.stderr or done_before == 0


def test_resume_refuses_a_changed_input_or_config(cluster, tmp_path):
    """An output collected from one input is never extended by another: changed rows, num_repeats or
    responses_create_params each stop the command (exit 2) with a message saying what differs."""
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(ROWS.read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "rollouts.jsonl"
    head = cluster.ensure().head_url

    def collect(*extra: str, repeats: int = 2) -> subprocess.CompletedProcess:
        command = collect_command(out, head, *extra, rows=rows, repeats=repeats)
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    first = collect()
    assert first.returncode == 0, first.stdout + first.stderr
    before = out.read_bytes()
    changed = {
        "num_repeats was 2, now 3": lambda: collect(repeats=3),
        "the task rows differ": lambda: collect("+responses_create_params={temperature: 0.5}"),
    }
    for expected, run in changed.items():
        refused = run()
        assert refused.returncode == 2 and expected in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    rows.write_text("".join(ROWS.read_text().splitlines(keepends=True)[1:3]))  # other rows, same count
    refused = collect()
    assert refused.returncode == 2 and "different input" in refused.stdout + refused.stderr, (
        refused.stdout + refused.stderr
    )
    assert out.read_bytes() == before  # nothing appended by a refused resume
