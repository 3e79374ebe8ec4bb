"""The processes of `ng_run` (`nemo_gym.orchestration.run`): each server process with its log (`ServerProcess`, `tail`,
how it died), and ng_run itself as the child process of a command that needs servers a while (`NgRunProcess`: ng_train,
ng_try)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.common.errors import ServerStartError
from nemo_gym.common.processes import die_with_parent, free_port, signal_group
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.serving.client import ServerClient

__all__ = [
    "READY_LINE",
    "NgRunProcess",
    "ServerProcess",
    "died_message",
    "log_path",
    "node_of",
    "stop_processes",
    "tail",
]


@dataclass
class ServerProcess:
    """One server process of a run (or an external server it registered), with its log and its health."""

    instance: ServerInstance
    log_path: Path
    replica: int = 0
    process: asyncio.subprocess.Process | None = None
    url: str | None = None
    healthy: bool = False
    ray_replica: Any = None  # with +ray_address: its actor (nemo_gym.orchestration.ray_placement)
    started_at: float = field(default_factory=time.time)
    # "own": our server process; "external": a `url:` server; "nemo_gym": a NeMo Gym folder run with a release
    kind: str = "own"
    health_path: str = "/health"
    release: str | None = None  # the NeMo Gym release of a "nemo_gym" server
    log_start: int = 0  # bytes in log_path before this process started: what it wrote comes after

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


def node_of(server: ServerProcess) -> str:
    """`node <ip> <id prefix>` of a Ray-placed server, as last reported."""
    info = (server.ray_replica.info or {}) if server.ray_replica is not None else {}
    return f"node {info.get('node_ip', '?')} {str(info.get('node_id', '?'))[:8]}"


def died_message(server: ServerProcess, lines: int, what: str) -> str:
    """`server ... exited ...` with the last `lines` lines of its log (as last fetched from its Ray node when placed
    there)."""
    if server.ray_replica is not None:  # the log is on the server's Ray node: its last lines as last fetched
        where, log = (
            f"on Ray {node_of(server)}: {(server.ray_replica.info or {}).get('log', '?')}",
            server.ray_replica.last_tail,
        )
    else:
        where, log = str(server.log_path), tail(server.log_path, lines)
    return (
        f"server {server.label} ({server.instance.server_type}/{server.instance.implementation}) {what}.\nLast log"
        f" lines ({where}):\n{log or '(empty log)'}"
    )


async def stop_processes(servers: list[ServerProcess], grace_s: float) -> None:
    """Stop the process group of each server that has a process: SIGTERM to every one at once, then, after at most
    `grace_s` seconds, SIGKILL to whatever is left in each group (children included)."""
    alive = [s.process for s in servers if s.process and s.process.returncode is None]
    for process in alive:
        signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in alive:
        try:
            await asyncio.wait_for(process.wait(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            pass
    for server in servers:
        if server.process:
            signal_group(server.process.pid, signal.SIGKILL)
            await server.process.wait()


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

    def __init__(
        self,
        argv: list[str],
        head_server_url: str | None,
        log_path: Path,
        startup_timeout_s: float = 1800.0,
        *,
        caller: str,
        poll_s: float = 0.5,
    ):
        self.process: subprocess.Popen | None = None
        self.caller = caller
        if head_server_url:
            self.head_url = head_server_url.rstrip("/")
            return
        port = free_port()
        self.head_url = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_start = (
            log_path.stat().st_size if log_path.is_file() else 0
        )  # an earlier run's lines (a resumed ng_train) do not count
        command = [
            sys.executable,
            "-c",
            "import sys; from nemo_gym.config.commands import main; sys.exit(main('run'))",
            *argv,
            f"++head_server.port={port}",
        ]
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        print(
            f"{caller}: started ng_run (pid {self.process.pid}, head {self.head_url}, log {log_path}); waiting for its"
            " servers...",
            flush=True,
        )
        try:
            self._wait_ready(startup_timeout_s, log_path, log_start, poll_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float, log_path: Path, log_start: int, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerStartError(
                    f"ng_run exited with code {self.process.returncode}; last lines of"
                    f" {log_path}:\n{tail(log_path, 30)}"
                )
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
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
