"""ng_run with real processes on loopback: start, status, stop, and the bad-input errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from ng_process import BIN, REPO, NgRun, clean_env, wait_for_output

from nemo_gym.serving.auth import TOKEN_HEADER
from nemo_gym.serving.head import live_runs, run_token_for_url, runs_dir

pytestmark = pytest.mark.integration
CONFIG = "+config_paths=[tests/configs/weather_scripted.yaml]"


def auth(head_url: str) -> dict[str, str]:
    """The run's token header, from the token file ng_run wrote for the user's tools."""
    token = run_token_for_url(head_url)
    assert token, f"no token file for the run at {head_url}"
    return {TOKEN_HEADER: token}


def server_pids(head_url: str) -> list[int]:
    return [s["pid"] for s in httpx.get(f"{head_url}/servers", headers=auth(head_url)).json()]


def processes_holding(token: str) -> list[int]:
    """PIDs whose environment (/proc/<pid>/environ, as the process started) holds `token`; unreadable ones skipped."""
    needle = token.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def processes_in_groups(groups: set[int]) -> list[int]:
    """Live (not zombie) PIDs whose process group is one of `groups`."""
    left = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) in groups and process.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return left


class RunProcesses:
    """What identifies the processes of a live run: its token and its process groups (ng_run's and each server's)."""

    def __init__(self, run: NgRun):
        head = run.head_url or run.wait_ready()
        self.token = auth(head)[TOKEN_HEADER]
        self.server_pids = server_pids(head)
        self.groups = {run.process.pid, *self.server_pids}  # ng_run leads its session; each server its own group
        assert set(processes_holding(self.token)) == set(
            self.server_pids
        )  # each server got the token, ng_run's tools did not

    def left_after_stop(self, wait_s: float = 5.0) -> tuple[list[int], list[int]]:
        """(PIDs still holding the token, PIDs still in the run's process groups), after at most `wait_s`."""
        deadline = time.monotonic() + wait_s
        while True:
            left = processes_holding(self.token), processes_in_groups(self.groups)
            if left == ([], []) or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


@pytest.mark.long
def test_start_status_rollout_and_clean_stop():
    with NgRun(CONFIG, "+policy_api_key=sk-secret-value") as run:
        head = run.wait_ready()
        servers = httpx.get(f"{head}/servers", headers=auth(head)).json()
        assert {s["name"] for s in servers} == {"weather", "weather_agent", "policy_model"}
        assert all(s["url"].startswith("http://127.0.0.1:") for s in servers)
        # the head server answers addresses only: no config value, no secret, on any route
        for path in ["/servers", "/servers/policy_model", "/health", "/openapi.json"]:
            assert "sk-secret-value" not in httpx.get(f"{head}{path}", headers=auth(head)).text
        status = subprocess.run(
            [str(BIN / "ng_status"), "+json=true", f"+head_server_url={head}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        listed = json.loads(status.stdout)[0]["servers"]
        assert {s["name"]: s["health"] for s in listed} == {
            "weather": "ok",
            "weather_agent": "ok",
            "policy_model": "ok",
        }
        assert all(s["pid"] and s["port"] and s["uptime_s"] >= 0 for s in listed)
        agent = next(s["url"] for s in servers if s["name"] == "weather_agent")
        row = json.loads(
            (REPO / "resources_servers/example_single_tool_call/data/example.jsonl").read_text().splitlines()[0]
        )
        answer = httpx.post(f"{agent}/run", json=row, headers=auth(head), timeout=60).json()
        assert answer["reward"] == 1.0 and answer["stop_reason"] == "completed"
        processes = RunProcesses(run)
        assert run.stop() == 0  # SIGINT
    assert processes.left_after_stop() == ([], [])


@pytest.mark.long
def test_servers_refuse_calls_without_the_run_token():
    with NgRun(CONFIG, "+skip_venv=true") as run:
        head = run.wait_ready()
        token = auth(head)[TOKEN_HEADER]
        state = next(r for r in live_runs() if r["head_url"] == head)
        token_file = runs_dir() / state["run_id"] / "token"
        assert (
            stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        )
        servers = httpx.get(f"{head}/servers", headers=auth(head)).json()
        for url in [head, *(s["url"] for s in servers)]:
            assert httpx.get(f"{url}/health").status_code == 200  # liveness stays open
            for path in ["/readyz", "/healthz", "/livez", "/"]:  # NeMo Gym 0.7.0's probes: the run is ready
                assert httpx.get(f"{url}{path}").json()["status"] == "ok", (url, path)
            for path in ["/servers", "/openapi.json", "/tools", "/v1/models"]:
                assert httpx.get(f"{url}{path}").status_code == 401, (url, path)
                assert httpx.get(f"{url}{path}", headers={TOKEN_HEADER: "not-the-token"}).status_code == 401
        agent = next(s["url"] for s in servers if s["name"] == "weather_agent")
        row = json.loads(
            (REPO / "resources_servers/example_single_tool_call/data/example.jsonl").read_text().splitlines()[0]
        )
        assert httpx.post(f"{agent}/run", json=row, timeout=60).status_code == 401
        assert (
            httpx.post(f"{agent}/run", json=row, headers={"Authorization": f"Bearer {token}"}, timeout=60).json()[
                "reward"
            ]
            == 1.0
        )
        for pid in [
            run.process.pid,
            *(s["pid"] for s in servers),
        ]:  # never on a command line (`ps` shows those to every user)
            assert token not in " ".join(psutil.Process(pid).cmdline())
        processes = RunProcesses(run)
        run.process.send_signal(signal.SIGTERM)
        assert run.wait_exit(60) == 0
    assert processes.left_after_stop() == ([], [])
    assert not token_file.exists()
    assert token not in run.output() and not [
        p for p in (token_file.parent / "logs").iterdir() if token in p.read_text(errors="replace")
    ]


@pytest.mark.long
def test_allow_unauthenticated_serves_without_a_token():
    with NgRun(CONFIG, "+skip_venv=true", "+allow_unauthenticated=true") as run:
        head = run.wait_ready()
        assert run_token_for_url(head) is None
        servers = httpx.get(f"{head}/servers").json()
        assert all(httpx.get(f"{s['url']}/openapi.json").status_code == 200 for s in servers)


@pytest.mark.long
def test_uses_a_uv_environment_per_requirements_set():
    with NgRun(CONFIG) as run:
        run.wait_ready()
        pids = server_pids(run.head_url)
        executables = {psutil.Process(pid).cmdline()[0] for pid in pids}
        assert len(executables) == 1  # the three servers share one requirements set, so one environment
        venv = Path(executables.pop()).parent.parent
        assert venv != Path(sys.executable).parent.parent and (venv / ".ready").is_file()
        assert "preparing 1 environment" in run.output().lower()


@pytest.mark.long
def test_port_already_taken_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with NgRun(
            CONFIG, "+skip_venv=true", f"+weather.resources_servers.example_single_tool_call.port={port}"
        ) as run:
            assert run.wait_exit(120) == 1
            output = run.output()
    assert "server 'weather'" in output and f"cannot bind 127.0.0.1:{port}" in output


@pytest.mark.long
def test_server_crashing_at_start_is_named_with_its_log_and_run_stops():
    with NgRun(CONFIG, "+skip_venv=true", "+policy_model.responses_api_models.scripted_model.temprature=0.5") as run:
        assert run.wait_exit(120) == 1
        output = run.output()
    assert "server 'policy_model' (responses_api_models/scripted_model) exited with code 2" in output
    assert "Last log lines" in output and "temprature" in output and "is not a field of ScriptedModel" in output


@pytest.mark.long
def test_server_dying_while_running_stops_the_run():
    with NgRun(CONFIG, "+skip_venv=true") as run:
        head = run.wait_ready()
        victim = next(
            s["pid"] for s in httpx.get(f"{head}/servers", headers=auth(head)).json() if s["name"] == "weather"
        )
        processes = RunProcesses(run)
        psutil.Process(victim).kill()
        assert run.wait_exit(60) == 1
        output = run.output()
    assert "server 'weather'" in output and "died while running" in output
    assert processes.left_after_stop() == ([], [])


@pytest.mark.long
def test_sigkill_of_ng_run_leaves_no_server_behind():
    """ng_run cannot clean up after SIGKILL: Linux sends its servers SIGTERM (parent-death signal) and they stop."""
    with NgRun(CONFIG, "+skip_venv=true") as run:
        run.wait_ready()
        processes = RunProcesses(run)
        run.process.kill()
        run.process.wait(10)
        assert processes.left_after_stop(wait_s=30) == ([], [])


@pytest.mark.long
def test_sigkill_of_ng_train_stops_the_ng_run_it_started(tmp_path):
    """ng_train starts ng_run (its config's servers) as a child in its own session; after a SIGKILL of ng_train's
    process group that ng_run gets SIGTERM from Linux and stops every server of the run."""
    from test_train_engine import make_tiny_model

    out = tmp_path / "train"
    command = [
        str(BIN / "ng_train"),
        CONFIG,
        "+skip_venv=true",
        "+scripted_delay_s=600",  # the first rollout waits: ng_train is mid-step
        f"+trainer.output_dir={out}",
        "+trainer.agent_name=weather_agent",
        f"+trainer.engine.model_path={make_tiny_model(tmp_path / 'tiny')}",
        f"+trainer.input_jsonl_fpath={REPO / 'resources_servers/example_single_tool_call/data/example.jsonl'}",
        "+trainer.sync_weights=false",
    ]
    with (tmp_path / "ng_train.log").open("w") as log:
        train = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=clean_env()
        )
    try:
        wait_for_output(out / "ng_run.log", "servers ready", train, "ng_train", timeout_s=180)
        ng_run = next(p for p in psutil.Process(train.pid).children() if "main('run')" in " ".join(p.cmdline()))
        servers = ng_run.children()
        assert len(servers) == 3, servers
        os.killpg(train.pid, signal.SIGKILL)
        train.wait(10)
        gone, alive = psutil.wait_procs([ng_run, *servers], timeout=60)
        assert not alive, f"still running 60 s after ng_train's SIGKILL: {[p.cmdline() for p in alive]}"
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)


@pytest.mark.long
def test_config_errors_exit_2_before_starting_anything(tmp_path):
    result = subprocess.run(
        [
            str(BIN / "ng_run"),
            "+config_paths=[tests/configs/weather_scripted.yaml]",
            "+weather_agent.responses_api_agents.simple_agent.resources_server.name=wether",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refers to server instance 'wether'" in result.stderr and "did you mean 'weather'" in result.stderr
