"""Servers written for NVIDIA NeMo Gym, run unmodified by our `ng_run`.

A server folder whose entrypoint is written against NeMo Gym's base classes (`from nemo_gym.base_resources_server
import SimpleResourcesServer`, ...) cannot run on our `nemo_gym` package, which has other modules under the same
name. `ng_run` runs such a folder as NeMo Gym's own `ng_run` would, in an environment of its own with a NeMo Gym
release from the package index:

- **Recognised** by the instance field `framework: nemo_gym`, or, when the field is not set, by its entrypoint
  importing a module of NeMo Gym's package that ours does not have (`nemo_gym.base_resources_server`,
  `nemo_gym.server_utils`, `nemo_gym.openai_utils`, ...), directly or through a server folder of its own tree
  (`from resources_servers.mcqa.app import ...`, as NeMo Gym's gpqa_diamond does; `detect_framework`).
- **Environment**: the release `nemo_gym_version` (instance field, else ng_run's `+nemo_gym_version`, default
  `DEFAULT_VERSION`) plus the folder's `requirements.txt` without the lines that install NeMo Gym from its own
  checkout (those naming `../..`, e.g. `-e nemo-gym[dev] @ ../../`): what NeMo Gym's ng_run installs for a server
  when NeMo Gym itself is an installed release. NeMo Gym declares `Requires-Python >=3.12`; on an older Python
  the release's own dependencies are installed as usual (each keeps its own Python check) and the release itself
  with pip's `--ignore-requires-python` (the install `../shared/bench/setup_nemo_gym.sh` documents: 0.4.0's
  modules run on 3.11). One environment per (release, requirements) pair, built once and reused.
- **Start**: `python <entrypoint>` in its folder, with `NEMO_GYM_CONFIG_DICT` (the resolved config as YAML, where
  every instance has the `host` and `port` it listens on, plus `head_server`, `ray_head_node_address` and
  `dry_run: false`) and `NEMO_GYM_CONFIG_PATH` (its instance name), which is how NeMo Gym passes a server its
  config and the addresses of the servers it calls. A NeMo Gym server connects to a Ray cluster when it starts;
  `RayHead` is the one ng_run starts for them (from the release's environment, Ray token authentication on).
- **Liveness**: NeMo Gym 0.4.0 servers answer `GET /` (they have no `/health`).

Facts about NeMo Gym 0.4.0 come from its wheel (`../shared/peer_data/nemo_gym/HOW_NEMO_GYM_0.4.0_RUNS_A_SERVER.md`).
"""

from __future__ import annotations

import asyncio
import email.parser
import hashlib
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet

from nemo_gym.common.errors import ConfigError, ServerStartError
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.common.processes import die_with_parent, free_ports, signal_group
from nemo_gym.config.server_instances import FRAMEWORKS, ServerInstance
from nemo_gym.orchestration.venvs import (
    COMPILE_BYTECODE,
    VenvBuildError,
    ensure_built,
    find_links_args,
    run_logged,
    uv_executable,
)
from nemo_gym.upstream.detect import detect_release

__all__ = [
    "DEFAULT_VERSION",
    "LIVENESS_PATH",
    "release_requirements",
    "ensure_release_venv",
    "config_dict_yaml",
    "RayHead",
]

DEFAULT_VERSION = "0.4.0"  # the newest release this project is tested against (and that installs on Python 3.11)
LIVENESS_PATH = "/"  # NeMo Gym 0.4.0's liveness route: GET / answers {"status": "ok"}
CONFIG_DICT_ENV = "NEMO_GYM_CONFIG_DICT"
CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"
# instance fields of ours that a NeMo Gym server is not given (placement, our framework switches; `framework` only
# with a value of ours: another is the server's own field, e.g. 0.7.0's tales server's `framework: textworld`)
OWN_FIELDS = frozenset(
    {
        "framework",
        "nemo_gym_version",
        "implementation_dir",
        "url",
        "health_path",
        "send_run_token",
        "num_replicas",
        "num_cpus",
        "num_gpus",
        "resources",
        "max_restarts",
    }
)
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+)?(\.dev[0-9]+)?$")


def release_version(instance: ServerInstance, default: str) -> str:
    """The NeMo Gym release an instance runs with: its field `nemo_gym_version`, else the release its folder needs
    (`nemo_gym.upstream.detect.detect_release`: its tree's release, or 0.7.0 for an environment server or a folder
    importing what 0.4.0 lacks), else `default`.

    Raises:
        ConfigError: not a version number (e.g. `0.4.0`), naming the YAML key.
    """
    version = str(instance.fields.get("nemo_gym_version") or detect_release(instance) or default)
    if not _VERSION.match(version):
        raise ConfigError(
            f"{instance.source}: key"
            f" '{instance.name}.{instance.server_type}.{instance.implementation}.nemo_gym_version': {version!r} is not"
            f" a release number; write e.g. nemo_gym_version: {DEFAULT_VERSION}"
        )
    return version


def release_requirements(folder: Path) -> list[str]:
    """The folder's requirements.txt lines (comments and blanks dropped) without those that install NeMo Gym from
    its checkout (lines naming `../..`, e.g. `-e nemo-gym[dev] @ ../../`): NeMo Gym's ng_run drops the same lines
    when NeMo Gym is an installed release (`grep -v -F '../..'`)."""
    path = folder / "requirements.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = []
    for line in lines:
        text = line.split(" #", 1)[0].strip()
        if text and not text.startswith("#") and "../.." not in text:
            kept.append(text)
    return kept


def release_venv_name(version: str, requirements: list[str]) -> str:
    """Folder name (under the venvs folder) of the environment for a release and a requirements list."""
    blob = "\n".join([f"{sys.version_info.major}.{sys.version_info.minor}", version, *sorted(requirements)])
    return f"nemo_gym-{version}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


async def ensure_release_venv(
    version: str, requirements: list[str], *, log_file: Path | None = None, timeout_s: float = 1800
) -> Path:
    """The Python of an environment with NeMo Gym release `version` and `requirements`; built if missing.

    Raises:
        VenvBuildError: the release is not on the package index (the message lists the releases that are), or a
            requirement does not install (the installer's last lines are in the message).
    """

    async def build(root: Path) -> str:
        return await _build_release_venv(root, version, requirements, log_file, timeout_s)

    return await ensure_built(release_venv_name(version, requirements), build)


async def _build_release_venv(
    root: Path, version: str, requirements: list[str], log_file: Path | None, timeout_s: float
) -> str:
    uv, links, python = uv_executable(), find_links_args(), root / "bin" / "python"
    cwd = nemo_gym_home()
    # --seed: pip in the environment, for the one install uv cannot do (a wheel whose Requires-Python this Python
    # misses)
    await run_logged([uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(root)], log_file, timeout_s, cwd)
    requirements_file = root / "nemo_gym_requirements.txt"
    wheel = await _download_wheel(python, version, log_file, timeout_s, cwd)
    requires_python, dependencies = _wheel_requirements(wheel)
    if SpecifierSet(requires_python).contains(platform.python_version()):
        requirements_file.write_text("\n".join([str(wheel), *requirements]) + "\n")
        await _install(uv, python, links, requirements_file, log_file, timeout_s, cwd)
        return f"{wheel.name} + {len(requirements)} requirement(s)"
    # NeMo Gym's wheels declare Python >= 3.12 (0.4.0) or >= 3.13.14 (0.5.0 on); their code runs on 3.11 (0.7.0: its
    # 2,346 files compile; `itertools.batched` only in exporters/mlflow.py), as ../shared/bench/setup_nemo_gym.sh
    # installs 0.4.0: the wheel's dependencies, then the wheel itself with its Requires-Python ignored
    requirements_file.write_text("\n".join([*dependencies, *requirements]) + "\n")
    await _install(uv, python, links, requirements_file, log_file, timeout_s, cwd)
    await run_logged(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-requires-python", str(wheel)],
        log_file,
        timeout_s,
        cwd,
    )
    await run_logged([str(python), "-c", "import nemo_gym.server_utils"], log_file, timeout_s, cwd)
    return f"{wheel.name} (Requires-Python {requires_python} ignored) + {len(requirements)} requirement(s)"


async def _install(
    uv: str, python: Path, links: list[str], requirements_file: Path, log_file: Path | None, timeout_s: float, cwd: Path
) -> None:
    try:
        await run_logged(
            [uv, "pip", "install", COMPILE_BYTECODE, "--python", str(python), *links, "-r", str(requirements_file)],
            log_file,
            timeout_s,
            cwd,
        )
    except VenvBuildError as exc:
        raise VenvBuildError(
            f"installing the requirements ({', '.join(requirements_file.read_text().split())}) failed: {exc}"
        ) from None


async def _download_wheel(python: Path, version: str, log_file: Path | None, timeout_s: float, cwd: Path) -> Path:
    """The release's wheel, downloaded once into the cache (pip's own index settings apply)."""
    folder = nemo_gym_home() / "nemo_gym_releases" / version
    found = sorted(folder.glob(f"nemo_gym-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        str(python),
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--ignore-requires-python",  # every release, whatever Python it declares (see _build_release_venv)
        f"nemo-gym=={version}",
        "-d",
        str(folder),
    ]
    try:
        await run_logged(command, log_file, timeout_s, cwd)
    except VenvBuildError as exc:
        listed = re.search(r"from versions: ([^)]*)\)", str(exc))
        known = f"; releases on the index: {listed.group(1)}" if listed else ""
        raise VenvBuildError(
            f"NeMo Gym release {version} could not be downloaded from the package index{known}.\n{exc}"
        ) from None
    return sorted(folder.glob(f"nemo_gym-{version}-*.whl"))[0]


def _wheel_requirements(wheel: Path) -> tuple[str, list[str]]:
    """The wheel's `Requires-Python` ("" when it has none) and its `Requires-Dist` lines that no extra selects (markers
    kept: the installer evaluates them)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    metadata = email.parser.HeaderParser().parsestr(text)  # core metadata: RFC 822 headers (PEP 566)
    dependencies = [value for value in metadata.get_all("Requires-Dist") or [] if "extra ==" not in value]
    return metadata.get("Requires-Python", ""), dependencies


def config_dict_yaml(
    values: dict[str, Any],
    sections: dict[str, tuple[str, str, dict[str, Any]]],
    *,
    head: tuple[str, int],
    ray_address: str | None,
) -> str:
    """The `NEMO_GYM_CONFIG_DICT` of a NeMo Gym server: `values` (the resolved config: top-level settings such as
    `policy_model_name`) with each server instance replaced by `sections[name] = (server_type, implementation,
    fields)` (fields that include the `host` and `port` the instance listens on), plus `head_server`,
    `ray_head_node_address` and `dry_run: false`. Our own fields (placement, framework switches) are left out."""
    config = {key: value for key, value in values.items() if key not in sections and key != "head_server"}
    for name, (server_type, implementation, fields) in sections.items():
        given = {k: v for k, v in fields.items() if k not in OWN_FIELDS or (k == "framework" and v not in FRAMEWORKS)}
        config[name] = {server_type: {implementation: given}}
    config["head_server"] = {"host": head[0], "port": head[1]}
    config["dry_run"] = False
    if ray_address:
        config["ray_head_node_address"] = ray_address
    return yaml.safe_dump(config, sort_keys=False)


WORKER_REGISTER_TIMEOUT_S = 600  # Ray's worker_register_timeout_seconds on the NeMo Gym servers' node (RayHead.env)


class RayHead:
    """A one-node Ray cluster for the NeMo Gym servers of one run: `ray start --head --block` from the release's
    environment (the servers' Ray must be the same version), its own process group, every port chosen free (Ray's
    fixed defaults, such as the dashboard agent's 52365, clash with other Ray instances), no dashboard, a small
    object store. The node is on loopback (`--node-ip-address=127.0.0.1`, and `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
    in `env`, without which Ray replaces a 127.0.0.1 address by the machine's own network address, so the servers
    connected to Ray over eth0): the servers are on this machine. Ray's gRPC services listen on every interface, so
    token authentication is on (`RAY_AUTH_MODE=token`, a random token in a 0600 file of the run): `env` is what a
    server needs to connect.

    Args:
        ray_executable: `<release environment>/bin/ray`.
        run_dir: the run's state folder (token file, and `logs/ray_head.log`).
        num_cpus: CPUs the node offers to Ray tasks the servers submit.
    """

    START_TIMEOUT_S = 180.0
    READY_LINE = b"Ray runtime started"
    START_ATTEMPTS = 4
    RETRY_PAUSE_S = 10.0
    RETRIED_FAILURE = "timed out during startup"

    def __init__(self, ray_executable: Path, run_dir: Path, num_cpus: int | None = None):
        self.ray_executable = ray_executable
        self.run_dir = run_dir
        self.log_path = run_dir / "logs" / "ray_head.log"
        self.num_cpus = num_cpus or os.cpu_count() or 1
        self.process: subprocess.Popen | None = None
        self.address = ""
        token_file = run_dir / "ray_auth_token"
        if not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
        self.temp_dir = (
            Path("/tmp") / f"ray_ng_{os.getpid()}_{int(time.time())}"
        )  # short: Ray's socket paths have a length limit
        self.env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_file),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            # Ray's 60 s for a worker process to register with the raylet: a run of 20 NeMo Gym servers on 2 AVX2
            # cores started its environment servers' workers in more, and the raylet's timeout left one server's
            # start-up waiting on its Ray task for good (CI of 2026-11-30). Seconds.
            "RAY_worker_register_timeout_seconds": str(WORKER_REGISTER_TIMEOUT_S),
        }

    def start_command(self, ports: dict[str, int]) -> list[str]:
        """The `ray start` command line of the node (see the class docstring), `ports`: `{option name: port}`."""
        return [
            str(self.ray_executable),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--include-dashboard=false",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            "--object-store-memory=200000000",
            f"--temp-dir={self.temp_dir}",
            *(f"--{k}={v}" for k, v in ports.items()),
        ]

    async def start(self) -> str:
        """Start the node and wait until it runs. Returns its GCS address (`host:port`). A start that fails because
        Ray's raylet did not register within Ray's fixed 30 s (a loaded machine: `RETRIED_FAILURE` in the log) is
        tried again, up to START_ATTEMPTS times, with fresh ports and folder, after a pause of RETRY_PAUSE_S seconds
        times the attempt's number (a burst of load, such as servers starting beside, has time to pass).

        Raises:
            nemo_gym.common.errors.ServerStartError: `ray start` exited or did not come up within START_TIMEOUT_S.
        """
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                return await self._start_once()
            except ServerStartError as exc:
                if attempt == self.START_ATTEMPTS or self.RETRIED_FAILURE not in str(exc):
                    raise
                await self.stop(grace_s=2.0)
                pause_s = self.RETRY_PAUSE_S * attempt
                print(
                    f"The Ray head did not start ({self.RETRIED_FAILURE}); trying again in {pause_s:.0f} s"
                    f" (attempt {attempt + 1} of {self.START_ATTEMPTS})...",
                    flush=True,
                )
                await asyncio.sleep(pause_s)
        raise AssertionError("unreachable")

    async def _start_once(self) -> str:
        names = ("port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port")
        ports = dict(zip((*names, "runtime-env-agent-port"), free_ports(len(names) + 1), strict=True))
        command = self.start_command(ports)
        env = {
            **{
                k: v
                for k, v in os.environ.items()
                if k not in {"VIRTUAL_ENV", "PYTHONPATH", "RAY_AUTH_TOKEN", "RAY_ADDRESS"}
            },
            **self.env,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            start_at = log.tell()
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"the Ray head for the NeMo Gym servers exited with code {self.process.returncode}; last lines of"
                    f" {self.log_path}:\n{_tail(self.log_path, start_at)}"
                )
            if self.READY_LINE in self.log_path.read_bytes()[start_at:]:
                self.address = f"127.0.0.1:{ports['port']}"
                return self.address
            await asyncio.sleep(0.2)
        raise ServerStartError(
            f"the Ray head for the NeMo Gym servers did not start within {self.START_TIMEOUT_S:.0f} s; see"
            f" {self.log_path}"
        )

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the node's process group, SIGKILL after `grace_s` seconds; its temporary folder removed."""
        if self.process is not None and self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        if self.process is not None:
            signal_group(self.process.pid, signal.SIGKILL)  # Ray's own children (GCS, raylet) stay in the group
            self.process.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _tail(path: Path, start: int, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_bytes()[start:].decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
