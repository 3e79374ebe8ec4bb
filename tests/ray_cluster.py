"""A real local Ray cluster for tests: a head node and worker nodes started with `ray start`, each its own
process group (so a node can be killed as a machine dies), all on the loopback address 127.0.0.2.

(Ray turns 127.0.0.1 into the machine's network address — `services.resolve_ip_for_localhost` — so the nodes
use another loopback address; traffic stays on this machine's loopback interface.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from nemo_gym.common.processes import signal_group

RAY = Path(sys.executable).parent / "ray"
NODE_IP = "127.0.0.2"
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # the tests move no big objects; keep /dev/shm use small


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The nodes' and the node-counting driver's environment. Token authentication is off unless `extra` turns it
    on: Ray 2.60 turns it on by itself when a token file sits at ~/.ray/auth_token (left by a `ray get-auth-token`
    or another cluster), and the test clusters must not depend on what the machine's home holds."""
    return {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        "RAY_AUTH_MODE": "disabled",
        **(extra or {}),
    }


class RayNode:
    """One `ray start --block` process (its own process group: raylet and its workers)."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self.log = log_path.open("ab")
        command = [
            str(RAY),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={NODE_IP}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            *args,
        ]
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_env(env),
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL the node's whole process group, as when its machine dies."""
        signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def stop(self, grace_s: float = 15.0) -> None:
        if self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class LocalRayCluster:
    """`ray start --head` plus `add_worker(...)` nodes; `address` is what `+ray_address=` takes.

    Args:
        tmp_path: where the node logs go.
        port: the head's GCS port (a free one).
        head_cpus: CPUs the head node offers; head_resources: its custom resources.
        dashboard_port: start the head's dashboard (the Ray Jobs API) on NODE_IP at this port (default: no dashboard).
        env: extra environment of every node and of the driver that counts nodes (e.g. RAY_AUTH_MODE=token and
            RAY_AUTH_TOKEN_PATH for a cluster with token authentication).
    """

    def __init__(
        self,
        tmp_path: Path,
        port: int,
        *,
        head_cpus: int = 2,
        head_resources: dict[str, float] | None = None,
        dashboard_port: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.tmp_path = tmp_path
        self.address = f"{NODE_IP}:{port}"
        self.env = dict(env or {})
        self.temp_dir = (
            Path("/tmp") / f"ray_ng_{os.getpid()}_{port}"
        )  # short: Ray's unix socket paths have a length limit
        self.with_dashboard = dashboard_port is not None
        dashboard = (
            ["--include-dashboard=false"]
            if dashboard_port is None
            else ["--include-dashboard=true", f"--dashboard-host={NODE_IP}", f"--dashboard-port={dashboard_port}"]
        )
        dashboard += self._agent_port_args()
        args = ["--head", f"--port={port}", f"--num-cpus={head_cpus}", *dashboard, f"--temp-dir={self.temp_dir}"]
        if head_resources:
            args.append(f"--resources={json.dumps(head_resources)}")
        self.head = RayNode(args, tmp_path / "ray_head.log", self.env)
        self.workers: list[RayNode] = []
        try:
            self.wait_nodes(1)
        except BaseException:  # no cluster object reaches the caller: stop the head here, or it outlives the test
            self.stop()
            raise

    def add_worker(self, cpus: int, resources: dict[str, float] | None = None) -> RayNode:
        args = [f"--address={self.address}", f"--num-cpus={cpus}", *self._agent_port_args()]
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        node = RayNode(args, self.tmp_path / f"ray_worker_{len(self.workers)}.log", self.env)
        self.workers.append(node)
        self.wait_nodes(1 + len(self.workers))
        return node

    def _agent_port_args(self) -> list[str]:
        """With the dashboard (the Ray Jobs API), each node's dashboard agent serves HTTP on a port that is fixed by
        default (52365): the nodes share this machine's NODE_IP, so each gets free ports of its own. The agent's other
        ports are given too: with dynamic ones the raylet waits (15 s) for the agent to report them and aborts when a
        loaded machine starts the agent more slowly."""
        if not self.with_dashboard:
            return []
        flags = [
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
        ]
        sockets = [socket.socket() for _ in flags]
        try:
            for sock in sockets:
                sock.bind((NODE_IP, 0))
            return [f"{flag}={sock.getsockname()[1]}" for flag, sock in zip(flags, sockets)]
        finally:
            for sock in sockets:
                sock.close()

    def alive_nodes(self) -> int:
        """How many nodes the cluster sees alive (asked by a short-lived driver)."""
        code = (
            f"import ray; ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False); print('alive"
            " nodes:', sum(n['Alive'] for n in ray.nodes()))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=_env(self.env), timeout=120
        )
        counts = [
            line.split(":")[1] for line in done.stdout.splitlines() if line.startswith("alive nodes:")
        ]  # (raylet) lines may come too
        return int(counts[-1]) if done.returncode == 0 and counts else 0

    def wait_nodes(self, count: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alive_nodes() < count:
            for node in [self.head, *self.workers]:
                if node.process.poll() is not None:
                    raise RuntimeError(
                        f"ray node exited with {node.process.returncode}:\n{node.log_path.read_text()[-3000:]}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray cluster: fewer than {count} nodes alive after {timeout_s:.0f} s")
            time.sleep(1.0)

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            node.stop()
