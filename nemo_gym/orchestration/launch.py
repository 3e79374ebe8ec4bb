"""What `ng_run`'s launchers share: one launcher per kind of server (`nemo_gym.orchestration.run` picks them).

| launcher | module | servers |
|---|---|---|
| `LocalLauncher` | `launch_local` | our own server folders, as local processes in their virtual environments |
| `RayLauncher` | `ray_placement` | the same, placed on a Ray cluster (`+ray_address`) instead |
| `ExternalLauncher` | `launch_external` | servers named by `url:`: checked and registered, never started |
| `NemoGymLauncher` | `launch_upstream` | NeMo Gym server folders, run unmodified with a NeMo Gym release |

A launcher (`Launcher`) has the `servers` it started or registered, `start(run)` and `stop(grace_s)`; `run` is the
`RunContext` the run gives it once its head server listens. `ng_run` itself keeps what every kind shares: the head
server and the token, the state file, waiting for `/health`, watching the processes, the order of the starts.
Launchers whose servers run in environments of their own also say which (`Environment`): the run builds them all
at once (`build_environments`), before anything starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nemo_gym.common.errors import ServerStartError
from nemo_gym.common.layout import NEMO_GYM_ONLY_SERVER_TYPES
from nemo_gym.common.processes import die_with_parent
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.server_processes import ServerProcess, log_path
from nemo_gym.orchestration.venvs import VenvBuildError
from nemo_gym.serving.head import ServerRegistry
from nemo_gym.serving.nemo_gym_discovery import agent_references, registration_links

__all__ = ["Environment", "Launcher", "RunContext", "build_environments", "register", "spawn"]


@dataclass
class RunContext:
    """What a launcher gets of the run it starts servers for, once the head server listens."""

    run_id: str
    run_dir: Path  # holds logs/ (each server's log), the token file, state.json
    head_url: str
    run_token: str | None  # None with +allow_unauthenticated=true
    registry: ServerRegistry  # the head server's: servers that do not register themselves are registered here
    pythons: dict[str, Path] = field(default_factory=dict)  # instance name -> the Python of its environment

    def new_server(self, instance: ServerInstance, replica: int, **fields: Any) -> ServerProcess:
        """A `ServerProcess` of replica `replica` of `instance`, its log at `logs/<name>[.<replica>].log` (`log_start`:
        that file's size now, so a restarted server's own lines are told from its predecessor's)."""
        path = log_path(self.run_dir / "logs", instance.name, replica)
        start = path.stat().st_size if path.is_file() else 0
        return ServerProcess(instance, path, replica, log_start=start, **fields)


class Launcher(Protocol):
    """One kind of server `ng_run` brings up (see the module docstring)."""

    servers: list[ServerProcess]  # what it started or registered, in order

    async def start(self, run: RunContext) -> None:
        """Start (or register) its servers; they are ready once each answers its health path.

        Raises:
            ServerStartError: one could not be started, named.
        """
        ...

    async def stop(self, grace_s: float) -> None:
        """Stop what it started (SIGTERM, then SIGKILL after `grace_s` seconds); nothing for what it did not."""
        ...


@dataclass(frozen=True)
class Environment:
    """A virtual environment a launcher needs and the servers that run in it."""

    members: tuple[ServerInstance, ...]
    build: Callable[[Path], Awaitable[Path]]  # its log file -> its Python, built if missing (VenvBuildError)
    release: str | None = None  # the NeMo Gym release it installs, if any


async def build_environments(environments: Sequence[Environment], log: Path) -> dict[str, Path]:
    """Build every environment in parallel (reused across runs); returns the Python of each member instance.

    Raises:
        ServerStartError: an environment does not build; the message names its servers and has the installer's error.
    """
    if environments:
        releases = sorted({env.release for env in environments if env.release})
        upstream = sum(len(env.members) for env in environments if env.release)
        extra = f"; NeMo Gym {', '.join(releases)} for {upstream} NeMo Gym server(s)" if releases else ""
        servers = sum(len(env.members) for env in environments)
        print(
            f"Preparing {len(environments)} environment(s) for {servers} server(s) (built once, then reused{extra})...",
            flush=True,
        )

    async def build(env: Environment) -> Path:
        try:
            return await env.build(log)
        except VenvBuildError as exc:
            names = ", ".join(f"{m.name!r} ({m.implementation_dir})" for m in env.members)
            raise ServerStartError(
                f"the environment of server {names} could not be built (log: {log}):\n{exc}"
            ) from None

    pythons = await asyncio.gather(*(build(env) for env in environments))
    return {i.name: python for env, python in zip(environments, pythons) for i in env.members}


async def spawn(server: ServerProcess, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Start `server.process`: `argv` in `cwd` with exactly `env`, its output to `server.log_path`, in a process group
    of its own (stopping it stops its children, e.g. vLLM), sent SIGTERM when ng_run dies (even by SIGKILL)."""
    with server.log_path.open("ab") as log:
        server.process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def register(
    registry: ServerRegistry,
    server: ServerProcess,
    *,
    pid: int,
    external: bool,
    framework: str | None,
    send_run_token: bool,
) -> None:
    """Register a server that does not register itself (an external one, a NeMo Gym one) with the head server. An
    environment server's agent references (`agent_refs`: NeMo Gym 0.7.0's rule, a field `agent_server` or any field
    `{type: responses_api_agents, name}`) go with it: NeMo Gym's collector finds an agent's environment server by
    them (`nemo_gym.serving.nemo_gym_discovery`)."""
    instance = server.instance
    agent_refs = agent_references(instance.fields)
    registry[instance.name] = {
        "name": instance.name,
        "server_type": instance.server_type,
        "implementation": instance.implementation,
        "url": server.url,
        "pid": pid,
        "replica": server.replica,
        "registered_at": time.time(),
        "external": external,
        "framework": framework,
        "send_run_token": send_run_token,
        **registration_links(instance.fields),
        **({"agent_refs": agent_refs} if agent_refs and instance.server_type in NEMO_GYM_ONLY_SERVER_TYPES else {}),
    }
