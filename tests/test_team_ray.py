"""`ng_serve` on a real Ray cluster: a head (dashboard = Ray Jobs API, token authentication on, no CPUs for runs) and
one worker node started with `ray start`, the server as its own process with `+ray_address=`, two users in two
organizations driving it with the real commands (ng_login, ng_train +remote=true, ng_runs ...).

Each user submits a short training run (a tiny random model; the scripted policy answers every rollout, so no vLLM
is needed) of a project folder that Ray ships to the worker as the job's working directory. Alice follows her
run's log until a step is logged, stops it with save_model and downloads the model; Bob's run trains two steps
and ends on its own. Bob cannot see, follow, stop, delete or download Alice's run (404, as for a run that does
not exist); bad and expired tokens get 401 with the same body; the database holds token hashes only; Ray's job
API refuses a request without Ray's token.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from ng_process import BIN, LAUNCHER_ENV, REPO

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.slow]
ray = pytest.importorskip("ray")
pytest.importorskip("aiohttp")  # ray[default]: the dashboard that serves the Ray Jobs API
pytest.importorskip("deepspeed")

from test_train_engine import make_tiny_model  # noqa: E402

from nemo_gym.cli import main  # noqa: E402
from nemo_gym.team.store import Store, hash_token  # noqa: E402

TRAIN_YAML = (
    (REPO / "tests" / "configs" / "weather_scripted.yaml").read_text()
    + """
trainer:
  input_jsonl_fpath: example.jsonl
  agent_name: weather_agent
  num_steps: NUM_STEPS
  batch_size: 2
  group_size: 2
  engine: {model_path: tiny_model}
  sync_weights: false
  logging: {console: true, tensorboard: false}
"""
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_project(folder: Path, num_steps: int) -> Path:
    """A project folder as a user has it: the config, its data and a (tiny) model."""
    folder.mkdir(parents=True)
    (folder / "train.yaml").write_text(TRAIN_YAML.replace("NUM_STEPS", str(num_steps)))
    (folder / "example.jsonl").write_text(
        (REPO / "resources_servers/example_single_tool_call/data/example.jsonl").read_text()
    )
    make_tiny_model(folder / "tiny_model")
    return folder


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{what} not reached in {timeout_s} s")


def start_cluster(root: Path, env: dict[str, str], dashboard_port: int, attempts: int = 3):
    """A head (no CPUs for runs, the dashboard on) and one worker with 2 CPUs.

    Ray 2.60's raylet aborts when its node's dashboard agent (ray[default]) has not reported its ports within 15 s,
    which a loaded 2-core machine can miss: a node that exits so is started again (a few times)."""
    from ray_cluster import LocalRayCluster

    for attempt in range(attempts):
        cluster = None
        try:
            cluster = LocalRayCluster(root, free_port(), head_cpus=0, dashboard_port=dashboard_port, env=env)
            for retry in range(attempts):
                try:
                    cluster.add_worker(cpus=2)
                    return cluster
                except (RuntimeError, TimeoutError, subprocess.TimeoutExpired):
                    if retry == attempts - 1:
                        raise
                    cluster.workers.pop().stop()
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            if cluster is not None:
                cluster.stop()  # (a head whose start failed has exited: its constructor raised)
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def team_server(tmp_path_factory):
    """Ray head + worker with token auth, and ng_serve attached to them; yields (url, data_dir, cluster, env)."""
    from ray_cluster import NODE_IP

    root = tmp_path_factory.mktemp("team")
    token_file = root / "ray_token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "NEMO_GYM_HOME": str(root / "nodes_home"),
        "OMP_NUM_THREADS": "1",
    }
    launcher = {
        name: os.environ.pop(name) for name in LAUNCHER_ENV if name in os.environ
    }  # a one-rank engine's, if any: not for the runs
    dashboard_port = free_port()
    cluster = start_cluster(root, env, dashboard_port)
    server = None
    try:
        # Ray's own job API: no token, no access
        assert httpx.get(f"http://{NODE_IP}:{dashboard_port}/api/jobs/", timeout=30).status_code == 401
        data_dir = root / "serve"
        log = (root / "ng_serve.log").open("wb")
        server_env = {**os.environ, **env}
        server = subprocess.Popen(
            [
                str(BIN / "ng_serve"),
                f"+ray_address={cluster.address}",
                "+port=0",
                f"+data_dir={data_dir}",
                "+stop_wait_s=120",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env,
            start_new_session=True,
        )
        text = lambda: (root / "ng_serve.log").read_text(errors="replace")  # noqa: E731
        match = wait_for(
            lambda: server.poll() is not None or re.search(r"listening on (http://\S+)", text()),
            120,
            "ng_serve listening",
        )
        assert server.poll() is None, text()
        yield match.group(1), data_dir, cluster
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        cluster.stop()
        os.environ.update(launcher)


def as_user(monkeypatch, root: Path, name: str) -> None:
    """Switch the commands to `name`'s own NEMO_GYM_HOME (their credentials file) and project folder."""
    monkeypatch.setenv("NEMO_GYM_HOME", str(root / f"home_{name}"))
    monkeypatch.chdir(root / f"project_{name}")


def test_two_organizations_train_follow_stop_download_and_stay_apart(team_server, tmp_path, monkeypatch, capsys):
    url, data_dir, _ = team_server
    data = f"+data_dir={data_dir}"
    for org, user in (("acme", "alice"), ("globex", "bob")):
        assert main("serve", ["+admin=create_org", f"+org={org}", data]) == 0
        assert main("serve", ["+admin=create_user", f"+user={user}", f"+org={org}", data]) == 0
    capsys.readouterr()
    tokens = {}
    for user in ("alice", "bob"):
        assert main("serve", ["+admin=create_token", f"+user={user}", "+expires_in_days=1", data]) == 0
        tokens[user] = capsys.readouterr().out.strip().splitlines()[-1]
    stored = {row[0] for row in sqlite3.connect(data_dir / "serve.db").execute("SELECT token_sha256 FROM tokens")}
    assert stored == {hash_token(t) for t in tokens.values()} and not any(
        t.encode() in (data_dir / "serve.db").read_bytes() for t in tokens.values()
    )

    make_project(tmp_path / "project_alice", num_steps=100000)
    make_project(tmp_path / "project_bob", num_steps=2)
    runs = {}
    for user in ("alice", "bob"):
        as_user(monkeypatch, tmp_path, user)
        assert main("login", [f"+server={url}", f"+token={tokens[user]}"]) == 0
        capsys.readouterr()
        assert main("train", ["+remote=true", "+config_paths=[train.yaml]", "+skip_venv=true"]) == 0
        runs[user] = capsys.readouterr().out.strip()

    # isolation: bob sees only his run; alice's answers 404 like a run that does not exist
    as_user(monkeypatch, tmp_path, "bob")
    assert main("runs", ["list", "+json=true"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [runs["bob"]]
    bob = {"Authorization": f"Bearer {tokens['bob']}"}
    for method, suffix in [
        ("GET", ""),
        ("GET", "/logs"),
        ("POST", "/stop"),
        ("DELETE", "?force=true"),
        ("GET", "/model"),
    ]:
        answer = httpx.request(
            method,
            f"{url}/v1/orgs/globex/runs/{runs['alice']}{suffix}",
            headers=bob,
            json={"save_model": True} if method == "POST" else None,
        )
        assert (answer.status_code, answer.json()) == (404, {"detail": "not found"}), (method, suffix)
    assert httpx.get(f"{url}/v1/orgs/acme/runs", headers=bob).status_code == 404
    assert main("runs", ["stop", runs["alice"]]) == 2 and "not found" in capsys.readouterr().err
    unauthorized = [
        httpx.get(f"{url}/v1/orgs/acme/runs", headers={"Authorization": f"Bearer {t}"})
        for t in ("ngt_bad", tokens["alice"][:-2])
    ]
    assert [(a.status_code, a.text) for a in unauthorized] == [(401, '{"detail":"unauthorized"}')] * 2

    # bob follows his run to its end (two steps, then final/)
    assert main("runs", ["logs", runs["bob"], "+follow=true"]) == 0
    followed = capsys.readouterr()
    assert "ng_train" in followed.out and f"run {runs['bob']} finished" in followed.err, followed.out[-3000:]
    assert main("runs", ["download", runs["bob"], f"+output={tmp_path / 'bob_model'}"]) == 0
    assert (tmp_path / "bob_model" / "model.safetensors").is_file()

    # alice waits for a first step, stops with save_model, downloads the model
    as_user(monkeypatch, tmp_path, "alice")
    alice = {"Authorization": f"Bearer {tokens['alice']}"}
    logs_of = lambda: httpx.get(f"{url}/v1/orgs/acme/runs/{runs['alice']}/logs", headers=alice, timeout=30).text  # noqa: E731
    wait_for(lambda: "step 1/" in logs_of() or "Traceback" in logs_of(), 240, "alice's first step")
    assert "Traceback" not in logs_of(), logs_of()[-3000:]
    assert main("runs", ["stop", runs["alice"], "+save_model=true", "+timeout_s=180"]) == 0
    assert "stopped; download its model" in capsys.readouterr().out
    assert "model saved in" in logs_of()
    assert main("runs", ["download", runs["alice"], f"+output={tmp_path / 'alice_model'}"]) == 0
    assert (tmp_path / "alice_model" / "model.safetensors").is_file() and (
        tmp_path / "alice_model" / "config.json"
    ).is_file()
    assert main("status", []) in (0, 1)
    assert "organization acme" in capsys.readouterr().out

    # an expired token: 401, the same body
    expiring, _ = Store(data_dir / "serve.db").create_token("alice", expires_in_s=0.5)
    time.sleep(1.0)
    answer = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {expiring}"})
    assert (answer.status_code, answer.text) == (401, '{"detail":"unauthorized"}')
    for user in ("alice", "bob"):
        as_user(monkeypatch, tmp_path, user)
        assert main("runs", ["delete", runs[user]]) == 0
        assert main("runs", ["list", "+json=true"]) == 0
    capsys.readouterr()
