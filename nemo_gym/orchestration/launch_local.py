"""Our own servers as processes on this machine (`LocalLauncher`), each in the virtual environment of its requirements.

One environment per distinct requirements set (`nemo_gym.orchestration.venvs`; none with `+skip_venv=true`: then
every server runs with ng_run's Python). Each replica is `python -m nemo_gym.serving.entrypoint` in its folder, with
the run folder, its instance name and replica index, the head server's URL and the run token in its environment
(never on its command line, which `ps` shows); it binds its own socket and registers with the head server.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.launch import Environment, RunContext, spawn
from nemo_gym.orchestration.server_processes import ServerProcess, stop_processes
from nemo_gym.orchestration.venvs import ensure_venv, requirements_text
from nemo_gym.serving.auth import RUN_TOKEN_ENV, SAME_USER_ENV
from nemo_gym.serving.client import HEAD_URL_ENV
from nemo_gym.serving.entrypoint import REPLICA_ENV

__all__ = ["LocalLauncher", "server_environment"]


def server_environment() -> dict[str, str]:
    """This process's environment for a server process of ours (or its `prefetch` hook): without ng_run's virtual
    environment and Python home, the run token and the same-user switch (each server gets its own)."""
    return {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", RUN_TOKEN_ENV, SAME_USER_ENV}}


class LocalLauncher:
    """Starts `instances` (every replica) as local processes; a `nemo_gym.orchestration.launch.Launcher`.

    Args:
        instances: our own server instances (neither `url:` nor NeMo Gym folders).
        skip_venv: run them with this Python instead of their own environments (development).
        allow_same_user: the servers also accept this user's calls over loopback without the run token.
        extra_env: more environment for every server (the run's `token_id_capture` settings).
    """

    def __init__(
        self,
        instances: list[ServerInstance],
        *,
        skip_venv: bool,
        allow_same_user: bool,
        extra_env: dict[str, str] | None = None,
    ):
        self.instances, self.skip_venv, self.allow_same_user = instances, skip_venv, allow_same_user
        self.extra_env = dict(extra_env or {})
        self.servers: list[ServerProcess] = []

    def environments(self) -> list[Environment]:
        """One environment per distinct requirements set of the instances (none with `skip_venv`)."""
        groups: dict[str, list[ServerInstance]] = {}
        for instance in [] if self.skip_venv else self.instances:
            groups.setdefault(
                requirements_text(instance.implementation_dir / "requirements.txt", instance.extra_requirement_files),
                [],
            ).append(instance)
        return [Environment(tuple(members), functools.partial(_build, members[0])) for members in groups.values()]

    async def start(self, run: RunContext) -> None:
        """Start each replica with the Python of its environment (`run.pythons`, built from `environments`)."""
        base_env = {**server_environment(), **self.extra_env}
        if self.allow_same_user:
            base_env[SAME_USER_ENV] = "1"
        for instance in self.instances:
            python = Path(sys.executable) if self.skip_venv else run.pythons[instance.name]
            for replica in range(instance.num_replicas):
                server = run.new_server(instance, replica)
                env = {
                    **base_env,
                    "NEMO_GYM_RUN_DIR": str(run.run_dir),
                    "NEMO_GYM_INSTANCE": instance.name,
                    REPLICA_ENV: str(replica),
                    HEAD_URL_ENV: run.head_url,
                    "PYTHONUNBUFFERED": "1",
                }
                if run.run_token:  # in the environment, not on the command line: `ps` shows command lines
                    env[RUN_TOKEN_ENV] = run.run_token
                await spawn(
                    server, [str(python), "-m", "nemo_gym.serving.entrypoint"], instance.implementation_dir, env
                )
                self.servers.append(server)

    async def stop(self, grace_s: float) -> None:
        await stop_processes(self.servers, grace_s)


async def _build(instance: ServerInstance, log: Path) -> Path:
    return await ensure_venv(
        instance.implementation_dir / "requirements.txt",
        extra_requirements=instance.extra_requirement_files,
        log_file=log,
    )
