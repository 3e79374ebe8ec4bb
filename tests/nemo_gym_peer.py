"""NVIDIA NeMo Gym 0.4.0 itself, installed for the tests that run it beside ours (its collector, its profiler,
its servers and its ng_run).

`peer_venv()` installs it once with `../shared/bench/setup_nemo_gym.sh` (the documented install on Python 3.11:
the wheel's dependencies, then the wheel with its Requires-Python check skipped) into `$NGBENCH_DIR`
(default /tmp/ngbench) and returns that virtual environment; later calls, in this process or another, reuse it
(the script is idempotent and a file lock keeps two installers apart). Its `bin/` holds NeMo Gym's own
commands (`ng_run`, `ng_collect_rollouts`, `ng_reward_profile`, ...); its site-packages hold the wheel's
`resources_servers/`, `responses_api_agents/` and `responses_api_models/` folders (`peer_server_dir`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO_ROOT.parent / "shared" / "bench"
SETUP_SCRIPT = BENCH_DIR / "setup_nemo_gym.sh"
PEER_VERSION = "0.4.0"


def two_at_a_time(calls: Mapping[Hashable, Callable[[], Any]]) -> dict[Hashable, Any]:
    """Each call's result under its key, the calls run two at a time on threads: a collector or profiler process
    spends most of its life importing, and on 2 cores two of them side by side take about half the time. Every call
    ends before this returns; when calls raised, the exception of the first of them in key order is raised here."""
    with ThreadPoolExecutor(2) as pool:
        jobs = {key: pool.submit(call) for key, call in calls.items()}
    return {key: job.result() for key, job in jobs.items()}


def peer_root() -> Path:
    return Path(os.environ.get("NGBENCH_DIR", "/tmp/ngbench"))


@lru_cache(maxsize=1)
def peer_venv() -> Path:
    """The virtual environment with NeMo Gym 0.4.0 (installed on first use, minutes; then reused).

    Skips the calling test when `../shared/bench` is not beside the repository; fails it when the install fails.
    """
    if not SETUP_SCRIPT.is_file():
        pytest.skip(f"NeMo Gym's install script not found at {SETUP_SCRIPT}")
    root = peer_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # from a neutral folder: the script's import check must not pick up this repository's server folders
        result = subprocess.run(["bash", str(SETUP_SCRIPT)], cwd="/tmp", capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(
            f"installing NeMo Gym {PEER_VERSION} failed (exit"
            f" {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return root / "venv"


def peer_python() -> Path:
    return peer_venv() / "bin" / "python"


def peer_site_packages() -> Path:
    """The site-packages folder of the NeMo Gym venv (its `nemo_gym` and the wheel's server folders)."""
    out = subprocess.run(
        [str(peer_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def peer_server_dir(server_type: str, name: str) -> Path:
    """A server folder of the NeMo Gym wheel, e.g. `peer_server_dir('resources_servers', 'mcqa')`."""
    return peer_site_packages() / server_type / name


def peer_env(**extra: str) -> dict[str, str]:
    """An environment for NeMo Gym 0.4.0's commands (`nemo_gym_env` of its venv)."""
    return nemo_gym_env(peer_venv(), **extra)


def nemo_gym_env(venv: Path, **extra: str) -> dict[str, str]:
    """An environment for the commands of the NeMo Gym release installed in `venv`: that venv first on PATH, Ray on
    loopback, no telemetry, offline hub; `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def peer_uv_venv_dir(server_dirs: list[str]) -> Path:
    """A `uv_venv_dir` for NeMo Gym's own ng_run in which each of `server_dirs` (`<type>/<name>`) has its `.venv`
    pointing at the NeMo Gym venv: with `+uv_venv_dir=<this> +skip_venv_if_present=true` NeMo Gym's ng_run starts
    those wheel servers without building environments (their `-e nemo-gym @ ../../` line cannot install from a
    wheel's folder; see ../shared/bench/README.md). Servers whose requirements add packages need `peer_install`."""
    root = peer_root() / "venvs"
    for server_dir in server_dirs:
        link = root / server_dir / ".venv"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(peer_venv())
    return root


def nemo_gym_run_argv(config_paths: list[str], head_port: int, *overrides: str) -> list[str]:
    """NeMo Gym's own `ng_run` for wheel servers (config paths relative to the wheel's install, as NeMo Gym resolves
    them), its head server on `head_port` (its default 11000 would clash between runs), venvs as `peer_uv_venv_dir`."""
    server_dirs = sorted({"/".join(Path(p).parts[:2]) for p in config_paths})
    return [
        str(peer_venv() / "bin" / "ng_run"),
        "+config_paths=[" + ",".join(config_paths) + "]",
        "+head_server.host=127.0.0.1",
        f"+head_server.port={head_port}",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={peer_uv_venv_dir(server_dirs + ['responses_api_agents/simple_agent'])}",
        *overrides,
    ]


def peer_install(requirements: list[str]) -> None:
    """Install `requirements` (requirement lines: a wheel server's `requirements.txt` without its NeMo Gym line, as
    `nemo_gym.orchestration.upstream_servers.release_requirements` gives them) into the NeMo Gym venv, where NeMo Gym's
    own ng_run runs the wheel's servers. Packages the venv already has keep their versions (its `pip freeze` constrains
    the install), so one server's requirements cannot change what other tests run on: a requirement that needs another
    version fails, with the installer's message. Done once per requirements set (a marker under `$NGBENCH_DIR`)."""
    if not requirements:
        return
    venv = peer_venv()
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    folder = peer_root() / "peer_installs"
    marker = folder / f"{key}.done"
    if marker.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    with (peer_root() / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return
        freeze = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "freeze"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        (folder / f"{key}.constraints.txt").write_text(
            "".join(f"{line}\n" for line in freeze.splitlines() if "==" in line and " @ " not in line)
        )
        (folder / f"{key}.requirements.txt").write_text("".join(f"{line}\n" for line in requirements))
        uv = venv / "bin" / "uv" if (venv / "bin" / "uv").exists() else Path(sys.executable).parent / "uv"
        command = [
            str(uv),
            "pip",
            "install",
            "--python",
            str(venv / "bin" / "python"),
            "-r",
            str(folder / f"{key}.requirements.txt"),
            "-c",
            str(folder / f"{key}.constraints.txt"),
        ]
        result = subprocess.run(command, cwd="/tmp", capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(
                f"installing {requirements} into NeMo Gym's venv failed (exit"
                f" {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        marker.write_text("\n".join(requirements) + "\n")


def nemo_gym_collect_argv(
    venv: Path, head_url: str, agent: str | None, rows: Path, output: Path, repeats: int | str
) -> list[str]:
    """NeMo Gym's own `ng_collect_rollouts` (of the release installed in `venv`) of `rows` through `agent` (None: no
    `+agent_name`), `repeats` times each (or 0.7.0's dict, as written after `+num_repeats=`), against the head server
    at `head_url`, into `output`."""
    host, port = head_url.removeprefix("http://").rsplit(":", 1)
    return [
        str(venv / "bin" / "ng_collect_rollouts"),
        *([f"+agent_name={agent}"] if agent is not None else []),
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={output}",
        f"+num_repeats={repeats}",
        f"+head_server.host={host}",
        f"+head_server.port={port}",
    ]


def our_collect_argv(
    rows: Path, output: Path, repeats: int | str, agent: str | None = None, head_url: str | None = None
) -> list[str]:
    """Our `ng_collect_rollouts` (this test environment's) of `rows` through `agent` (None: no `+agent_name`),
    `repeats` times each (or NeMo Gym 0.7.0's dict, as written after `+num_repeats=`), into `output`, against the
    head server at `head_url` (None: `NEMO_GYM_HEAD_URL`)."""
    return [
        str(Path(sys.executable).parent / "ng_collect_rollouts"),
        *([f"+agent_name={agent}"] if agent is not None else []),
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={output}",
        f"+num_repeats={repeats}",
        *([f"+head_server_url={head_url}"] if head_url is not None else []),
    ]
