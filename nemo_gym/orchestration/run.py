"""`ng_run`: start every server of a config, each in its own process and virtual environment.

Start-up: the head server binds first; environments are built (in parallel, once per distinct requirements
set, reused later); each server process binds its own socket and registers its address with the head
server; the run is ready when every server answers `GET /health`. A server that exits is reported by name
with its last log lines and the whole run stops.

Replicas: an instance with `num_replicas: N` runs N processes (env `NEMO_GYM_REPLICA` = 0..N-1, logs
`logs/<name>.log` for replica 0 and `logs/<name>.<i>.log` for the others); each registers under the instance
name with its index, and clients spread calls over them (`nemo_gym.serving.client`). The run is ready when every replica
is healthy; a replica that exits stops the run like any server. SIGINT/SIGTERM stop every process group (SIGTERM, then
SIGKILL after `stop_grace_s`), so no process is left behind.

Launchers: one per kind of server (`nemo_gym.orchestration.launch`), chosen here from the config; `Run` keeps what
they share (the head server, the token, the state file, waiting until ready, watching, stopping).
- Our own servers: local processes in their environments (`launch_local.LocalLauncher`), or, with `+ray_address`,
  Ray actors on a cluster (`ray_placement.RayLauncher`).
- External servers (`url:` instead of code: one URL, or a list of replica URLs) are checked and registered with the
  head server, so every client reaches them by instance name; nothing is started or stopped for them
  (`launch_external.ExternalLauncher`). One that does not answer stops the start, named.
- NeMo Gym server folders (written against NVIDIA NeMo Gym's base classes) run unmodified with a NeMo Gym release
  in their own environment (`launch_upstream.NemoGymLauncher`, `nemo_gym.orchestration.upstream_servers`): started
  once this run's own servers answer (they need every address in their config), with a Ray head of their own, and
  registered by ng_run. Their processes may call this run's servers without the token (`allowed_peers.json`,
  `nemo_gym.serving.auth.PeerPolicy`).

Exposure: every server binds 127.0.0.1 unless configured otherwise, and the servers of a run accept calls
only with the run's random token (`nemo_gym.serving.auth`): it goes to each server in its environment, and to the
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
from typing import Any

import httpx
import psutil
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError, ServerStartError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import LoadedConfig, validation_problems
from nemo_gym.config.server_instances import ServerInstance, server_instances
from nemo_gym.orchestration.launch import Launcher, RunContext, build_environments
from nemo_gym.orchestration.launch_external import ExternalLauncher
from nemo_gym.orchestration.launch_local import LocalLauncher
from nemo_gym.orchestration.launch_upstream import NemoGymLauncher
from nemo_gym.orchestration.ray_placement import RayLauncher
from nemo_gym.orchestration.server_processes import ServerProcess, died_message, node_of
from nemo_gym.orchestration.upstream_servers import DEFAULT_VERSION
from nemo_gym.serving.auth import TOKEN_FILE_NAME, PeerPolicy, new_run_token, write_token_file
from nemo_gym.serving.entrypoint import bind_socket
from nemo_gym.serving.head import DEFAULT_HEAD_PORT, build_head_app, runs_dir
from nemo_gym.serving.limits import UVICORN_LIMITS
from nemo_gym.serving.token_capture import TokenIdCaptureSettings, capture_environment, settings_from_env
from nemo_gym.upstream.detect import FRAMEWORK, framework_of

__all__ = ["RunOptions", "HeadServerOptions", "run_instances", "run_main", "run_options", "split_instances"]


class HeadServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", description="address of the head server (discovery of servers by name)")
    port: int | None = Field(
        None, description=f"port of the head server; default {DEFAULT_HEAD_PORT}, or a free one when that is taken"
    )


class RunOptions(BaseModel):
    """Parameters of `ng_run` (besides the server instances of the config)."""

    model_config = ConfigDict(extra="ignore")
    config_paths: list[str] = Field(
        default_factory=list, description="YAML files with server instances, merged in order"
    )
    head_server: HeadServerOptions = Field(default_factory=HeadServerOptions, description="head server host and port")
    skip_venv: bool = Field(
        False, description="run every server with this Python instead of its own uv environment (development)"
    )
    startup_timeout_s: float = Field(
        1800.0, description="seconds to wait for all servers to answer /health (vLLM may build its engine)"
    )
    stop_grace_s: float = Field(10.0, description="seconds between SIGTERM and SIGKILL when stopping")
    log_lines: int = Field(30, description="how many last log lines to show for a server that died")
    allow_unauthenticated: bool = Field(
        False, description="serve without the per-run token: any local process (of any user) may then call the servers"
    )
    allow_same_user: bool = Field(
        False,
        description=(
            "also accept calls without the run token from this user's processes over loopback (NeMo Gym's own"
            " ng_collect_rollouts cannot send it); browsers and other users still need it"
        ),
    )
    nemo_gym_version: str = Field(
        DEFAULT_VERSION,
        description=(
            "NVIDIA NeMo Gym release that runs NeMo Gym server folders (an instance's own `nemo_gym_version` wins)"
        ),
    )
    external_wait_s: float = Field(
        30.0,
        gt=0,
        description="seconds an external server (`url:`) may take to answer its health check before ng_run stops",
    )
    ray_address: str | None = Field(
        None,
        description=(
            "place the servers on this Ray cluster (`auto`, `host:port`) instead of this machine; see"
            " nemo_gym.orchestration.ray_placement"
        ),
    )
    token_id_capture: TokenIdCaptureSettings = Field(
        default_factory=TokenIdCaptureSettings,
        description=(
            "NeMo Gym 0.7.0's training token capture: the model calls of the agents that take part are recorded with"
            " their token ids (nemo_gym.serving.token_capture)"
        ),
    )


def run_instances(loaded: LoadedConfig) -> list[ServerInstance]:
    """The server instances of a config.

    Raises:
        ConfigError: it has none, or a bad one (named by its YAML key).
    """
    instances = server_instances(loaded)
    if not instances:
        raise ConfigError(
            "no server instances in the config: pass +config_paths=[<server yaml>,...] (see configs/quickstart.yaml)"
        )
    return instances


def split_instances(
    instances: list[ServerInstance],
) -> tuple[list[ServerInstance], list[ServerInstance], list[ServerInstance]]:
    """The instances by the launcher that runs them: external (`url:`), NeMo Gym server folders, our own."""
    external = [i for i in instances if i.external_urls is not None]
    nemo_gym = [i for i in instances if i not in external and framework_of(i) == FRAMEWORK]
    return external, nemo_gym, [i for i in instances if i not in external and i not in nemo_gym]


def run_options(loaded: LoadedConfig) -> RunOptions:
    """ng_run's own options of a loaded config.

    Raises:
        ConfigError: a bad value of ng_run's own keys (an unknown key of `head_server` with a suggestion).
    """
    try:
        return RunOptions.model_validate(loaded.values)
    except ValidationError as exc:
        raise ConfigError("; ".join(validation_problems(RunOptions, exc, "+{key}"))) from exc


class Run:
    """One `ng_run`: the head server, the run token and state file, and one launcher per kind of server
    (`nemo_gym.orchestration.launch`) chosen from the config; waits until every server answers, watches them, stops
    them all."""

    UPSTREAM_PORT_ATTEMPTS = 3  # starts of the NeMo Gym servers when one loses its drawn port (_wait_ready_upstream)

    def __init__(self, loaded: LoadedConfig, options: RunOptions):
        self.options = options
        self.instances = run_instances(loaded)
        external, nemo_gym, own = split_instances(self.instances)
        self.upstream = (
            NemoGymLauncher(
                nemo_gym, everyone=self.instances, values=loaded.values, default_version=options.nemo_gym_version
            )
            if nemo_gym
            else None
        )
        if nemo_gym and options.ray_address:
            names = ", ".join(i.name for i in nemo_gym)
            raise ConfigError(
                f"NeMo Gym server folders ({names}) run on this machine only; +ray_address places our own servers. Run"
                " them without +ray_address, or start them with NeMo Gym's ng_run and name them here by url:"
            )
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.run_dir = runs_dir() / self.run_id
        capture_env = capture_environment(options.token_id_capture, self.run_dir, options.ray_address)
        self.capture_settings = settings_from_env(capture_env)  # None when the run does not capture
        self.external = ExternalLauncher(external, wait_s=options.external_wait_s)
        self.local: LocalLauncher | None = (
            None
            if options.ray_address
            else LocalLauncher(
                own,
                skip_venv=options.skip_venv,
                allow_same_user=options.allow_same_user,
                extra_env=capture_env,
            )
        )
        self.ray = (
            RayLauncher(own, address=options.ray_address, skip_venv=options.skip_venv, log_lines=options.log_lines)
            if options.ray_address
            else None
        )
        self.launchers: list[Launcher] = [
            launcher for launcher in (self.external, self.local, self.ray, self.upstream) if launcher is not None
        ]
        self.stop_event = asyncio.Event()
        self.head_url = ""
        self.run_token = None if options.allow_unauthenticated else new_run_token()
        self.context: RunContext | None = None  # once the head server listens

    @property
    def servers(self) -> list[ServerProcess]:
        """Every server of the run, launcher by launcher in start order (external, own, NeMo Gym)."""
        return [server for launcher in self.launchers for server in launcher.servers]

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
        self.head_app = build_head_app(
            run_token=self.run_token, peers=PeerPolicy(self.run_dir, same_user=self.options.allow_same_user)
        )
        self.head = uvicorn.Server(
            uvicorn.Config(self.head_app, log_level="warning", access_log=False, **UVICORN_LIMITS)
        )
        self.head.install_signal_handlers = lambda: None  # signals are ours
        self.head_task = asyncio.create_task(self.head.serve(sockets=[sock]))
        self.context = RunContext(self.run_id, self.run_dir, self.head_url, self.run_token, self.head_app.state.servers)

    def write_instances(self) -> None:
        self.run_dir.mkdir(parents=True, mode=0o700)
        (self.run_dir / "logs").mkdir()
        path = self.run_dir / "instances.json"
        specs = {
            i.name: {
                "name": i.name,
                "server_type": i.server_type,
                "implementation": i.implementation,
                "fields": i.fields,
                "source": i.source,
            }
            for i in self.instances
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # holds secrets: owner only
        with os.fdopen(fd, "w") as fh:
            json.dump(specs, fh)
        if self.run_token:
            write_token_file(self.run_dir, self.run_token)

    async def start_servers(self) -> None:
        """External servers first (checked), then ours (every environment built first, NeMo Gym's too), then the
        NeMo Gym folders, which need every other server's address in their config; each stage waits until ready."""
        run = self.context
        assert run is not None  # start_head came first
        await self.external.start(run)
        if self.ray is not None:
            await self.ray.start(run)
        else:
            environments = [
                *(self.local.environments() if self.local else []),
                *(self.upstream.environments() if self.upstream else []),
            ]
            run.pythons.update(await build_environments(environments, self.run_dir / "logs" / "venvs.log"))
            await self.local.start(run)
        await self.wait_ready()
        if self.upstream is not None:
            await self.upstream.start(run)
            await self._wait_ready_upstream(run)
        if self.ray is not None:
            await self.ray.poll(run, now=True)  # each replica's node and pid, for state.json

    async def _wait_ready_upstream(self, run: RunContext) -> None:
        """wait_ready for the NeMo Gym servers; when one of them exited because another process took the port drawn
        for it (the window between drawing a port and the server's own bind), they are started again on fresh
        ports, up to UPSTREAM_PORT_ATTEMPTS starts in all.

        Raises:
            ServerStartError: a server died for another reason, or lost its port on every start.
        """
        assert self.upstream is not None
        for attempt in range(1, self.UPSTREAM_PORT_ATTEMPTS + 1):
            try:
                return await self.wait_ready()
            except ServerStartError:
                lost = self.upstream.lost_port()
                if lost is None or attempt == self.UPSTREAM_PORT_ATTEMPTS:
                    raise
                print(
                    f"NeMo Gym server {lost.label} could not listen on {lost.url}: another process took that port"
                    " (address already in use); starting the NeMo Gym servers again on fresh ports...",
                    flush=True,
                )
                await self.upstream.restart(run, self.options.stop_grace_s)

    async def check_alive(self) -> None:
        """Raises ServerStartError for a server process that exited, or (with Ray) a replica whose restarts are used
        up; takes the addresses of restarted Ray replicas into state.json."""
        for server in self.servers:
            if server.process and server.process.returncode is not None:
                raise ServerStartError(
                    died_message(server, self.options.log_lines, f"exited with code {server.process.returncode}")
                )
        if self.ray is not None and await self.ray.poll(self.context):
            self.write_state()

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:  # health routes need no token
            while not all(s.healthy for s in self.servers):
                await self.check_alive()
                if self.stop_event.is_set():
                    raise KeyboardInterrupt
                if time.monotonic() > deadline:
                    waiting = [s for s in self.servers if not s.healthy]
                    raise ServerStartError(
                        "\n\n".join(
                            died_message(
                                s,
                                self.options.log_lines,
                                f"was not healthy after {self.options.startup_timeout_s:.0f} s",
                            )
                            for s in waiting
                        )
                    )
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
        entry = {
            "name": server.instance.name,
            "replica": server.replica,
            "server_type": server.instance.server_type,
            "implementation": server.instance.implementation,
            "pid": server.process.pid if server.process else None,
            "url": server.url,
            "log": str(server.log_path) if server.kind != "external" else None,
        }
        if server.kind != "own":
            entry["kind"] = server.kind
        if server.release:
            entry["nemo_gym_version"] = server.release
        if server.ray_replica is not None:  # the process and its log are on a Ray node
            info = server.ray_replica.info or {}
            entry.update(
                {
                    "pid": info.get("pid"),
                    "log": info.get("log"),
                    "node_id": info.get("node_id"),
                    "node_ip": info.get("node_ip"),
                }
            )
        return entry

    # -- stop ----------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Every launcher stops what it started, all at once (SIGTERM, then SIGKILL after `stop_grace_s`); then the
        head server; the state and token files go."""
        await asyncio.gather(*(launcher.stop(self.options.stop_grace_s) for launcher in self.launchers))
        if hasattr(self, "head"):
            self.head.should_exit = True
            await self.head_task
        (self.run_dir / "state.json").unlink(missing_ok=True)
        (self.run_dir / TOKEN_FILE_NAME).unlink(missing_ok=True)

    def print_ready(self, seconds: float) -> None:
        names = [s.instance.name + (f"[{s.replica}]" if s.instance.num_replicas > 1 else "") for s in self.servers]
        width = max(len(n) for n in names)
        replicas = f" ({len(self.instances)} instances)" if len(self.instances) != len(self.servers) else ""
        print(
            f"All {len(self.servers)} / {len(self.servers)} servers ready in {seconds:.1f} s{replicas}. Head server:"
            f" {self.head_url}"
        )
        for name, s in zip(names, self.servers):
            where = (
                f"pid {s.process.pid}"
                if s.process
                else f"{node_of(s)}, pid {(s.ray_replica.info or {}).get('pid', '?')}"
                if s.ray_replica
                else "external"
            )
            if s.release:
                where += f", NeMo Gym {s.release}"
            print(f"  {name:<{width}}  {_shown_folder(s.instance):<40} {s.url}  {where}")
        if self.capture_settings is not None:
            print(f"Training token capture: the model calls' records go to {self.capture_settings.dir}")
        print(f"Logs: {self.run_dir / 'logs'}. Stop with Ctrl-C. Status: ng_status", flush=True)

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)
        start = time.monotonic()
        try:
            self.write_instances()
            await self.start_head()
            await self.start_servers()
            self.write_state()
            self.head_app.state.ready = True  # the head's /readyz answers 200 from here on
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
                await self.check_alive()
            except ServerStartError as exc:
                print(
                    f"ng_run: {str(exc).replace('exited', 'died while running, exited', 1)}\nStopping all servers.",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            try:
                await asyncio.wait_for(self.stop_event.wait(), 0.5)
            except TimeoutError:
                pass
        print("ng_run: stopping servers...", flush=True)
        return 0


def _shown_folder(instance: ServerInstance) -> str:
    """How the ready message names a server's code: `<type>/<implementation>` for a folder of this repository,
    else the folder itself (a project's, NeMo Gym's), or `url:` for an external server."""
    if instance.external_urls is not None:
        return f"{instance.server_type}/{instance.implementation} (url:)"
    folder = instance.implementation_dir
    return (
        f"{instance.server_type}/{instance.implementation}"
        if folder == REPO_ROOT / instance.server_type / instance.implementation
        else str(folder)
    )


def run_main(loaded: LoadedConfig) -> int:
    """Run the servers of a loaded config until interrupted. Returns the exit status.

    Raises:
        ConfigError: a bad value of ng_run's own keys (an unknown key of `head_server` with a suggestion).
    """
    return asyncio.run(Run(loaded, run_options(loaded)).main())
