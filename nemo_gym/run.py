"""`ng_run`: start every server of a config, each in its own process and virtual environment.

Start-up: the head server binds first; environments are built (in parallel, once per distinct requirements
set, reused later); each server process binds its own socket and registers its address with the head
server; the run is ready when every server answers `GET /health`. A server that exits is reported by name
with its last log lines and the whole run stops. SIGINT/SIGTERM stop every process group (SIGTERM, then
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
from nemo_gym.serve import bind_socket
from nemo_gym.venvs import ensure_venv

__all__ = ["RunOptions", "HeadServerOptions", "run_main", "tail"]


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


@dataclass
class ServerProcess:
    instance: ServerInstance
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    url: str | None = None
    healthy: bool = False
    started_at: float = field(default_factory=time.time)


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file ('' when it does not exist)."""
    if not path.exists():
        return ""
    with path.open(errors="replace") as fh:
        return "".join(deque(fh, maxlen=lines)).rstrip()


def _died_message(server: ServerProcess, lines: int, what: str) -> str:
    log = tail(server.log_path, lines)
    return f"server {server.instance.name!r} ({server.instance.server_type}/{server.instance.implementation}) {what}.\nLast log lines ({server.log_path}):\n{log or '(empty log)'}"


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
            server = ServerProcess(instance, self.run_dir / "logs" / f"{instance.name}.log")
            env = {**base_env, "NEMO_GYM_RUN_DIR": str(self.run_dir), "NEMO_GYM_INSTANCE": instance.name, HEAD_URL_ENV: self.head_url, "PYTHONUNBUFFERED": "1"}
            if self.run_token:  # in the environment, not on the command line: `ps` shows command lines
                env[RUN_TOKEN_ENV] = self.run_token
            with server.log_path.open("ab") as log:
                server.process = await asyncio.create_subprocess_exec(
                    str(pythons[instance.name]), "-m", "nemo_gym.serve",
                    cwd=instance.implementation_dir, env=env, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # own process group: stopping it stops its children (e.g. vLLM)
                )
            self.servers.append(server)

    def check_alive(self) -> None:
        for server in self.servers:
            if server.process and server.process.returncode is not None:
                raise ServerStartError(_died_message(server, self.options.log_lines, f"exited with code {server.process.returncode}"))

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while not all(s.healthy for s in self.servers):
                self.check_alive()
                if self.stop_event.is_set():
                    raise KeyboardInterrupt
                if time.monotonic() > deadline:
                    waiting = [s for s in self.servers if not s.healthy]
                    raise ServerStartError("\n\n".join(_died_message(s, self.options.log_lines, f"was not healthy after {self.options.startup_timeout_s:.0f} s") for s in waiting))
                for server in self.servers:
                    registered = self.head_app.state.servers.get(server.instance.name)
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
            "servers": [
                {"name": s.instance.name, "server_type": s.instance.server_type, "implementation": s.instance.implementation,
                 "pid": s.process.pid if s.process else None, "url": s.url, "log": str(s.log_path)}
                for s in self.servers
            ],
        }
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=1))

    # -- stop ----------------------------------------------------------------------------------------
    async def stop(self) -> None:
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
        width = max(len(s.instance.name) for s in self.servers)
        print(f"All {len(self.servers)} / {len(self.servers)} servers ready in {seconds:.1f} s. Head server: {self.head_url}")
        for s in self.servers:
            print(f"  {s.instance.name:<{width}}  {s.instance.server_type}/{s.instance.implementation:<24} {s.url}  pid {s.process.pid if s.process else '-'}")
        print(f"Logs: {self.run_dir / 'logs'}. Stop with Ctrl-C. Status: ng_status", flush=True)

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)
        start = time.monotonic()
        try:
            self.write_instances()
            await self.start_head()
            pythons = await self.build_venvs()
            await self.spawn(pythons)
            await self.wait_ready()
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
                self.check_alive()
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
