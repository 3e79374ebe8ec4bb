"""Servers ng_run does not start (`ExternalLauncher`): an instance with `url:` (one URL, or a list of replica URLs).

Each is registered with the head server, so that every client reaches it by instance name, and checked: its
`health_path` (by default `/health`, or `/` for a NeMo Gym server, which has no `/health`) must answer 200 within
`+external_wait_s`. The run token is not sent to it unless `send_run_token: true`. Nothing is started or stopped.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from nemo_gym.common.errors import ServerStartError
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.launch import RunContext, register
from nemo_gym.orchestration.server_processes import ServerProcess
from nemo_gym.orchestration.upstream_servers import LIVENESS_PATH
from nemo_gym.serving.auth import TOKEN_HEADER

__all__ = ["ExternalLauncher"]


class ExternalLauncher:
    """Registers and checks the external servers of `instances`; a `nemo_gym.orchestration.launch.Launcher`.

    Args:
        instances: the instances with `url:` (`ServerInstance.external_urls`).
        wait_s: seconds each may take to answer its health check.
    """

    def __init__(self, instances: list[ServerInstance], *, wait_s: float):
        self.instances, self.wait_s = instances, wait_s
        self.servers: list[ServerProcess] = []

    async def start(self, run: RunContext) -> None:
        """Register every external server with the head server and check that it answers.

        Raises:
            ServerStartError: one did not answer its health check within `wait_s`, named with what it answered.
        """
        for instance in self.instances:
            for replica, url in enumerate(instance.external_urls or []):
                server = run.new_server(instance, replica, kind="external", url=url)
                self.servers.append(server)
                register(
                    run.registry, server, pid=0, external=True, framework=None, send_run_token=instance.send_run_token
                )
        await asyncio.gather(*(self._check(server, run.run_token) for server in self.servers))

    async def _check(self, server: ServerProcess, run_token: str | None) -> None:
        headers = {TOKEN_HEADER: run_token} if run_token and server.instance.send_run_token else {}
        paths = [server.instance.health_path] if server.instance.health_path else ["/health", LIVENESS_PATH]
        deadline, last = time.monotonic() + self.wait_s, "no answer"
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
        raise ServerStartError(
            f"external server {server.label} at {server.url} did not answer {tried} with 200 within {self.wait_s:.0f} s"
            f" (last: {last}). Start it first, fix its `url` (key '{server.instance.key}.url'), or set its"
            " `health_path`."
        )

    async def stop(self, grace_s: float) -> None:
        """Nothing: ng_run did not start them."""
