"""Replicas of a server (`num_replicas`): the head server's registry, the client's sticky and balanced routing,
failover when a replica dies, and ng_run + ng_collect_rollouts over two agent and two environment replicas."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from live_servers import serve
from ng_process import BIN, REPO, NgRun

from nemo_gym.common.errors import ConfigError, ServerUnavailableError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import LoadedConfig
from nemo_gym.config.server_instances import server_instances
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import build_head_app, run_token_headers, runs_dir
from nemo_gym.serving.replicas import rendezvous_weight
from nemo_gym.serving.retry_policy import ClientTimeouts

FAST = ClientTimeouts(connect_s=1.0, read_s=5.0, max_retries=2, backoff_s=0.01)
COUNTER = "resources_servers/example_session_state_mgmt"


def registration(name: str, replica: int, url: str, pid: int = 1) -> dict:
    return {
        "name": name,
        "server_type": "resources_servers",
        "implementation": "x",
        "url": url,
        "pid": pid,
        "replica": replica,
    }


def key_on(replica: int, replicas: int, prefix: str = "s") -> str:
    """A session id that rendezvous hashing puts on `replica` of `replicas`."""
    return next(
        f"{prefix}{i}"
        for i in range(10_000)
        if max(range(replicas), key=lambda r: rendezvous_weight(f"session:{prefix}{i}", r)) == replica
    )


# -- head server registry -------------------------------------------------------------------------------
def test_head_keeps_every_replica_and_reregistering_replaces_its_address():
    with TestClient(build_head_app()) as head:
        assert head.post("/register", json=registration("env", 1, "http://127.0.0.1:9001")).status_code == 200
        assert head.get("/servers/env").json()["replica"] == 1  # the only one so far
        assert head.post("/register", json=registration("env", 0, "http://127.0.0.1:9000")).status_code == 200
        head.post(
            "/register",
            json={k: v for k, v in registration("agent", 0, "http://127.0.0.1:9100").items() if k != "replica"},
        )
        listed = head.get("/servers").json()
        assert [(s["name"], s["replica"], s["url"]) for s in listed] == [
            ("env", 0, "http://127.0.0.1:9000"),
            ("env", 1, "http://127.0.0.1:9001"),
            ("agent", 0, "http://127.0.0.1:9100"),
        ]
        # a restarted replica 1 (new port, new pid) replaces its entry; it does not add one
        head.post("/register", json=registration("env", 1, "http://127.0.0.1:9901", pid=2))
        listed = head.get("/servers").json()
        assert [(s["replica"], s["url"], s["pid"]) for s in listed if s["name"] == "env"] == [
            (0, "http://127.0.0.1:9000", 1),
            (1, "http://127.0.0.1:9901", 2),
        ]
        one = head.get("/servers/env").json()
        assert one["replica"] == 0 and one["url"] == "http://127.0.0.1:9000"
        assert one["replicas"] == [
            {"replica": 0, "url": "http://127.0.0.1:9000"},
            {"replica": 1, "url": "http://127.0.0.1:9901"},
        ]
        assert head.get("/servers/agent").json()["replicas"] == [{"replica": 0, "url": "http://127.0.0.1:9100"}]
        assert head.post("/register", json=registration("env", -1, "http://x:1")).status_code == 422


def test_head_registry_accepts_direct_assignment_as_replica_0():
    app = build_head_app()
    app.state.servers["agent"] = {"name": "agent", "url": "http://127.0.0.1:1"}  # as older tests do
    app.state.servers["agent"] = {"name": "agent", "url": "http://127.0.0.1:2"}
    with TestClient(app) as head:
        assert head.get("/servers").json() == [{"name": "agent", "url": "http://127.0.0.1:2", "replica": 0}]
        assert head.get("/servers/agent").json()["url"] == "http://127.0.0.1:2"


# -- client routing -------------------------------------------------------------------------------------
def replica_app(index: int) -> FastAPI:
    """A server that answers which replica it is and counts the calls it got."""
    app = FastAPI()
    app.state.calls = 0

    @app.post("/who")
    async def who(request: Request) -> dict:
        app.state.calls += 1
        return {"replica": index, "session": request.headers.get("x-session-id")}

    @app.get("/who")
    async def who_get() -> dict:
        app.state.calls += 1
        return {"replica": index}

    return app


@contextmanager
def replica_servers(count: int) -> Iterator[tuple[list[FastAPI], list[str]]]:
    apps = [replica_app(i) for i in range(count)]
    with ExitStack() as stack:
        yield apps, [stack.enter_context(serve(app)) for app in apps]


def test_same_session_same_replica_and_sessions_spread():
    with replica_servers(3) as (apps, urls):

        async def main():
            async with ServerClient(addresses={"s": urls}, timeouts=FAST) as client:
                for session in ["a", "b", "c", "d"]:
                    seen = {(await client.post("s", "/who", {}, session_id=session))["replica"] for _ in range(10)}
                    assert len(seen) == 1 and seen == {
                        max(range(3), key=lambda r: rendezvous_weight(f"session:{session}", r))
                    }
                jar = httpx.Cookies()  # no session id: the per-rollout jar is the key
                assert len({(await client.post("s", "/who", {}, cookies=jar))["replica"] for _ in range(10)}) == 1
                spread = Counter(
                    [(await client.post("s", "/who", {}, session_id=f"rollout-{i}"))["replica"] for i in range(60)]
                )
                assert set(spread) == {0, 1, 2} and min(spread.values()) >= 10  # about 20 each
                stats = client.replica_stats("s")
                assert [s["calls"] for s in stats] == [app.state.calls for app in apps] and not any(
                    s["failures"] for s in stats
                )

        asyncio.run(main())


def test_calls_without_a_key_are_balanced():
    with replica_servers(2) as (apps, urls):

        async def main():
            async with ServerClient(addresses={"s": urls}, timeouts=FAST) as client:
                for _ in range(10):  # one at a time: in turn
                    await client.get("s", "/who")
                assert [app.state.calls for app in apps] == [5, 5]
                await asyncio.gather(*(client.post("s", "/who", {}) for _ in range(40)))  # concurrent: fewest in flight
                assert all(app.state.calls >= 15 for app in apps)
                assert await client.server_url("s") == urls[0] and await client.replica_urls("s") == {
                    0: urls[0],
                    1: urls[1],
                }

        asyncio.run(main())


def dead_url() -> tuple[str, object]:
    """A loopback address that refuses connections (bound, not listening), and the socket to keep it so."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sock


def test_a_replica_refusing_connections_is_skipped_until_its_cooldown_ends():
    down, sock = dead_url()
    with sock, replica_servers(1) as (apps, (up,)):

        async def main():
            async with ServerClient(addresses={"s": [up, down]}, timeouts=FAST, replica_cooldown_s=1.0) as client:
                answers = [await client.post("s", "/who", {}) for _ in range(10)]
                assert all(a["replica"] == 0 for a in answers) and apps[0].state.calls == 10
                stats = client.replica_stats("s")
                assert (
                    stats[1]["calls"] == 1 and stats[1]["failures"] == 1 and stats[1]["down"]
                )  # one try, then skipped
                assert client.retries_used == 1  # the failover, at once
                with pytest.raises(ServerUnavailableError):  # a session living on the dead replica does not move
                    await client.post("s", "/who", {}, session_id=key_on(1, 2))
                assert apps[0].state.calls == 10
                await asyncio.sleep(1.1)  # cool-down over: tried again (and down again)
                await client.post("s", "/who", {})
                await client.post("s", "/who", {})
                assert client.replica_stats("s")[1]["calls"] == 1 + (1 + FAST.max_retries) + 1

        asyncio.run(main())


def test_a_restarted_replica_is_found_at_its_new_address_through_the_head():
    """A session's replica dies and comes back on another port: its next call re-reads the head server and
    reaches the new process (the sticky key maps to the replica index, not to an address)."""
    head_app = build_head_app()
    session = key_on(1, 2)
    with serve(head_app) as head_url, replica_servers(1) as (_, (url_0,)), ExitStack() as first_life:
        old_app = replica_app(1)
        head_app.state.servers["s"] = registration("s", 0, url_0)
        head_app.state.servers["s"] = registration("s", 1, first_life.enter_context(serve(old_app)))

        async def main():
            timeouts = ClientTimeouts(connect_s=1.0, read_s=5.0, max_retries=3, backoff_s=0.2)
            async with ServerClient(head_url, timeouts=timeouts) as client:
                assert (await client.post("s", "/who", {}, session_id=session))[
                    "replica"
                ] == 1 and old_app.state.calls == 1
                first_life.close()  # replica 1 dies: its port refuses connections
                new_app = replica_app(1)
                with serve(new_app) as new_url:
                    head_app.state.servers["s"] = registration("s", 1, new_url)  # ... restarts and registers again
                    assert (await client.post("s", "/who", {}, session_id=session))["replica"] == 1
                    assert new_app.state.calls == 1 and (await client.replica_urls("s")) == {0: url_0, 1: new_url}
                    assert client.replica_stats("s")[1]["failures"] == 1

        asyncio.run(main())


# -- config -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_replicas": 0}, "must be an integer >= 1"),
        ({"num_replicas": "2"}, "must be an integer >= 1"),
        ({"num_replicas": 2, "port": 8123}, "cannot share the fixed port 8123"),
    ],
)
def test_bad_num_replicas_is_a_config_error(fields, message):
    loaded = LoadedConfig(
        {"env": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py", **fields}}}}
    )
    with pytest.raises(ConfigError, match=message) as info:
        server_instances(loaded)
    assert "env.resources_servers.example_session_state_mgmt.num_replicas" in str(info.value)


def test_num_replicas_default_and_value():
    loaded = LoadedConfig(
        {
            "env": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py", "num_replicas": 3}}},
            "one": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py"}}},
        }
    )
    assert [i.num_replicas for i in server_instances(loaded)] == [3, 1]


# -- real processes -------------------------------------------------------------------------------------
class ServerProcesses:
    """Replicas of one instance as real `python -m nemo_gym.serving.entrypoint` processes registered with a head server
    (what ng_run starts, without its monitor, which would stop everything when one dies)."""

    def __init__(self, run_dir: Path, head_url: str, name: str, folder: str):
        server_type, implementation = folder.split("/")
        self.run_dir, self.head_url, self.name, self.folder = run_dir, head_url, name, REPO / folder
        spec = {
            "name": name,
            "server_type": server_type,
            "implementation": implementation,
            "fields": {"entrypoint": "app.py"},
            "source": "test",
        }
        (run_dir / "instances.json").write_text(json.dumps({name: spec}))
        self.processes: dict[int, subprocess.Popen] = {}

    def start(self, replica: int) -> subprocess.Popen:
        env = {
            **os.environ,
            "NEMO_GYM_RUN_DIR": str(self.run_dir),
            "NEMO_GYM_INSTANCE": self.name,
            "NEMO_GYM_REPLICA": str(replica),
            "NEMO_GYM_HEAD_URL": self.head_url,
        }
        env.pop("NEMO_GYM_RUN_TOKEN", None)
        with (self.run_dir / f"{self.name}.{replica}.log").open("ab") as log:
            self.processes[replica] = subprocess.Popen(
                [sys.executable, "-m", "nemo_gym.serving.entrypoint"],
                cwd=self.folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.processes[replica]

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(30)


def wait_registered(head_url: str, name: str, pids: dict[int, int], timeout_s: float = 60) -> dict[int, str]:
    """`{replica: url}` once the head server lists replica i of `name` with pid `pids[i]`, for every i."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = {s["replica"]: s for s in httpx.get(f"{head_url}/servers").json() if s["name"] == name}
        if all(i in listed and listed[i]["pid"] == pid for i, pid in pids.items()):
            return {i: listed[i]["url"] for i in pids}
        time.sleep(0.1)
    raise TimeoutError(f"replicas {pids} of {name} not registered")


def row(initial: int) -> dict:
    return {"responses_create_params": {"input": "count"}, "initial_count": initial, "expected_count": initial + 2}


@pytest.mark.long
@pytest.mark.integration
def test_failover_when_a_replica_process_is_killed(tmp_path):
    """Two replicas of the session-state environment; replica 1 is killed by PID: calls without a session keep
    working on replica 0 and replica 1 gets no more of them; a session that lived on replica 1 fails (its state
    died with it); once replica 1 restarts on a new port, the client finds it through the head server."""
    head_app = build_head_app()
    with serve(head_app) as head_url:
        servers = ServerProcesses(tmp_path, head_url, "counter", COUNTER)
        try:
            pids = {i: servers.start(i).pid for i in (0, 1)}
            wait_registered(head_url, "counter", pids)
            stays, dies = key_on(0, 2), key_on(1, 2)

            async def before_and_after_kill():
                async with ServerClient(head_url, timeouts=FAST, replica_cooldown_s=60) as client:
                    for session in (stays, dies):
                        await client.post("counter", "/seed_session", row(5), session_id=session)
                        await client.post("counter", "/increment_counter", {"count": 2}, session_id=session)
                        assert (
                            await client.post("counter", "/verify", {**row(5), "response": {}}, session_id=session)
                        )["reward"] == 1.0
                    assert len(await asyncio.gather(*(client.get("counter", "/tools") for _ in range(10)))) == 10
                    before = {s["replica"]: s["calls"] for s in client.replica_stats("counter")}
                    assert min(before.values()) >= 5  # both served

                    psutil.Process(pids[1]).kill()
                    servers.processes[1].wait(30)
                    for _ in range(20):
                        assert isinstance(await client.get("counter", "/tools"), list)
                    after = {s["replica"]: s for s in client.replica_stats("counter")}
                    assert (
                        after[1]["calls"] == before[1] + 1 and after[1]["failures"] == 1 and after[1]["down"]
                    )  # one failed try, then none
                    assert after[0]["calls"] == before[0] + 20
                    assert (await client.post("counter", "/verify", {**row(5), "response": {}}, session_id=stays))[
                        "reward"
                    ] == 1.0
                    with pytest.raises(ServerUnavailableError):
                        await client.post("counter", "/increment_counter", {"count": 1}, session_id=dies)

                    servers.start(1)  # restarted: a new process on a new port registers as replica 1 again
                    new_url = wait_registered(head_url, "counter", {1: servers.processes[1].pid})[1]
                    assert new_url != after[1]["url"]
                    assert (await client.post("counter", "/seed_session", row(1), session_id=dies)) == {}
                    assert client.replica_stats("counter")[1]["url"] == new_url
                    assert len([s for s in httpx.get(f"{head_url}/servers").json() if s["name"] == "counter"]) == 2

            asyncio.run(before_and_after_kill())
        finally:
            servers.stop()


def write_replicas_config(path: Path) -> Path:
    path.write_text("""\
counter:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
      num_replicas: 2
counter_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      num_replicas: 2
      resources_server: {type: resources_servers, name: counter}
      model_server: {type: responses_api_models, name: policy_model}
policy_model:
  responses_api_models:
    scripted_model:
      entrypoint: app.py
      default_reply: "done"
      tool_arguments: {increment_counter: {count: 2}}
""")
    return path


def access_log_count(path: Path, route: str) -> int:
    return len(re.findall(rf'"{re.escape(route)} HTTP/1.1" 200', path.read_text(errors="replace")))


@pytest.mark.long
@pytest.mark.integration
def test_ng_run_replicas_and_collect_rollouts(tmp_path):
    """ng_run with 2 agent and 2 environment replicas: registry, state.json, logs; ng_collect_rollouts writes one row
    per (task, repeat), every reward from the session kept by the replica that seeded it (a call reaching the
    other replica would score 0), and both replicas of each instance served; a replica that dies stops the run."""
    tools = json.loads((REPO / COUNTER / "data/example.jsonl").read_text().splitlines()[0])["responses_create_params"][
        "tools"
    ]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({**row(i), "responses_create_params": {"input": f"count from {i}", "tools": tools}}) + "\n"
            for i in range(6)
        )
    )
    config = write_replicas_config(tmp_path / "replicas.yaml")
    with NgRun(f"+config_paths=[{config}]", "+skip_venv=true", env={"NEMO_GYM_ACCESS_LOG": "1"}) as run:
        head = run.wait_ready()
        auth = run_token_headers(head)
        listed = httpx.get(f"{head}/servers", headers=auth).json()
        assert sorted((s["name"], s["replica"]) for s in listed) == [
            ("counter", 0),
            ("counter", 1),
            ("counter_agent", 0),
            ("counter_agent", 1),
            ("policy_model", 0),
        ]
        assert len({s["url"] for s in listed}) == 5 and len({s["pid"] for s in listed}) == 5
        assert [r["replica"] for r in httpx.get(f"{head}/servers/counter", headers=auth).json()["replicas"]] == [0, 1]
        assert "All 5 / 5 servers ready" in run.output() and "counter_agent[1]" in run.output()
        run_dir = next(
            p.parent for p in runs_dir().glob("*/state.json") if json.loads(p.read_text())["head_url"] == head
        )
        state = json.loads((run_dir / "state.json").read_text())
        assert sorted((s["name"], s["replica"], Path(s["log"]).name) for s in state["servers"]) == [
            ("counter", 0, "counter.log"),
            ("counter", 1, "counter.1.log"),
            ("counter_agent", 0, "counter_agent.log"),
            ("counter_agent", 1, "counter_agent.1.log"),
            ("policy_model", 0, "policy_model.log"),
        ]

        out = tmp_path / "rollouts.jsonl"
        collect = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                "+agent_name=counter_agent",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={out}",
                "+num_repeats=3",
                "+num_samples_in_parallel=4",
                "+progress=false",
                f"+head_server_url={head}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert collect.returncode == 0, collect.stdout + collect.stderr
        rollouts = read_jsonl(out)
        pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rollouts)
        assert set(pairs) == {(t, k) for t in range(6) for k in range(3)} and max(pairs.values()) == 1
        assert all(r["reward"] == 1.0 for r in rollouts)  # seeded, incremented and verified on one replica
        logs = run_dir / "logs"
        runs = [access_log_count(logs / name, "POST /run") for name in ("counter_agent.log", "counter_agent.1.log")]
        seeds = [access_log_count(logs / name, "POST /seed_session") for name in ("counter.log", "counter.1.log")]
        verifies = [
            access_log_count(logs / name, "POST /verify?close_session=true")
            for name in ("counter.log", "counter.1.log")
        ]
        assert sum(runs) == sum(seeds) == sum(verifies) == 18 and min(runs) > 0 and min(seeds) > 0, (runs, seeds)

        from nemo_gym.orchestration.status import collect_status

        (status,) = [r for r in collect_status(head) if r["head_url"] == head]
        assert sorted((s["name"], s["replica"], s["health"]) for s in status["servers"])[:2] == [
            ("counter", 0, "ok"),
            ("counter", 1, "ok"),
        ]

        victim = next(s["pid"] for s in listed if (s["name"], s["replica"]) == ("counter", 1))
        os.kill(victim, signal.SIGKILL)
        assert run.wait_exit(60) == 1
    assert "server 'counter' replica 1" in run.output() and "died while running" in run.output()
