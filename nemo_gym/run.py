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

Servers ng_run does not start its own way:
- External servers (`url:` instead of code: one URL, or a list of replica URLs) are checked (their `health_path`;
  by default `/health`, or `/` for a NeMo Gym server, which has no `/health`) and registered with the head server,
  so every client reaches them by instance name; nothing is started or stopped for them, and the run token is
  not sent to them unless `send_run_token: true`. One that does not answer stops the start, named.
- NeMo Gym server folders (written against NVIDIA NeMo Gym's base classes) run unmodified with a NeMo Gym release
  in their own environment (`nemo_gym.nemo_gym_servers`): started once this run's own servers answer (they need
  every address in their config), with a Ray head of their own, and registered by ng_run. Their processes may call
  this run's servers without the token (`allowed_peers.json`, `nemo_gym.auth.PeerPolicy`).

Exposure: every server binds 127.0.0.1 unless configured otherwise, and the servers of a run accept calls
only with the run's random token (`nemo_gym.auth`): it goes to each server in its environment, and to the
user's tools in `<run dir>/token` (mode 0600, removed at stop). `+allow_unauthenticated=true` turns it off;
`+allow_same_user=true` accepts calls of this user's processes over loopback without it (for NeMo Gym's own
tools, which cannot send it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.auth import RUN_TOKEN_ENV, SAME_USER_ENV, TOKEN_FILE_NAME, TOKEN_HEADER, PeerPolicy, new_run_token, write_allowed_peers, write_token_file
from nemo_gym.client import HEAD_URL_ENV
from nemo_gym.config import REPO_ROOT, LoadedConfig, ServerInstance, server_instances, validation_problems
from nemo_gym.errors import ConfigError, ServerStartError
from nemo_gym.head import DEFAULT_HEAD_PORT, build_head_app, runs_dir
from nemo_gym.nemo_gym_servers import DEFAULT_VERSION, FRAMEWORK, LIVENESS_PATH, RayHead, config_dict_yaml, ensure_release_venv, release_requirements, release_version
from nemo_gym.limits import UVICORN_LIMITS
from nemo_gym.processes import die_with_parent, free_port, signal_group
from nemo_gym.ray_placement import RayServers
from nemo_gym.run_processes import NgRunProcess, ServerProcess, died_message, log_path, node_of, tail
from nemo_gym.serve import REPLICA_ENV, bind_socket
from nemo_gym.venvs import VenvBuildError, ensure_venv, requirements_text

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
    allow_same_user: bool = Field(False, description="also accept calls without the run token from this user's processes over loopback (NeMo Gym's own ng_collect_rollouts cannot send it); browsers and other users still need it")
    nemo_gym_version: str = Field(DEFAULT_VERSION, description="NVIDIA NeMo Gym release that runs NeMo Gym server folders (an instance's own `nemo_gym_version` wins)")
    external_wait_s: float = Field(30.0, gt=0, description="seconds an external server (`url:`) may take to answer its health check before ng_run stops")
    ray_address: str | None = Field(None, description="place the servers on this Ray cluster (`auto`, `host:port`) instead of this machine; see nemo_gym.ray_placement")


class Run:
    def __init__(self, loaded: LoadedConfig, options: RunOptions):
        self.options = options
        self.values = loaded.values
        self.instances = server_instances(loaded)
        if not self.instances:
            raise ConfigError("no server instances in the config: pass +config_paths=[<server yaml>,...] (see configs/quickstart.yaml)")
        self.external = [i for i in self.instances if i.external_urls is not None]
        self.nemo_gym = [i for i in self.instances if i not in self.external and i.framework == FRAMEWORK]
        self.own = [i for i in self.instances if i not in self.external and i not in self.nemo_gym]
        self.releases = {i.name: release_version(i, options.nemo_gym_version) for i in self.nemo_gym}
        if self.nemo_gym and options.ray_address:
            names = ", ".join(i.name for i in self.nemo_gym)
            raise ConfigError(f"NeMo Gym server folders ({names}) run on this machine only; +ray_address places our own servers. Run them without +ray_address, "
                              "or start them with NeMo Gym's ng_run and name them here by url:")  # fmt: skip
        self.ray_head: RayHead | None = None
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
        self.head_app = build_head_app(run_token=self.run_token, peers=PeerPolicy(self.run_dir, same_user=self.options.allow_same_user))
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
        """The Python of every server ng_run starts: one environment per distinct requirements set (ours), or per
        (NeMo Gym release, requirements) pair; built in parallel, reused across runs.

        Raises:
            ServerStartError: an environment does not build; the message names its servers and has the installer's error.
        """
        groups: dict[tuple[str, ...], list[ServerInstance]] = {}
        for instance in self.own if not self.options.skip_venv else []:
            text = requirements_text(instance.implementation_dir / "requirements.txt", instance.extra_requirement_files)
            groups.setdefault(("own", text), []).append(instance)
        for instance in self.nemo_gym:
            groups.setdefault(("nemo_gym", self.releases[instance.name], *release_requirements(instance.implementation_dir)), []).append(instance)
        log = self.run_dir / "logs" / "venvs.log"
        if groups:
            releases = sorted(set(self.releases.values()))
            extra = f"; NeMo Gym {', '.join(releases)} for {len(self.nemo_gym)} NeMo Gym server(s)" if releases else ""
            print(f"Preparing {len(groups)} environment(s) for {len(self.own) + len(self.nemo_gym)} server(s) (built once, then reused{extra})...", flush=True)

        async def build(key: tuple[str, ...], members: list[ServerInstance]) -> Path:
            try:
                if key[0] == "own":
                    first = members[0]
                    return await ensure_venv(first.implementation_dir / "requirements.txt", extra_requirements=first.extra_requirement_files, log_file=log)
                return await ensure_release_venv(key[1], list(key[2:]), log_file=log)
            except VenvBuildError as exc:
                names = ", ".join(f"{m.name!r} ({m.implementation_dir})" for m in members)
                raise ServerStartError(f"the environment of server {names} could not be built (log: {log}):\n{exc}") from None

        pythons = await asyncio.gather(*(build(key, members) for key, members in groups.items()))
        chosen = {i.name: python for members, python in zip(groups.values(), pythons) for i in members}
        if self.options.skip_venv:
            chosen.update({i.name: Path(sys.executable) for i in self.own})
        return chosen

    async def spawn(self, pythons: dict[str, Path]) -> None:
        base_env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", RUN_TOKEN_ENV, SAME_USER_ENV}}
        if self.options.allow_same_user:
            base_env[SAME_USER_ENV] = "1"
        for instance in self.own:
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

    async def add_external(self) -> None:
        """Register every external server (`url:`) with the head server and check that it answers.

        Raises:
            ServerStartError: one did not answer its health check within `external_wait_s`, named with what it answered.
        """
        for instance in self.external:
            for replica, url in enumerate(instance.external_urls or []):
                server = ServerProcess(instance, log_path(self.run_dir / "logs", instance.name, replica), replica, kind="external", url=url)
                self.servers.append(server)
                self.head_app.state.servers[instance.name] = {
                    "name": instance.name, "server_type": instance.server_type, "implementation": instance.implementation, "url": url, "pid": 0,
                    "replica": replica, "registered_at": time.time(), "external": True, "framework": None, "send_run_token": instance.send_run_token}  # fmt: skip
        if self.external:
            await asyncio.gather(*(self._check_external(s) for s in self.servers if s.kind == "external"))

    async def _check_external(self, server: ServerProcess) -> None:
        headers = {TOKEN_HEADER: self.run_token} if self.run_token and server.instance.send_run_token else {}
        paths = [server.instance.health_path] if server.instance.health_path else ["/health", LIVENESS_PATH]
        deadline, last = time.monotonic() + self.options.external_wait_s, "no answer"
        async with httpx.AsyncClient(timeout=5.0, trust_env=False, headers=headers) as http:
            while time.monotonic() < deadline:
                for path in paths:
                    try:
                        answer = await http.get(f"{server.url}{path}")
                    except httpx.HTTPError as exc:
                        last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                        break  # not reachable: wait and try again
                    last = f"GET {path} answered {answer.status_code}"
                    if answer.status_code == 200:
                        server.healthy, server.health_path = True, path
                        return
                    if answer.status_code != 404:
                        break
                await asyncio.sleep(0.5)
        tried = " or ".join(paths)
        raise ServerStartError(f"external server {server.label} at {server.url} did not answer {tried} with 200 within {self.options.external_wait_s:.0f} s "
                               f"(last: {last}). Start it first, fix its `url` (key '{server.instance.key}.url'), or set its `health_path`.")  # fmt: skip

    async def start_nemo_gym_servers(self, pythons: dict[str, Path]) -> None:
        """Start the NeMo Gym server folders (once the run's own servers have their addresses): the Ray head they
        connect to, then each replica with its config dict; ng_run registers them and lets them call this run's
        servers without the token."""
        python = pythons[self.nemo_gym[0].name]
        self.ray_head = RayHead(python.parent / "ray", self.run_dir)
        print(f"Starting a Ray head for {len(self.nemo_gym)} NeMo Gym server(s) (log: {self.ray_head.log_path})...", flush=True)
        ray_address = await self.ray_head.start()
        ports = {(i.name, r): int(i.fields.get("port") or 0) or free_port() for i in self.nemo_gym for r in range(i.num_replicas)}
        host = {i.name: str(i.fields.get("host") or "127.0.0.1") for i in self.nemo_gym}
        sections = self._nemo_gym_sections(ports, host)
        head_host, head_port = self.head_url.removeprefix("http://").rsplit(":", 1)
        base_env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", RUN_TOKEN_ENV, SAME_USER_ENV, "RAY_ADDRESS"}}
        for instance in self.nemo_gym:
            for replica in range(instance.num_replicas):
                port = ports[(instance.name, replica)]
                own = dict(sections)
                own[instance.name] = (sections[instance.name][0], sections[instance.name][1], {**sections[instance.name][2], "port": port})
                env = {**base_env, **self.ray_head.env, "PYTHONUNBUFFERED": "1", "NEMO_GYM_CONFIG_PATH": instance.name,
                       "NEMO_GYM_CONFIG_DICT": config_dict_yaml(self.values, own, head=(head_host, int(head_port)), ray_address=ray_address)}  # fmt: skip
                url = f"http://{host[instance.name]}:{port}"
                server = ServerProcess(instance, log_path(self.run_dir / "logs", instance.name, replica), replica, kind="nemo_gym", url=url,
                                       health_path=LIVENESS_PATH, release=self.releases[instance.name])  # fmt: skip
                with server.log_path.open("ab") as log:
                    server.process = await asyncio.create_subprocess_exec(
                        str(pythons[instance.name]), instance.entrypoint, cwd=instance.implementation_dir, env=env, stdout=log, stderr=log,
                        stdin=asyncio.subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
                self.servers.append(server)
                self.head_app.state.servers[instance.name] = {
                    "name": instance.name, "server_type": instance.server_type, "implementation": instance.implementation, "url": url,
                    "pid": server.process.pid, "replica": replica, "registered_at": time.time(), "external": False, "framework": FRAMEWORK,
                    "send_run_token": False}  # fmt: skip
        write_allowed_peers(self.run_dir, [s.process.pid for s in self.servers if s.kind == "nemo_gym" and s.process])

    def _nemo_gym_sections(self, ports: dict[tuple[str, int], int], host: dict[str, str]) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """Each instance's section of a NeMo Gym server's config dict: its fields with the host and port of its
        replica 0 (ours and external ones as registered, NeMo Gym ones as chosen here)."""
        sections = {}
        for instance in self.instances:
            if instance in self.nemo_gym:
                where = {"host": host[instance.name], "port": ports[(instance.name, 0)]}
            else:
                registered = self.head_app.state.servers.get(instance.name)
                parsed = httpx.URL(registered["url"]) if registered else None
                where = {"host": parsed.host, "port": parsed.port or 80} if parsed else {}
            sections[instance.name] = (instance.server_type, instance.implementation, {**instance.fields, **where})
        return sections

    def spawn_on_ray(self) -> None:
        """With `+ray_address`: one actor per replica; each builds its environment and starts its server on its node."""
        self.ray = RayServers(self.options.ray_address or "auto", run_id=self.run_id, head_url=self.head_url, run_token=self.run_token, skip_venv=self.options.skip_venv)
        print(f"Placing {sum(i.num_replicas for i in self.own)} server process(es) on the Ray cluster at {self.options.ray_address}...", flush=True)
        for instance in self.own:
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
                print(f"ng_run: server {server.label} restarted at {registered['url']} ({node_of(server)})", flush=True)
                server.url, moved = registered["url"], True
        if moved:
            self.write_state()

    def check_alive(self) -> None:
        for server in self.servers:
            if server.process and server.process.returncode is not None:
                raise ServerStartError(died_message(server, self.options.log_lines, f"exited with code {server.process.returncode}"))

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:  # health routes need no token
            while not all(s.healthy for s in self.servers):
                await self.check_alive_async()
                if self.stop_event.is_set():
                    raise KeyboardInterrupt
                if time.monotonic() > deadline:
                    waiting = [s for s in self.servers if not s.healthy]
                    raise ServerStartError("\n\n".join(died_message(s, self.options.log_lines, f"was not healthy after {self.options.startup_timeout_s:.0f} s") for s in waiting))
                for server in self.servers:
                    registered = self.head_app.state.servers.replica(server.instance.name, server.replica)
                    if server.healthy or not registered:
                        continue
                    server.url = registered["url"]
                    try:
                        answer = await http.get(f"{server.url}{server.health_path}")
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
                 "pid": server.process.pid if server.process else None, "url": server.url, "log": str(server.log_path) if server.kind != "external" else None}  # fmt: skip
        if server.kind != "own":
            entry["kind"] = server.kind
        if server.release:
            entry["nemo_gym_version"] = server.release
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
            signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.options.stop_grace_s
        for process in alive:
            try:
                await asyncio.wait_for(process.wait(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        for server in self.servers:  # SIGKILL whatever is left in each group, children included
            if server.process:
                signal_group(server.process.pid, signal.SIGKILL)
                await server.process.wait()
        if self.ray_head is not None:
            await self.ray_head.stop(self.options.stop_grace_s)
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
            where = f"pid {s.process.pid}" if s.process else f"{node_of(s)}, pid {(s.ray_replica.info or {}).get('pid', '?')}" if s.ray_replica else "external"
            if s.release:
                where += f", NeMo Gym {s.release}"
            print(f"  {name:<{width}}  {_shown_folder(s.instance):<40} {s.url}  {where}")
        print(f"Logs: {self.run_dir / 'logs'}. Stop with Ctrl-C. Status: ng_status", flush=True)

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)
        start = time.monotonic()
        try:
            self.write_instances()
            await self.start_head()
            await self.add_external()
            pythons: dict[str, Path] = {}
            if self.options.ray_address:
                self.spawn_on_ray()  # in the main thread: Ray's driver installs its signal handlers there
            else:
                pythons = await self.build_venvs()
                await self.spawn(pythons)
            await self.wait_ready()
            if self.nemo_gym:  # they need every other server's address in their config: started last
                await self.start_nemo_gym_servers(pythons)
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


def _shown_folder(instance: ServerInstance) -> str:
    """How the ready message names a server's code: `<type>/<implementation>` for a folder of this repository,
    else the folder itself (a project's, NeMo Gym's), or `url:` for an external server."""
    if instance.external_urls is not None:
        return f"{instance.server_type}/{instance.implementation} (url:)"
    folder = instance.implementation_dir
    return f"{instance.server_type}/{instance.implementation}" if folder == REPO_ROOT / instance.server_type / instance.implementation else str(folder)


def run_main(loaded: LoadedConfig) -> int:
    """Run the servers of a loaded config until interrupted. Returns the exit status.

    Raises:
        ConfigError: a bad value of ng_run's own keys (an unknown key of `head_server` with a suggestion).
    """
    try:
        options = RunOptions.model_validate(loaded.values)
    except ValidationError as exc:
        raise ConfigError("; ".join(validation_problems(RunOptions, exc, "+{key}"))) from exc
    run = Run(loaded, options)
    return asyncio.run(run.main())
