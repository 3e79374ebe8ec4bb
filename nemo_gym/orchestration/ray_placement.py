"""Placing a run's servers on a Ray cluster: `ng_run +ray_address=<host:port | auto>`.

Each replica of each server instance becomes one Ray actor (`ServerActor`), scheduled by Ray on a node that has
the resources the instance declares (`num_cpus`, default 1; `num_gpus`, default 0; `resources`, Ray custom
resources such as `{"node_b": 1}`; replicas are spread over nodes). The actor builds the server's virtual
environment on its node (cached there, as locally), writes the instance's spec into a node-local run folder
(mode 0700: it holds the config's secrets) and starts `python -m nemo_gym.serving.entrypoint` in it. That process binds
the node's address (the instance's `host` when set), registers with the head server as usual and serves.

Restarts: when the server process exits, its actor exits with an error, and Ray restarts it — on the same
node when it is alive, else on another node with the resources — up to the instance's `max_restarts` times
(default 3); the new server registers its new address with the head server, which replaces the old one for
every client (`nemo_gym.serving.client` re-resolves addresses after a connection failure). When a node dies, its
actors are restarted elsewhere the same way. A server whose restarts are used up stops the run, named with
its last log lines.

Requirements: every node has this repository at the same path with nemo_gym importable by Ray's workers
(the usual shared image or file system), and reaches the head server: on a multi-machine cluster start
ng_run with `+head_server.host=<an address of this machine the nodes reach>`. The run token travels to the
actors as an argument (inside the cluster's object store), never in a log or on a command line.

`RayLauncher` is ng_run's launcher of this kind (`nemo_gym.orchestration.launch`); `RayServers` holds the actors.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_gym.common.errors import ConfigError, ServerStartError
from nemo_gym.common.processes import die_with_parent, signal_group
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.server_processes import ServerProcess, node_of
from nemo_gym.serving.auth import RUN_TOKEN_ENV
from nemo_gym.serving.client import HEAD_URL_ENV
from nemo_gym.serving.entrypoint import REPLICA_ENV
from nemo_gym.serving.server import ServerConfig

if TYPE_CHECKING:
    from nemo_gym.orchestration.launch import RunContext

__all__ = ["RayLauncher", "RayPlacement", "ServerActor", "RayServers", "placement_of"]

RAY_NAMESPACE = "nemo_gym"
TAIL_GRACE_S = 10.0  # how long an actor whose server died waits for ng_run to fetch its last log lines, seconds


class RayPlacement(BaseModel):
    """The placement fields of a server instance (read only with `+ray_address`; declared on `ServerConfig`)."""

    model_config = ConfigDict(extra="ignore")
    num_cpus: float = ServerConfig.model_fields["num_cpus"]
    num_gpus: float = ServerConfig.model_fields["num_gpus"]
    resources: dict[str, float] = ServerConfig.model_fields["resources"]
    max_restarts: int = ServerConfig.model_fields["max_restarts"]


def placement_of(instance: ServerInstance) -> RayPlacement:
    """The instance's placement fields, validated.

    Raises:
        ConfigError: a bad value, naming the YAML key.
    """
    try:
        return RayPlacement.model_validate(instance.fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        raise ConfigError(
            f"{instance.source}: key '{instance.name}.{instance.server_type}.{instance.implementation}.{key}':"
            f" {error['msg']} (got {error.get('input')!r})"
        ) from exc


@dataclass(frozen=True)
class ActorSpec:
    """What a `ServerActor` needs to start its server (plain data: it is sent to the node)."""

    run_id: str
    instance: dict[str, Any]  # ServerInstance fields
    replica: int
    head_url: str
    run_token: str | None
    skip_venv: bool


class ServerActor:
    """One replica of one server on a Ray node (made a Ray actor by `RayServers`; see the module docstring)."""

    def __init__(self, spec: ActorSpec):
        import ray

        self.spec = spec
        self.instance = ServerInstance(**spec.instance)
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.stopping = False
        name = self.instance.name
        suffix = "" if spec.replica == 0 else f".{spec.replica}"
        run_dir = Path(tempfile.gettempdir()) / "nemo_gym_ray" / spec.run_id
        server_dir = run_dir / "servers" / f"{name}{suffix}"  # this replica's own spec file: no race between replicas
        server_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(exist_ok=True)
        for folder in (run_dir, server_dir):
            os.chmod(folder, 0o700)
        self.log_path = run_dir / "logs" / f"{name}{suffix}.log"
        fields = dict(self.instance.fields)
        fields.setdefault("host", self.node_ip)  # reachable from the other nodes, unless the instance says otherwise
        descriptor = os.open(
            server_dir / "instances.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
        )  # holds secrets
        with os.fdopen(descriptor, "w") as handle:
            json.dump({name: {**spec.instance, "fields": fields}}, handle)
        python = Path(sys.executable) if spec.skip_venv else self._ensure_venv()
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", RUN_TOKEN_ENV}}
        env.update(
            {
                "NEMO_GYM_RUN_DIR": str(server_dir),
                "NEMO_GYM_INSTANCE": name,
                REPLICA_ENV: str(spec.replica),
                HEAD_URL_ENV: spec.head_url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if spec.run_token:
            env[RUN_TOKEN_ENV] = spec.run_token
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(python), "-m", "nemo_gym.serving.entrypoint"],
                cwd=self.instance.implementation_dir,
                env=env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.server_exited, self.tail_reported, self.exit_reports = False, threading.Event(), 0
        threading.Thread(target=self._exit_with_server, daemon=True).start()

    def _ensure_venv(self) -> Path:
        from nemo_gym.orchestration.venvs import ensure_venv

        requirements = self.instance.implementation_dir / "requirements.txt"
        return asyncio.run(
            ensure_venv(
                requirements,
                extra_requirements=self.instance.extra_requirement_files,
                log_file=self.log_path.with_suffix(".venv.log"),
            )
        )

    def _exit_with_server(self) -> None:
        """The server process exited: unless we are stopping it, exit this actor with an error so that Ray
        restarts it (a new server process, on this node when it is alive)."""
        code = self.process.wait()
        if self.stopping:
            return
        with self.log_path.open("a") as log:
            log.write(
                f"\n[nemo_gym] server process {self.process.pid} exited with code {code} on node {self.node_ip};"
                " restarting the actor\n"
            )
        self.server_exited = True
        self.tail_reported.wait(TAIL_GRACE_S)  # ng_run polls about every second: let it read why before the actor goes
        os._exit(1)

    def report(self, lines: int) -> dict[str, Any]:
        """`{pid, node_ip, node_id, log, restarted, tail}`: this replica, and the last `lines` lines of its log."""
        import ray

        exited = self.server_exited  # read before the log: then the tail holds everything the server wrote
        with self.log_path.open(errors="replace") as handle:
            tail = "".join(deque(handle, maxlen=lines)).rstrip()
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if exited:
            # ng_run asks again only once it holds the previous answer, so the second report after the exit is the
            # proof that the tail reached it: only then may the actor exit (exiting right after the first one
            # could kill the actor before that answer left it, and ng_run would name no cause).
            self.exit_reports += 1
            if self.exit_reports >= 2:
                self.tail_reported.set()
        return {
            "pid": self.process.pid,
            "node_ip": self.node_ip,
            "node_id": self.node_id,
            "log": str(self.log_path),
            "restarted": restarted,
            "tail": tail,
        }

    def stop(self, grace_s: float) -> int | None:
        """Stop the server's process group: SIGTERM, then SIGKILL after `grace_s` seconds. Returns its exit code."""
        self.stopping = True
        signal_group(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            signal_group(self.process.pid, signal.SIGKILL)
            return self.process.wait()


@dataclass
class _Replica:
    instance: ServerInstance
    replica: int
    actor: Any
    last_tail: str = ""
    info: dict[str, Any] | None = None
    pending: Any = None  # the ObjectRef of the report asked for and not yet read


class RayServers:
    """The actors of one `ng_run` on a Ray cluster.

    Args:
        address: the cluster (`auto`, `host:port`, or `ray://host:port` for Ray Client).
        run_id: the run's id (names the node-local run folders).
        head_url: the head server's URL, as the nodes reach it.
        run_token: the run's token, or None for `+allow_unauthenticated=true`.
        skip_venv: run the servers with the workers' Python instead of their own environments.
    """

    def __init__(self, address: str, *, run_id: str, head_url: str, run_token: str | None, skip_venv: bool = False):
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - ray is in the dev and ray extras
            raise ConfigError("+ray_address needs Ray: pip install 'nemo-gym[ray]'") from exc
        self.ray = ray
        if not ray.is_initialized():
            try:
                ray.init(
                    address=address,
                    namespace=RAY_NAMESPACE,
                    logging_level="WARNING",
                    log_to_driver=False,
                    configure_logging=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"+ray_address={address}: cannot connect to the Ray cluster: {exc}") from exc
        self.run_id, self.head_url, self.run_token, self.skip_venv = run_id, head_url, run_token, skip_venv
        self.replicas: list[_Replica] = []

    def start(self, instance: ServerInstance, replica: int) -> _Replica:
        """Create the actor of one replica (Ray schedules it; the server starts in its constructor)."""
        placement = placement_of(instance)
        spec = ActorSpec(
            self.run_id,
            {
                "name": instance.name,
                "server_type": instance.server_type,
                "implementation": instance.implementation,
                "fields": instance.fields,
                "source": instance.source,
            },
            replica,
            self.head_url,
            self.run_token,
            self.skip_venv,
        )
        options: dict[str, Any] = {
            "name": f"{self.run_id}/{instance.name}/{replica}",
            "num_cpus": placement.num_cpus,
            "num_gpus": placement.num_gpus,
            "max_restarts": placement.max_restarts,
            "max_task_retries": 0,
            "scheduling_strategy": "SPREAD",
        }
        if placement.resources:
            options["resources"] = placement.resources
        actor = self.ray.remote(ServerActor).options(**options).remote(spec)
        entry = _Replica(instance, replica, actor)
        self.replicas.append(entry)
        return entry

    def poll(self, lines: int, wait_s: float = 1.0) -> None:
        """Refresh each replica's info and last log lines (waiting at most `wait_s` seconds); replicas that are
        starting (building their environment) or restarting are skipped until they answer.

        Raises:
            ServerStartError: a replica is dead for good (its restarts used up), with its last log lines.
        """
        ray = self.ray
        for entry in self.replicas:
            if entry.pending is None:
                entry.pending = entry.actor.report.remote(lines)
        ray.wait([e.pending for e in self.replicas], num_returns=len(self.replicas), timeout=wait_s)
        for entry in self.replicas:
            ready, _ = ray.wait([entry.pending], timeout=0)
            if not ready:
                continue
            ref, entry.pending = entry.pending, None
            try:
                entry.info = ray.get(ref)
                entry.last_tail = entry.info.pop("tail")
            except ray.exceptions.ActorUnavailableError:
                continue  # restarting
            except ray.exceptions.RayActorError as exc:
                label = entry.instance.name + (f" (replica {entry.replica})" if entry.replica else "")
                node = f", {entry.info['node_ip']}" if entry.info else ""
                raise ServerStartError(
                    f"server {label!r} ({entry.instance.server_type}/{entry.instance.implementation}) died on its Ray"
                    f" node and its restarts (max_restarts={placement_of(entry.instance).max_restarts}) are used up:"
                    f" {str(exc).splitlines()[0]}\nLast log lines (on its"
                    f" node{node}):\n{entry.last_tail or '(none fetched)'}"
                ) from None

    def stop(self, grace_s: float) -> None:
        """Stop every server process, then the actors (no restart)."""
        ray = self.ray
        pending = [entry.actor.stop.remote(grace_s) for entry in self.replicas]
        deadline = time.monotonic() + grace_s + 10
        for ref in pending:
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                pass  # a dead actor's server died with it (parent-death signal)
        for entry in self.replicas:
            ray.kill(entry.actor, no_restart=True)
        ray.shutdown()


class RayLauncher:
    """Places our own servers on a Ray cluster, one actor per replica (`RayServers`); a
    `nemo_gym.orchestration.launch.Launcher`, in place of `LocalLauncher` with `+ray_address`.

    Args:
        instances: our own server instances; address: the cluster (`auto`, `host:port`, `ray://host:port`);
        skip_venv: run the servers with the workers' Python; log_lines: last log lines fetched of each replica.
    """

    def __init__(self, instances: list[ServerInstance], *, address: str, skip_venv: bool, log_lines: int):
        self.instances, self.address, self.skip_venv, self.log_lines = instances, address, skip_venv, log_lines
        self.servers: list[ServerProcess] = []
        self.ray: RayServers | None = None
        self._polled_at = 0.0  # time.monotonic() of the last poll

    async def start(self, run: RunContext) -> None:
        """One actor per replica; each builds its environment and starts its server on its node. Called in the main
        thread (the event loop's), where Ray's driver installs its signal handlers."""
        self.ray = RayServers(
            self.address, run_id=run.run_id, head_url=run.head_url, run_token=run.run_token, skip_venv=self.skip_venv
        )
        print(
            f"Placing {sum(i.num_replicas for i in self.instances)} server process(es) on the Ray cluster at"
            f" {self.address}...",
            flush=True,
        )
        for instance in self.instances:
            for replica in range(instance.num_replicas):
                server = run.new_server(instance, replica)
                server.ray_replica = self.ray.start(instance, replica)
                self.servers.append(server)

    async def poll(self, run: RunContext, *, now: bool = False) -> bool:
        """The actors' state, at most once a second (`now`: at once): each replica's node, pid and last log lines,
        and the address a restarted replica registered. Returns whether an address changed (for state.json).

        Raises:
            ServerStartError: a replica is dead for good (its restarts used up), with its last log lines.
        """
        if self.ray is None or (not now and time.monotonic() - self._polled_at < 1.0):
            return False
        self._polled_at = time.monotonic()
        await asyncio.to_thread(self.ray.poll, self.log_lines)
        moved = False
        for server in self.servers:
            registered = run.registry.replica(server.instance.name, server.replica)
            if server.healthy and registered and registered["url"] != server.url:
                print(f"ng_run: server {server.label} restarted at {registered['url']} ({node_of(server)})", flush=True)
                server.url, moved = registered["url"], True
        return moved

    async def stop(self, grace_s: float) -> None:
        """Every server process, then the actors (no restart)."""
        if self.ray is not None:
            await asyncio.to_thread(self.ray.stop, grace_s)
