"""ng_run's launchers at their seams (`nemo_gym.orchestration.launch`): which environments each asks for, how the run
builds them, and the NeMo Gym launcher's start and stop with a stand-in server (a real process on loopback) and a
stand-in Ray head (the real one needs a NeMo Gym release: tests/test_nemo_gym_wheel_servers.py, marked peer).
The local and external launchers run for real in tests/test_ng_run.py and tests/test_external_servers.py."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from nemo_gym.common.errors import ServerStartError
from nemo_gym.common.processes import free_ports
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration import launch_upstream
from nemo_gym.orchestration.launch import Environment, RunContext, build_environments
from nemo_gym.orchestration.launch_local import LocalLauncher
from nemo_gym.orchestration.launch_upstream import NemoGymLauncher
from nemo_gym.orchestration.upstream_servers import config_dict_yaml
from nemo_gym.orchestration.venvs import VenvBuildError
from nemo_gym.serving.auth import ALLOWED_PEERS_FILE
from nemo_gym.serving.head import ServerRegistry

# A NeMo Gym server as far as ng_run sees one: `python <entrypoint>` that reads its config dict from the environment
# and answers GET / on the port of its section; it writes the config dict it got next to itself.
STAND_IN = """
import http.server, os, pathlib, yaml
config = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])
name = os.environ["NEMO_GYM_CONFIG_PATH"]
pathlib.Path(__file__).with_name("config_dict.yaml").write_text(os.environ["NEMO_GYM_CONFIG_DICT"])
server_type, = config[name]; implementation, = config[name][server_type]
port = config[name][server_type][implementation]["port"]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status": "ok"}')

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def instance(name: str, folder: Path, **fields: object) -> ServerInstance:
    return ServerInstance(name, "resources_servers", folder.name, {"implementation_dir": str(folder), **fields})


def test_local_environments_one_per_requirements_set(tmp_path):
    folders = {name: tmp_path / name for name in ("a", "b", "c")}
    for name, text in (("a", "x==1\n"), ("b", "x==1\n"), ("c", "y==2\n")):
        folders[name].mkdir()
        (folders[name] / "requirements.txt").write_text(text)
    instances = [instance(name, folder) for name, folder in folders.items()]
    environments = LocalLauncher(instances, skip_venv=False, allow_same_user=False).environments()
    assert [[m.name for m in env.members] for env in environments] == [["a", "b"], ["c"]] and all(
        env.release is None for env in environments
    )
    assert LocalLauncher(instances, skip_venv=True, allow_same_user=False).environments() == []  # ng_run's own Python


def test_nemo_gym_environments_one_per_release_and_requirements(tmp_path):
    folders = {name: tmp_path / name for name in ("a", "b", "c")}
    for folder in folders.values():
        folder.mkdir()
        (folder / "requirements.txt").write_text(
            "-e nemo-gym[dev] @ ../../\ntiktoken\n"
        )  # the checkout's line is dropped
    instances = [
        instance("a", folders["a"]),
        instance("b", folders["b"]),
        instance("c", folders["c"], nemo_gym_version="0.3.0"),
    ]
    launcher = NemoGymLauncher(instances, everyone=instances, values={}, default_version="0.4.0")
    assert [([m.name for m in env.members], env.release) for env in launcher.environments()] == [
        (["a", "b"], "0.4.0"),
        (["c"], "0.3.0"),
    ]


def test_environments_are_built_together_and_a_failure_names_its_servers(tmp_path, capsys):
    built: list[Path] = []

    async def good(log: Path) -> Path:
        built.append(log)
        return Path("/venvs/own/bin/python")

    async def bad(log: Path) -> Path:
        raise VenvBuildError("no such package: nemo-gym-test-missing")

    a, b, c = (instance(name, tmp_path / name) for name in "abc")
    log = tmp_path / "venvs.log"
    pythons = asyncio.run(
        build_environments([Environment((a, b), good), Environment((c,), good, release="0.4.0")], log)
    )
    assert pythons == {
        "a": Path("/venvs/own/bin/python"),
        "b": Path("/venvs/own/bin/python"),
        "c": Path("/venvs/own/bin/python"),
    } and built == [log, log]
    assert (
        "Preparing 2 environment(s) for 3 server(s) (built once, then reused; NeMo Gym 0.4.0 for 1 NeMo Gym"
        " server(s))..." in capsys.readouterr().out
    )
    with pytest.raises(
        ServerStartError,
        match=re.escape(
            f"the environment of server 'c' ({c.implementation_dir}) could not be built (log: {log}):\nno such package"
        ),
    ):
        asyncio.run(build_environments([Environment((a,), good), Environment((c,), bad)], log))
    assert (
        asyncio.run(build_environments([], log)) == {} and capsys.readouterr().out.count("Preparing") == 1
    )  # nothing to build: no message


class FakeRayHead:
    """`RayHead` without Ray: an address, the environment a server gets, and whether it was stopped."""

    made: list[FakeRayHead] = []

    def __init__(self, ray_executable: Path, run_dir: Path):
        self.log_path, self.env, self.stopped = run_dir / "logs" / "ray_head.log", {"RAY_AUTH_MODE": "token"}, False
        FakeRayHead.made.append(self)

    async def start(self) -> str:
        return "127.0.0.1:6390"

    async def stop(self, grace_s: float) -> None:
        self.stopped = True


def test_nemo_gym_servers_start_registered_allowed_and_stop(tmp_path, monkeypatch):
    """Started last: each with its config dict (every other server's registered address, the head server, the Ray
    head), registered by ng_run as a NeMo Gym server without the token, its pid allowed; stopped with its Ray head."""
    monkeypatch.setattr(launch_upstream, "RayHead", FakeRayHead)
    folder = tmp_path / "nemo_gym_server"
    folder.mkdir()
    (folder / "app.py").write_text(STAND_IN)
    (tmp_path / "logs").mkdir()
    upstream = instance("theirs", folder, framework="nemo_gym")
    ours = ServerInstance("policy_model", "responses_api_models", "scripted_model", {"entrypoint": "app.py"})
    registry = ServerRegistry()
    registry["policy_model"] = {"name": "policy_model", "url": "http://127.0.0.1:4321", "replica": 0}
    run = RunContext(
        "run-1", tmp_path, "http://127.0.0.1:1234", "secret-token", registry, pythons={"theirs": Path(sys.executable)}
    )
    launcher = NemoGymLauncher(
        [upstream], everyone=[ours, upstream], values={"policy_model_name": "m"}, default_version="0.4.0"
    )

    async def scenario() -> None:
        await launcher.start(run)
        [server] = launcher.servers
        try:
            async with httpx.AsyncClient(trust_env=False) as http:
                for _ in range(100):  # the stand-in binds its port after it starts
                    try:
                        if (await http.get(f"{server.url}{server.health_path}")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.1)
                else:
                    raise AssertionError((folder.parent / "logs" / "theirs.log").read_text())
        finally:
            await launcher.stop(1.0)
        assert server.process.returncode is not None and FakeRayHead.made[-1].stopped

    asyncio.run(scenario())
    [server] = launcher.servers
    assert (server.kind, server.health_path, server.release, server.log_path) == (
        "nemo_gym",
        "/",
        "0.4.0",
        tmp_path / "logs" / "theirs.log",
    )
    entry = registry["theirs"]
    assert (entry["url"], entry["pid"], entry["external"], entry["framework"], entry["send_run_token"]) == (
        server.url,
        server.process.pid,
        False,
        "nemo_gym",
        False,
    )
    assert json.loads((tmp_path / ALLOWED_PEERS_FILE).read_text())["pids"] == [server.process.pid]
    config = yaml.safe_load((folder / "config_dict.yaml").read_text())
    assert config["policy_model"] == {
        "responses_api_models": {"scripted_model": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 4321}}
    }
    assert (
        config["head_server"] == {"host": "127.0.0.1", "port": 1234}
        and config["ray_head_node_address"] == "127.0.0.1:6390"
        and config["policy_model_name"] == "m"
    )
    assert "framework" not in config["theirs"]["resources_servers"]["nemo_gym_server"]  # our own fields stay ours


def test_a_servers_own_framework_field_is_given_to_it():
    """`framework` with a value of ours stays ours; another (0.7.0's tales: `framework: textworld`) is the server's."""
    sections = {
        "tales": ("resources_servers", "tales", {"entrypoint": "app.py", "framework": "textworld", "num_replicas": 1}),
        "theirs": ("resources_servers", "mcqa", {"entrypoint": "app.py", "framework": "nemo_gym"}),
    }
    config = yaml.safe_load(config_dict_yaml({}, sections, head=("127.0.0.1", 1234), ray_address=None))
    assert config["tales"]["resources_servers"]["tales"] == {"entrypoint": "app.py", "framework": "textworld"}
    assert config["theirs"]["resources_servers"]["mcqa"] == {"entrypoint": "app.py"}


def test_ray_head_is_started_again_after_rays_startup_timeout(tmp_path):
    """Ray gives its raylet a fixed 30 s to register; on a loaded machine a start fails so. The Ray head for the NeMo
    Gym servers is then started again (fresh ports), up to RayHead.START_ATTEMPTS times; another failure is not."""
    from nemo_gym.orchestration.upstream_servers import RayHead

    def fake_ray(first_failure: str) -> Path:
        counter, script = tmp_path / f"count_{len(first_failure)}", tmp_path / f"ray_{len(first_failure)}"
        script.write_text(
            f"#!{sys.executable}\nimport pathlib, sys, time\nc = pathlib.Path({str(counter)!r})\n"
            "n = int(c.read_text()) if c.exists() else 0\nc.write_text(str(n + 1))\n"
            f"if n == 0:\n    print({first_failure!r}, flush=True)\n    sys.exit(1)\n"
            "print('Ray runtime started.', flush=True)\ntime.sleep(60)\n"
        )
        script.chmod(0o755)
        return script

    (tmp_path / "logs").mkdir()

    async def start(ray: Path) -> str:
        head = RayHead(ray, tmp_path, num_cpus=1)
        head.RETRY_PAUSE_S = 0.1
        try:
            return await head.start()
        finally:
            await head.stop(1.0)

    timeout = fake_ray("Exception: The current node timed out during startup. This could happen because ...")
    assert asyncio.run(start(timeout)).startswith("127.0.0.1:")
    other = fake_ray("Error: something else")
    with pytest.raises(ServerStartError, match="something else"):
        asyncio.run(start(other))
    counts = sorted(int(p.read_text()) for p in tmp_path.glob("count_*"))
    assert counts == [1, 2]


def test_free_ports_are_distinct_within_one_draw():
    """Each socket stays bound until all are drawn, so one draw never repeats a port (one at a time, it did)."""
    ports = free_ports(200)
    assert len(set(ports)) == 200 and all(1024 <= port < 65536 for port in ports)


def test_nemo_gym_servers_that_lose_their_port_start_again_on_fresh_ports(tmp_path, monkeypatch):
    """Issue 29 item 6a: a drawn port can be taken before the server binds it (two instances of one run once got the
    same port; the second died with EADDRINUSE and the run stopped). Forced here: the first draw hands both servers a
    port this test holds; both die with "Address already in use", and ng_run starts the NeMo Gym servers again on
    fresh ports, each with the others' new addresses in its config dict, until they answer. A server that dies for
    another reason is not started again, and a port that stays taken stops the run after UPSTREAM_PORT_ATTEMPTS."""
    import socket
    from types import SimpleNamespace

    from nemo_gym.orchestration.run import Run

    monkeypatch.setattr(launch_upstream, "RayHead", FakeRayHead)
    (tmp_path / "logs").mkdir()
    folders = {}
    for name in ("first", "second"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "app.py").write_text(STAND_IN)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    draws: list[list[int]] = []

    def drawing(taken_draws: int):
        def draw(count: int, host: str = "127.0.0.1") -> list[int]:
            draws.append([taken] * count if len(draws) < taken_draws else free_ports(count, host))
            return draws[-1]

        return draw

    def run_with(launcher: NemoGymLauncher) -> tuple[Run, RunContext]:
        registry = ServerRegistry()
        context = RunContext(
            "run-1",
            tmp_path,
            "http://127.0.0.1:1234",
            None,
            registry,
            pythons={name: Path(sys.executable) for name in folders},
        )
        run = object.__new__(Run)  # the parts of a Run that wait for servers, without its head server and config
        run.options = SimpleNamespace(startup_timeout_s=60.0, log_lines=20, stop_grace_s=1.0)
        run.launchers, run.upstream, run.ray, run.stop_event = [launcher], launcher, None, asyncio.Event()
        run.head_app = SimpleNamespace(state=SimpleNamespace(servers=registry))
        return run, context

    async def scenario(taken_draws: int) -> NemoGymLauncher:
        draws.clear()
        monkeypatch.setattr(launch_upstream, "free_ports", drawing(taken_draws))
        instances = [instance(name, folder, framework="nemo_gym") for name, folder in folders.items()]
        launcher = NemoGymLauncher(instances, everyone=instances, values={}, default_version="0.4.0")
        run, context = run_with(launcher)
        try:
            await launcher.start(context)
            await run._wait_ready_upstream(context)
            return launcher
        finally:
            await launcher.stop(1.0)

    try:
        launcher = asyncio.run(scenario(taken_draws=2))
        assert [len(d) for d in draws] == [2, 2, 2] and draws[0] == draws[1] == [taken, taken]
        urls = [server.url for server in launcher.servers]
        assert urls == [f"http://127.0.0.1:{port}" for port in draws[2]] and len(set(urls)) == 2
        assert all(server.healthy for server in launcher.servers)
        # the config dict the last start gave `second` names `first` at its new port
        config = yaml.safe_load((folders["second"] / "config_dict.yaml").read_text())
        assert config["first"]["resources_servers"]["first"]["port"] == draws[2][0]
        assert "Address already in use" in (tmp_path / "logs" / "first.log").read_text()

        with pytest.raises(ServerStartError, match="Address already in use"):
            asyncio.run(scenario(taken_draws=Run.UPSTREAM_PORT_ATTEMPTS))
        assert len(draws) == Run.UPSTREAM_PORT_ATTEMPTS
    finally:
        held.close()

    (folders["first"] / "app.py").write_text("raise SystemExit('broken: not a port problem')\n")
    (folders["second"] / "app.py").write_text("raise SystemExit('broken: not a port problem')\n")
    with pytest.raises(ServerStartError, match="not a port problem"):
        asyncio.run(scenario(taken_draws=0))
    assert len(draws) == 1
