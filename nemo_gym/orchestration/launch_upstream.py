"""NeMo Gym server folders run unmodified with a NeMo Gym release (`NemoGymLauncher`; how such a folder runs:
`nemo_gym.orchestration.upstream_servers`).

Their environments (one per release and requirements set) are built with the run's others. They start last, once
the run's own and external servers answer, because each gets every server's address in its config dict: first the
Ray head they connect to, then each replica (`python <entrypoint>` in its folder). ng_run registers them with the
head server (they do not register themselves) and lets their processes call the run's servers without the token
(`allowed_peers.json`, `nemo_gym.serving.auth.PeerPolicy`).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import httpx

from nemo_gym.common.processes import free_ports
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.launch import Environment, RunContext, register, spawn
from nemo_gym.orchestration.server_processes import ServerProcess, stop_processes
from nemo_gym.orchestration.upstream_servers import (
    LIVENESS_PATH,
    RayHead,
    config_dict_yaml,
    ensure_release_venv,
    release_requirements,
    release_version,
)
from nemo_gym.serving.auth import RUN_TOKEN_ENV, SAME_USER_ENV, write_allowed_peers
from nemo_gym.upstream.detect import FRAMEWORK

__all__ = ["NemoGymLauncher"]

Section = tuple[
    str, str, dict[str, Any]
]  # (server type, implementation, fields) of an instance in a NeMo Gym config dict


class NemoGymLauncher:
    """Starts the NeMo Gym server folders of a run; a `nemo_gym.orchestration.launch.Launcher`.

    Args:
        instances: the NeMo Gym server folders (`nemo_gym.upstream.detect.framework_of`).
        everyone: every instance of the run (each NeMo Gym server's config dict names them all), `values` the
            resolved config.
        default_version: the NeMo Gym release of an instance without its own `nemo_gym_version`.

    Raises:
        ConfigError: (on construction) an instance's `nemo_gym_version` is not a version number.
    """

    def __init__(
        self,
        instances: list[ServerInstance],
        *,
        everyone: list[ServerInstance],
        values: dict[str, Any],
        default_version: str,
    ):
        self.instances, self.everyone, self.values = instances, everyone, values
        self.releases = {i.name: release_version(i, default_version) for i in instances}
        self.servers: list[ServerProcess] = []
        self.ray_head: RayHead | None = None
        self.ray_address = ""

    def environments(self) -> list[Environment]:
        """One environment per (release, requirements) pair of the instances."""
        groups: dict[tuple[str, ...], list[ServerInstance]] = {}
        for instance in self.instances:
            groups.setdefault(
                (self.releases[instance.name], *release_requirements(instance.implementation_dir)), []
            ).append(instance)
        return [
            Environment(tuple(members), functools.partial(_build, key[0], list(key[1:])), release=key[0])
            for key, members in groups.items()
        ]

    async def start(self, run: RunContext) -> None:
        """The Ray head, then each replica with its config dict; registered, and allowed to call without the token."""
        python = run.pythons[self.instances[0].name]
        self.ray_head = RayHead(python.parent / "ray", run.run_dir)
        print(
            f"Starting a Ray head for {len(self.instances)} NeMo Gym server(s) (log: {self.ray_head.log_path})...",
            flush=True,
        )
        self.ray_address = await self.ray_head.start()
        await self._start_servers(run)

    def lost_port(self) -> ServerProcess | None:
        """A server of ours that exited because another process held the port drawn for it (its log since its start
        says "address already in use"), else None. A port set in the config (`port:`) does not count: drawing again
        would not change it."""
        for server in self.servers:
            if (
                server.process is not None
                and server.process.returncode is not None
                and not _configured_port(server.instance)
                and ADDRESS_IN_USE.search(_log_since(server.log_path, server.log_start))
            ):
                return server
        return None

    async def restart(self, run: RunContext, grace_s: float) -> None:
        """Stop every NeMo Gym server (each one's config dict names the others' ports, so all move together) and start
        them again on freshly drawn ports; the Ray head stays."""
        await stop_processes(self.servers, grace_s)
        self.servers = []
        await self._start_servers(run)

    async def _start_servers(self, run: RunContext) -> None:
        assert self.ray_head is not None
        drawn = iter(free_ports(sum(i.num_replicas for i in self.instances if not _configured_port(i))))
        ports = {(i.name, r): _configured_port(i) or next(drawn) for i in self.instances for r in range(i.num_replicas)}
        host = {i.name: str(i.fields.get("host") or "127.0.0.1") for i in self.instances}
        sections = self._sections(run, ports, host)
        head_host, head_port = run.head_url.removeprefix("http://").rsplit(":", 1)
        base_env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", RUN_TOKEN_ENV, SAME_USER_ENV, "RAY_ADDRESS"}
        }
        for instance in self.instances:
            for replica in range(instance.num_replicas):
                port = ports[(instance.name, replica)]
                server_type, implementation, fields = sections[instance.name]
                own = {**sections, instance.name: (server_type, implementation, {**fields, "port": port})}
                env = {
                    **base_env,
                    **self.ray_head.env,
                    "PYTHONUNBUFFERED": "1",
                    "NEMO_GYM_CONFIG_PATH": instance.name,
                    "NEMO_GYM_CONFIG_DICT": config_dict_yaml(
                        self.values, own, head=(head_host, int(head_port)), ray_address=self.ray_address
                    ),
                }
                server = run.new_server(
                    instance,
                    replica,
                    kind="nemo_gym",
                    url=f"http://{host[instance.name]}:{port}",
                    health_path=LIVENESS_PATH,
                    release=self.releases[instance.name],
                )
                await spawn(
                    server, [str(run.pythons[instance.name]), instance.entrypoint], instance.implementation_dir, env
                )
                self.servers.append(server)
                register(
                    run.registry,
                    server,
                    pid=server.process.pid,
                    external=False,
                    framework=FRAMEWORK,
                    send_run_token=False,
                )
        write_allowed_peers(run.run_dir, [s.process.pid for s in self.servers if s.process])

    def _sections(self, run: RunContext, ports: dict[tuple[str, int], int], host: dict[str, str]) -> dict[str, Section]:
        """Each instance's section of a NeMo Gym server's config dict: its fields with the host and port of its
        replica 0 (ours and external ones as registered, NeMo Gym ones as chosen here)."""
        sections = {}
        for instance in self.everyone:
            if instance in self.instances:
                where = {"host": host[instance.name], "port": ports[(instance.name, 0)]}
            else:
                registered = run.registry.get(instance.name)
                parsed = httpx.URL(registered["url"]) if registered else None
                where = {"host": parsed.host, "port": parsed.port or 80} if parsed else {}
            sections[instance.name] = (instance.server_type, instance.implementation, {**instance.fields, **where})
        return sections

    async def stop(self, grace_s: float) -> None:
        """Their processes, then the Ray head."""
        await stop_processes(self.servers, grace_s)
        if self.ray_head is not None:
            await self.ray_head.stop(grace_s)


# how a server that could not bind its port says so: Python's OSError (errno 98), uvicorn's message
ADDRESS_IN_USE = re.compile(r"address already in use|\[Errno 98\]|EADDRINUSE", re.IGNORECASE)


def _configured_port(instance: ServerInstance) -> int:
    """The port an instance's config sets (`port:`), 0 when it sets none (one is drawn)."""
    return int(instance.fields.get("port") or 0)


def _log_since(path: Path, start: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


async def _build(release: str, requirements: list[str], log: Path) -> Path:
    return await ensure_release_venv(release, requirements, log_file=log)
