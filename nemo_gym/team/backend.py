"""The Ray side of `ng_serve`: a cluster connection (or a local head it starts) and Ray Jobs.

Runs are Ray jobs submitted with `ray.job_submission.JobSubmissionClient` to the cluster's dashboard (the Ray
Jobs API): the uploaded project folder is the job's `runtime_env.working_dir` (Ray packs it and ships it to the
node), the entrypoint is `python -m nemo_gym.team.job ...` (see nemo_gym.team.job). Logs come from
`get_job_logs` / `tail_job_logs`; a stop is `stop_job` (SIGTERM to the entrypoint's processes, SIGKILL after
`stop_wait_s`, which the job's `RAY_JOB_STOP_WAIT_TIME_S` sets, so a trainer has time to save final/).

The server is also a Ray driver (`ray.init`): files on the node of a run (the stop request, the final model) are
reached by zero-CPU Ray tasks pinned to that node (`NodeAffinitySchedulingStrategy`, hard).

Security: Ray's dashboard and job API run code for whoever reaches them. The local head started here (`ray start
--head`, its own process group, stopped with the server) serves the dashboard / job API on 127.0.0.1 only, and has
Ray's token authentication on (`RAY_AUTH_MODE=token`; the token is a 256-bit random value in
`<data_dir>/ray_auth_token`, mode 0600, passed by path, never printed), which Ray's gRPC services (GCS, raylet,
agents) also require: those listen on every interface, as Ray's do, and so do two Prometheus metrics endpoints
(autoscaler, dashboard: read-only metrics, no token). Firewall them on a shared network. For `+ray_address=` (an
existing cluster) the cluster's own settings apply: the server warns when its job API answers without a token.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from nemo_gym.common.errors import ConfigError, NemoGymError
from nemo_gym.common.processes import signal_group
from nemo_gym.team import job as job_module

__all__ = ["RunState", "RayBackend", "ray_status_to_run_status"]

log = logging.getLogger("nemo_gym.serving.entrypoint")

RunState = str  # pending | running | stopped | finished | failed | unknown
TERMINAL = frozenset({"stopped", "finished", "failed"})
_STATUS = {
    "PENDING": "pending",
    "RUNNING": "running",
    "STOPPED": "stopped",
    "SUCCEEDED": "finished",
    "FAILED": "failed",
}


def ray_status_to_run_status(status: Any) -> RunState:
    """Ray's JobStatus (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED) as a run status (as ng_runs lists them)."""
    return _STATUS.get(str(getattr(status, "value", status)), "unknown")


class RayBackend:
    """A Ray cluster connection and its job submission client.

    Args:
        data_dir: the server's data folder (the Ray token file of a local head goes there).
        ray_address: an existing cluster's GCS address (`HOST:PORT`, as `ng_run +ray_address=` takes); None starts
            a local head on 127.0.0.1 owned by this process.
        dashboard_port: the local head's dashboard (Ray Jobs API) port (0: a free one).
        num_cpus: CPUs the local head offers to runs (None: all).
        python: the Python the job entrypoint runs (nemo_gym must be installed there on every node).
        entrypoint_num_cpus: CPUs Ray reserves for a run's entrypoint (> 0 lets Ray place it on any node).
        stop_wait_s: seconds between the stop's SIGTERM and Ray's SIGKILL.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        ray_address: str | None,
        dashboard_port: int = 0,
        num_cpus: int | None = None,
        python: str = sys.executable,
        entrypoint_num_cpus: float = 1.0,
        stop_wait_s: int = 600,
    ):
        self.data_dir = data_dir
        self.ray_address = ray_address
        self.dashboard_port = dashboard_port
        self.num_cpus = num_cpus
        self.python = python
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.stop_wait_s = stop_wait_s
        self.client: Any = None
        self.dashboard_url: str | None = None
        self._head: subprocess.Popen | None = None
        self._dashboard_port = dashboard_port

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect to (or start) the cluster and its job API.

        Raises:
            ConfigError: Ray or its job API (`ray[default]`) is not installed, or the cluster cannot be reached.
        """
        if self.ray_address is None:
            self._enable_local_token_auth()  # before Ray is imported: it reads RAY_AUTH_MODE once, at import
        try:
            import ray
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise ConfigError(
                "ng_serve needs Ray with its job API: pip install 'nemo-gym[ray]' (ray[default])"
            ) from exc
        where = (
            f"the Ray cluster at {self.ray_address}"
            if self.ray_address
            else f"the local Ray head (log: {self.data_dir / 'ray_head.log'})"
        )
        for attempt in range(1 if self.ray_address else HEAD_START_ATTEMPTS):
            address = self.ray_address or self._start_local_head()

            def init(address: str = address) -> Any:
                if self._head is not None and self._head.poll() is not None:
                    raise _HeadExited(
                        f"ng_serve: the local Ray head exited with {self._head.returncode}; see"
                        f" {self.data_dir / 'ray_head.log'}"
                    )
                return ray.init(
                    address=address, namespace="nemo_gym_serve", logging_level=logging.ERROR, log_to_driver=False
                )

            try:
                context = _retry(init, what=where, timeout_s=180.0 if self.ray_address is None else 30.0)
                break
            except (
                _HeadExited
            ):  # Ray 2.60's raylet gives up when its dashboard agent starts slower than 15 s (a loaded machine)
                assert self._head is not None
                signal_group(self._head.pid, signal.SIGKILL)  # what the failed `ray start` left (GCS, dashboard)
                if attempt == HEAD_START_ATTEMPTS - 1:
                    raise
        if self.ray_address is None:
            self.dashboard_url = f"http://127.0.0.1:{self._dashboard_port}"  # its own: known before Ray registers it
        elif context.dashboard_url:
            self.dashboard_url = f"http://{context.dashboard_url}"
        else:
            raise ConfigError(
                "ng_serve: the Ray cluster has no dashboard, which serves the Ray Jobs API; start its head with the"
                " dashboard (ray[default])"
            )
        self.client = _retry(
            lambda: JobSubmissionClient(self.dashboard_url), what=f"the Ray Jobs API at {self.dashboard_url}"
        )
        if self.ray_address is not None:
            self._warn_if_dashboard_open()

    def _start_local_head(self) -> str:
        """`ray start --head --block` in its own process group, every port chosen free (Ray's fixed defaults, such
        as the dashboard agent's 52365, clash with other Ray instances on the machine); the dashboard on 127.0.0.1.
        Returns the GCS address."""
        self._dashboard_port = self.dashboard_port or _free_port()
        ports = {
            name: _free_port()
            for name in (
                "port",
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
            )
        }
        command = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self._dashboard_port}",
            *(f"--{k}={v}" for k, v in ports.items()),
        ]
        if self.num_cpus is not None:
            command.append(f"--num-cpus={self.num_cpus}")
        with open(self.data_dir / "ray_head.log", "ab") as log:
            self._head = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
            )
        return f"127.0.0.1:{ports['port']}"

    def _enable_local_token_auth(self) -> None:
        """Ray token authentication for the local head: RAY_AUTH_MODE=token with a 0600 token file (by path)."""
        token_file = self.data_dir / "ray_auth_token"
        if not token_file.is_file():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))  # the format `ray get-auth-token --generate` writes
        os.chmod(token_file, 0o600)
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
        os.environ.pop("RAY_AUTH_TOKEN", None)  # the file is the one source
        if (
            "ray._raylet" in sys.modules
        ):  # imported already (an embedding process): refresh its config, as ray.init does
            from ray._raylet import Config

            Config.initialize("")

    def _warn_if_dashboard_open(self) -> None:
        try:
            answer = httpx.get(f"{self.dashboard_url}/api/jobs/", timeout=10.0, trust_env=False)
        except httpx.HTTPError:
            return
        if answer.status_code == 200:
            print(
                f"ng_serve: WARNING: the Ray Jobs API at {self.dashboard_url} answers without a token: anyone who"
                " reaches it can run code on the cluster. Start the cluster with RAY_AUTH_MODE=token"
                " (https://docs.ray.io/en/latest/ray-security/token-auth.html).",
                file=sys.stderr,
                flush=True,
            )

    def shutdown(self) -> None:
        """Disconnect; stop the local head this server started (SIGTERM to its process group, SIGKILL after 30 s)."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        if self._head is not None and self._head.poll() is None:
            signal_group(self._head.pid, signal.SIGTERM)
            try:
                self._head.wait(30)
            except subprocess.TimeoutExpired:
                signal_group(self._head.pid, signal.SIGKILL)
                self._head.wait()

    # -- jobs ----------------------------------------------------------------------------------------------------
    def submit(self, run_id: str, kind: str, argv: list[str], working_dir: Path, metadata: dict[str, str]) -> str:
        """Submit a run as a Ray job; returns its submission id (`ng-<run id>`)."""
        submission_id = f"ng-{run_id}"
        self.client.submit_job(
            entrypoint=job_module.entrypoint(self.python, kind, run_id, argv),
            submission_id=submission_id,
            runtime_env={
                "working_dir": str(working_dir),
                "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(self.stop_wait_s), "PYTHONUNBUFFERED": "1"},
            },
            metadata=metadata,
            entrypoint_num_cpus=self.entrypoint_num_cpus,
        )
        return submission_id

    def jobs(self) -> dict[str, Any]:
        """Every submitted job's details by submission id (one call to the job API)."""
        return {job.submission_id: job for job in self.client.list_jobs() if job.submission_id}

    def job(self, submission_id: str) -> Any | None:
        """The job's details, or None when Ray has no such job (deleted from Ray, or from a former cluster)."""
        try:
            return self.client.get_job_info(submission_id)
        except RuntimeError:
            return None

    def logs(self, submission_id: str) -> str:
        try:
            return self.client.get_job_logs(submission_id)
        except RuntimeError:
            return ""

    async def tail(self, submission_id: str) -> AsyncIterator[str]:
        """New log text until the job ends (Ray's websocket tail)."""
        async for chunk in self.client.tail_job_logs(submission_id):
            yield chunk

    def request_stop(self, run_id: str, submission_id: str, node_id: str | None, save_model: bool) -> None:
        """stop.json on the run's node (when it has one), then Ray's stop (SIGTERM)."""
        if node_id:
            self._on_node(node_id, job_module.write_stop_request_on_node, run_id, save_model)
        self.client.stop_job(submission_id)

    def delete(self, run_id: str, submission_id: str, node_id: str | None) -> None:
        """Remove the job from Ray and the run's folder from its node (best effort for the folder)."""
        if node_id:
            try:
                self._on_node(node_id, job_module.remove_run_dir_on_node, run_id)
            except NemoGymError as exc:
                log.warning("run %s: its folder on node %s was not removed: %s", run_id, node_id, exc)
        try:
            self.client.delete_job(submission_id)
        except RuntimeError as exc:
            log.warning("run %s: Ray did not delete job %s: %s", run_id, submission_id, exc)

    def fetch_final(self, run_id: str, node_id: str | None) -> bytes | None:
        """The run's final/ folder as tar bytes (from its node), or None when it has none."""
        if not node_id:
            return None
        return self._on_node(node_id, job_module.pack_final_on_node, run_id)

    def _on_node(self, node_id: str, function: Any, *args: Any, timeout_s: float = 300.0) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(
            num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        )(function)
        try:
            return ray.get(task.remote(*args), timeout=timeout_s)
        except Exception as exc:  # the node is gone (TaskUnschedulableError), the task failed or timed out
            raise NemoGymError(f"cannot reach the run's node {node_id[:12]}: {type(exc).__name__}: {exc}") from exc


HEAD_START_ATTEMPTS = 3


class _HeadExited(ConfigError):
    """The local Ray head exited while starting."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _retry(make: Any, what: str, timeout_s: float = 60.0) -> Any:
    """`make()` until it succeeds (the dashboard starts a few seconds after the head) or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return make()
        except ConfigError:
            raise
        except Exception as exc:  # requests' ConnectionError, Ray's RuntimeError while the job API starts
            if time.monotonic() > deadline:
                raise ConfigError(f"ng_serve: {what} did not answer within {timeout_s:.0f} s: {exc}") from exc
            time.sleep(1.0)
