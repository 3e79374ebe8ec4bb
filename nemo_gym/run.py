"""`ng_run`: start every server of a config, each in its own process and virtual environment.

Start-up: the head server binds first; environments are built (in parallel, once per distinct requirements
set, reused later); each server process binds its own socket and registers its address with the head
server; the run is ready when every server answers `GET /health`. A server that exits is reported by name
with its last log lines and the whole run stops.

Replicas: an instance with `num_replicas: N` runs N processes (env `NEMO_GYM_REPLICA` = 0..N-1, logs
`logs/<name>.log` for replica 0 and `logs/<name>.<i>.log` for the others); each registers under the instance
name with its index, and clients spread calls over them (`nemo_gym.client`). The run is ready when every replica
is healthy; a replica that exits stops the run like any server. SIGINT/SIGTERM stop every process group (SIGTERM, then
SIGKILL after `stop_grace_s`), so no process is left behind.

Exposure: every server binds 127.0.0.1 unless configured otherwise, and the servers of a run accept calls
only with the run's random token (`nemo_gym.auth`): it goes to each server in its environment, and to the
user's tools in `<run dir>/token` (mode 0600, removed at stop). `+allow_unauthenticated=true` turns it off.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.auth import RUN_TOKEN_ENV, TOKEN_FILE_NAME, new_run_token, write_token_file
from nemo_gym.client import HEAD_URL_ENV
from nemo_gym.config import LoadedConfig, ServerInstance, server_instances
from nemo_gym.errors import ConfigError, ServerStartError
from nemo_gym.head import DEFAULT_HEAD_PORT, build_head_app, runs_dir
from nemo_gym.limits import UVICORN_LIMITS
from nemo_gym.processes import die_with_parent
from nemo_gym.serve import REPLICA_ENV, bind_socket
from nemo_gym.venvs import ensure_venv

__all__ = ["RunOptions", "HeadServerOptions", "NgRunProcess", "run_main", "tail"]


class HeadServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", description="address of the head server (discovery of servers by name)")
    port: int | None = Field(None, description=f"port of the head server; default {DEFAULT_HEAD_PORT}, or a free one when that is taken")


class RunOptions(BaseModel):
    """Parameters of `ng_run` (besides the server instances of the config)."""

    model_config = ConfigDict(extra="ignore")
    config_paths: list[str] = Field(default_factory=list, description="YAML files with server instances, merged in order")
    head_server: HeadServerOptions = Field(default_factory=HeadServerOptions, description="head server host and port")
    skip_venv: bool = Field(False, description="run every server with this Python instead of its own uv environment (development)")
    startup_timeout_s: float = Field(1800.0, description="seconds to wait for all servers to answer /health (vLLM may build its engine)")
    stop_grace_s: float = Field(10.0, description="seconds between SIGTERM and SIGKILL when stopping")
    log_lines: int = Field(30, description="how many last log lines to show for a server that died")
    allow_unauthenticated: bool = Field(False, description="serve without the per-run token: any local process (of any user) may then call the servers")
    ray_address: str | None = Field(None, description="place the servers on this Ray cluster (`auto`, `host:port`) instead of this machine; see nemo_gym.ray_placement")


@dataclass
class ServerProcess:
    instance: ServerInstance
    log_path: Path
    replica: int = 0
    process: asyncio.subprocess.Process | None = None
    url: str | None = None
    healthy: bool = False
    ray_replica: Any = None  # with +ray_address: its actor (nemo_gym.ray_placement)
    started_at: float = field(default_factory=time.time)

    @property
    def label(self) -> str:
        """`'name'`, or `'name' replica i` for an instance with several replicas."""
        return f"{self.instance.name!r}" + (f" replica {self.replica}" if self.instance.num_replicas > 1 else "")


def log_path(logs_dir: Path, name: str, replica: int) -> Path:
    """Log file of a server process: `<name>.log` for replica 0, `<name>.<replica>.log` for the others."""
    return logs_dir / (f"{name}.log" if replica == 0 else f"{name}.{replica}.log")


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file ('' when it does not exist)."""
    if not path.exists():
        return ""
    with path.open(errors="replace") as fh:
        return "".join(deque(fh, maxlen=lines)).rstrip()


def _node_of(server: ServerProcess) -> str:
    """`node <ip> <id prefix>` of a Ray-placed server, as last reported."""
    info = (server.ray_replica.info or {}) if server.ray_replica is not None else {}
    return f"node {info.get('node_ip', '?')} {str(info.get('node_id', '?'))[:8]}"


def _died_message(server: ServerProcess, lines: int, what: str) -> str:
    if server.ray_replica is not None:  # the log is on the server's Ray node: its last lines as last fetched
        where, log = f"on Ray {_node_of(server)}: {(server.ray_replica.info or {}).get('log', '?')}", server.ray_replica.last_tail
    else:
        where, log = str(server.log_path), tail(server.log_path, lines)
    return f"server {server.label} ({server.instance.server_type}/{server.instance.implementation}) {what}.\nLast log lines ({where}):\n{log or '(empty log)'}"


class Run:
    def __init__(self, loaded: LoadedConfig, options: RunOptions):
        self.options = options
        self.instances = server_instances(loaded)
        if not self.instances:
            raise ConfigError("no server instances in the config: pass +config_paths=[<server yaml>,...] (see configs/quickstart.yaml)")
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.run_dir = runs_dir() / self.run_id
        self.servers: list[ServerProcess] = []
        self.stop_event = asyncio.Event()
        self.head_url = ""
        self.run_token = None if options.allow_unauthenticated else new_run_token()
        self.ray: Any = None  # RayServers with +ray_address
        self._ray_polled_at = 0.0

    # -- start ---------------------------------------------------------------------------------------
    async def start_head(self) -> None:
        options = self.options.head_server
        port = DEFAULT_HEAD_PORT if options.port is None else options.port
        try:
            sock = bind_socket(options.host, port, "head_server")
        except ConfigError:
            if options.port is not None:
                raise
            sock = bind_socket(options.host, 0, "head_server")
        host, port = sock.getsockname()[:2]
        self.head_url = f"http://{host}:{port}"
        self.head_app = build_head_app(run_token=self.run_token)
        self.head = uvicorn.Server(uvicorn.Config(self.head_app, log_level="warning", access_log=False, **UVICORN_LIMITS))
        self.head.install_signal_handlers = lambda: None  # signals are ours
        self.head_task = asyncio.create_task(self.head.serve(sockets=[sock]))

    def write_instances(self) -> None:
        self.run_dir.mkdir(parents=True, mode=0o700)
        (self.run_dir / "logs").mkdir()
        path = self.run_dir / "instances.json"
        specs = {i.name: {"name": i.name, "server_type": i.server_type, "implementation": i.implementation, "fields": i.fields, "source": i.source} for i in self.instances}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # holds secrets: owner only
        with os.fdopen(fd, "w") as fh:
            json.dump(specs, fh)
        if self.run_token:
            write_token_file(self.run_dir, self.run_token)

    async def build_venvs(self) -> dict[str, Path]:
        if self.options.skip_venv:
            return {i.name: Path(sys.executable) for i in self.instances}
        by_requirements: dict[str, list[ServerInstance]] = {}
        for instance in self.instances:
            requirements = instance.implementation_dir / "requirements.txt"
            text = requirements.read_text() if requirements.is_file() else ""
            by_requirements.setdefault(text, []).append(instance)
        log = self.run_dir / "logs" / "venvs.log"
        groups = list(by_requirements.values())
        print(f"Preparing {len(groups)} environment(s) for {len(self.instances)} server(s) (built once, then reused)...", flush=True)
        pythons = await asyncio.gather(*(ensure_venv(g[0].implementation_dir / "requirements.txt", log_file=log) for g in groups))
        return {i.name: python for group, python in zip(groups, pythons) for i in group}

    async def spawn(self, pythons: dict[str, Path]) -> None:
        base_env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", RUN_TOKEN_ENV}}
        for instance in self.instances:
            for replica in range(instance.num_replicas):
                server = ServerProcess(instance, log_path(self.run_dir / "logs", instance.name, replica), replica)
                env = {**base_env, "NEMO_GYM_RUN_DIR": str(self.run_dir), "NEMO_GYM_INSTANCE": instance.name, REPLICA_ENV: str(replica),
                       HEAD_URL_ENV: self.head_url, "PYTHONUNBUFFERED": "1"}
                if self.run_token:  # in the environment, not on the command line: `ps` shows command lines
                    env[RUN_TOKEN_ENV] = self.run_token
                with server.log_path.open("ab") as log:
                    server.process = await asyncio.create_subprocess_exec(
                        str(pythons[instance.name]), "-m", "nemo_gym.serve",
                        cwd=instance.implementation_dir, env=env, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                        start_new_session=True,  # own process group: stopping it stops its children (e.g. vLLM)
                        preexec_fn=die_with_parent,  # SIGTERM when ng_run dies, even by SIGKILL: no orphaned server
                    )
                self.servers.append(server)

    def spawn_on_ray(self) -> None:
        """With `+ray_address`: one actor per replica; each builds its environment and starts its server on its node."""
        from nemo_gym.ray_placement import RayServers

        self.ray = RayServers(self.options.ray_address or "auto", run_id=self.run_id, head_url=self.head_url, run_token=self.run_token, skip_venv=self.options.skip_venv)
        print(f"Placing {sum(i.num_replicas for i in self.instances)} server process(es) on the Ray cluster at {self.options.ray_address}...", flush=True)
        for instance in self.instances:
            for replica in range(instance.num_replicas):
                server = ServerProcess(instance, log_path(self.run_dir / "logs", instance.name, replica), replica)
                server.ray_replica = self.ray.start(instance, replica)
                self.servers.append(server)

    async def check_alive_async(self) -> None:
        """`check_alive`, and with Ray: the actors' state (a replica whose restarts are used up stops the run), and
        the addresses of restarted replicas taken into state.json."""
        self.check_alive()
        if self.ray is None or time.monotonic() - self._ray_polled_at < 1.0:
            return
        self._ray_polled_at = time.monotonic()
        await asyncio.to_thread(self.ray.poll, self.options.log_lines)
        moved = False
        for server in self.servers:
            registered = self.head_app.state.servers.replica(server.instance.name, server.replica)
            if server.healthy and registered and registered["url"] != server.url:
                print(f"ng_run: server {server.label} restarted at {registered['url']} ({_node_of(server)})", flush=True)
                server.url, moved = registered["url"], True
        if moved:
            self.write_state()

    def check_alive(self) -> None:
        for server in self.servers:
            if server.process and server.process.returncode is not None:
                raise ServerStartError(_died_message(server, self.options.log_lines, f"exited with code {server.process.returncode}"))

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while not all(s.healthy for s in self.servers):
                await self.check_alive_async()
                if self.stop_event.is_set():
                    raise KeyboardInterrupt
                if time.monotonic() > deadline:
                    waiting = [s for s in self.servers if not s.healthy]
                    raise ServerStartError("\n\n".join(_died_message(s, self.options.log_lines, f"was not healthy after {self.options.startup_timeout_s:.0f} s") for s in waiting))
                for server in self.servers:
                    registered = self.head_app.state.servers.replica(server.instance.name, server.replica)
                    if server.healthy or not registered:
                        continue
                    server.url = registered["url"]
                    try:
                        answer = await http.get(f"{server.url}/health")
                        server.healthy = answer.status_code == 200
                    except httpx.HTTPError:
                        pass
                await asyncio.sleep(0.1)

    def write_state(self) -> None:
        me = psutil.Process()
        state = {
            "run_id": self.run_id,
            "pid": me.pid,
            "process_create_time": me.create_time(),
            "started_at": time.time(),
            "head_url": self.head_url,
            "servers": [self._server_state(s) for s in self.servers],
        }
        if self.ray is not None:
            state["ray_address"] = self.options.ray_address
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=1))

    @staticmethod
    def _server_state(server: ServerProcess) -> dict[str, Any]:
        entry = {"name": server.instance.name, "replica": server.replica, "server_type": server.instance.server_type, "implementation": server.instance.implementation,
                 "pid": server.process.pid if server.process else None, "url": server.url, "log": str(server.log_path)}  # fmt: skip
        if server.ray_replica is not None:  # the process and its log are on a Ray node
            info = server.ray_replica.info or {}
            entry.update({"pid": info.get("pid"), "log": info.get("log"), "node_id": info.get("node_id"), "node_ip": info.get("node_ip")})
        return entry

    # -- stop ----------------------------------------------------------------------------------------
    async def stop(self) -> None:
        if self.ray is not None:
            await asyncio.to_thread(self.ray.stop, self.options.stop_grace_s)
        alive = [s.process for s in self.servers if s.process and s.process.returncode is None]
        for process in alive:
            _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.options.stop_grace_s
        for process in alive:
            try:
                await asyncio.wait_for(process.wait(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        for server in self.servers:  # SIGKILL whatever is left in each group, children included
            if server.process:
                _signal_group(server.process.pid, signal.SIGKILL)
                await server.process.wait()
        if hasattr(self, "head"):
            self.head.should_exit = True
            await self.head_task
        (self.run_dir / "state.json").unlink(missing_ok=True)
        (self.run_dir / TOKEN_FILE_NAME).unlink(missing_ok=True)

    def print_ready(self, seconds: float) -> None:
        names = [s.instance.name + (f"[{s.replica}]" if s.instance.num_replicas > 1 else "") for s in self.servers]
        width = max(len(n) for n in names)
        replicas = f" ({len(self.instances)} instances)" if len(self.instances) != len(self.servers) else ""
        print(f"All {len(self.servers)} / {len(self.servers)} servers ready in {seconds:.1f} s{replicas}. Head server: {self.head_url}")
        for name, s in zip(names, self.servers):
            where = f"pid {s.process.pid}" if s.process else f"{_node_of(s)}, pid {(s.ray_replica.info or {}).get('pid', '?')}" if s.ray_replica else "pid -"
            print(f"  {name:<{width}}  {s.instance.server_type}/{s.instance.implementation:<24} {s.url}  {where}")
        print(f"Logs: {self.run_dir / 'logs'}. Stop with Ctrl-C. Status: ng_status", flush=True)

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)
        start = time.monotonic()
        try:
            self.write_instances()
            await self.start_head()
            if self.options.ray_address:
                self.spawn_on_ray()  # in the main thread: Ray's driver installs its signal handlers there
            else:
                await self.spawn(await self.build_venvs())
            await self.wait_ready()
            if self.ray is not None:
                self._ray_polled_at = 0.0
                await self.check_alive_async()  # each replica's node and pid, for state.json
            self.write_state()
            self.print_ready(time.monotonic() - start)
            return await self.monitor()
        except ServerStartError as exc:
            print(f"ng_run: {exc}", file=sys.stderr, flush=True)
            return 1
        except KeyboardInterrupt:
            print("ng_run: interrupted during start-up; stopping servers.", file=sys.stderr, flush=True)
            return 130
        finally:
            await self.stop()

    async def monitor(self) -> int:
        while not self.stop_event.is_set():
            try:
                await self.check_alive_async()
            except ServerStartError as exc:
                print(f"ng_run: {str(exc).replace('exited', 'died while running, exited', 1)}\nStopping all servers.", file=sys.stderr, flush=True)
                return 1
            try:
                await asyncio.wait_for(self.stop_event.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        print("ng_run: stopping servers...", flush=True)
        return 0


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_main(loaded: LoadedConfig) -> int:
    """Run the servers of a loaded config until interrupted. Returns the exit status."""
    options = RunOptions.model_validate(loaded.values)
    run = Run(loaded, options)
    return asyncio.run(run.main())


READY_LINE = "servers ready in"  # in ng_run's line once every server answers /health (see Run.print_ready)


class NgRunProcess:
    """The servers of a config for a command that needs them a while (ng_train, ng_try): `ng_run argv` started
    as a child process, or, with `head_server_url`, a running ng_run attached to (nothing started, nothing stopped).

    The child runs in its own session (Ctrl-C in the terminal reaches the caller only, which stops the child
    with `stop()`), gets SIGTERM from Linux when the caller dies (so its servers never outlive it) and writes
    its output to `log_path`. Its head server listens on a free loopback port chosen here.

    Args:
        argv: ng_run's arguments (`+config_paths=[...]`, overrides).
        head_server_url: attach to this head server instead of starting anything.
        log_path: ng_run's output file.
        startup_timeout_s: seconds to wait for every server's /health (vLLM may build its engine first).
        caller: the command's name, for the messages (`ng_train`).
        poll_s: seconds between two looks at the log while waiting.

    Raises:
        ServerStartError: ng_run exited during start-up (its last log lines are in the message) or was not ready
            in time; the child is stopped first. A KeyboardInterrupt while waiting also stops it.
    """

    def __init__(self, argv: list[str], head_server_url: str | None, log_path: Path, startup_timeout_s: float = 1800.0, *,
                 caller: str, poll_s: float = 0.5):  # fmt: skip
        self.process: subprocess.Popen | None = None
        self.caller = caller
        if head_server_url:
            self.head_url = head_server_url.rstrip("/")
            return
        from nemo_gym.vllm_engine import free_port

        port = free_port()
        self.head_url = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_start = log_path.stat().st_size if log_path.is_file() else 0  # an earlier run's lines (a resumed ng_train) do not count
        command = [sys.executable, "-c", "import sys; from nemo_gym.cli import main; sys.exit(main('run'))", *argv, f"++head_server.port={port}"]
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        print(f"{caller}: started ng_run (pid {self.process.pid}, head {self.head_url}, log {log_path}); waiting for its servers...", flush=True)
        try:
            self._wait_ready(startup_timeout_s, log_path, log_start, poll_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float, log_path: Path, log_start: int, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerStartError(f"ng_run exited with code {self.process.returncode}; last lines of {log_path}:\n{tail(log_path, 30)}")
            with log_path.open("rb") as log:
                log.seek(log_start)
                if READY_LINE.encode() in log.read():
                    return
            time.sleep(poll_s)
        raise ServerStartError(f"ng_run's servers were not ready within {timeout_s:.0f} s; see {log_path}")

    def server_url(self, name: str) -> str:
        """Base URL of the run's server instance `name` (asked of the head server).

        Raises:
            ServerError: the head server does not know `name`.
        """
        from nemo_gym.client import ServerClient

        async def lookup() -> str:
            async with ServerClient(self.head_url) as client:
                return await client.server_url(name)

        return asyncio.run(lookup())

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the started ng_run (SIGINT: it stops its servers; SIGKILL of its process group after `grace_s`).
        Nothing for an attached run or one that has exited."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
