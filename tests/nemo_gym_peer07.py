"""NVIDIA NeMo Gym 0.7.0 itself, the release its users have now, installed for the tests that run it beside ours
(tests/test_nemo_gym07.py): its ng_run, its ng_collect_rollouts, its server folders.

0.7.0 declares `Requires-Python >=3.13.14`; Python 3.13 cannot be had on these machines, and its code runs on 3.11
(2,346 files compile; `itertools.batched` appears only in exporters/mlflow.py). So it is installed as
../shared/bench/setup_nemo_gym.sh installs 0.4.0, independently of our own release environments
(`nemo_gym.orchestration.upstream_servers`): the wheel (`pip download --ignore-requires-python`), its runtime
`Requires-Dist` (each dependency keeps its own Python check), then the wheel itself with `--no-deps
--ignore-requires-python`. Into `$NGBENCH07_DIR/venv` (default /tmp/ngbench07), once: later calls, in this process or
another, reuse it (a marker file; a file lock keeps two installers apart). Its site-packages hold the wheel's server
folders (`peer07_server_dir`); NeMo Gym's ng_run runs them from its per-folder venvs, which `nemo_gym07_run_argv`
links to this one.
"""

from __future__ import annotations

import email.parser
import fcntl
import json
import os
import shutil
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from nemo_gym_peer import nemo_gym_env

PEER07_VERSION = "0.7.0"
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")


def peer07_root() -> Path:
    return Path(os.environ.get("NGBENCH07_DIR", "/tmp/ngbench07"))


def _run(argv: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd="/tmp", timeout=1800)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"installing NeMo Gym {PEER07_VERSION} failed at {argv[:4]}... (log {log}):\n{tail}")


@lru_cache(maxsize=1)
def peer07_venv() -> Path:
    """The virtual environment with NeMo Gym 0.7.0 (installed on first use, a minute with uv's cache warm; then
    reused). Raises RuntimeError with the installer's last lines when a step fails."""
    root = peer07_root()
    venv, marker = root / "venv", root / f"venv/.nemo_gym-{PEER07_VERSION}-installed"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            _install_release(root, venv, marker)
        _install_extras(venv)
        _compile_bytecode(venv)
    return venv


def _compile_bytecode(venv: Path) -> None:
    """Every module of the venv compiled to bytecode, once (a marker): uv does not compile at install, and where
    nothing writes bytecode back (PYTHONDONTWRITEBYTECODE) each of 0.7.0's server, ng_run and collector processes
    compiled its imports from source at every start (on 2 AVX2 cores a collector's 5 s start-up was half that). A
    file that does not compile (a package's Python 2 example) is left to its importer, as uv's --compile-bytecode
    does."""
    marker = venv / ".bytecode-compiled"
    if not marker.exists():
        site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        command = [str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(site)]
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp", timeout=1800)
        marker.touch()


def _install_release(root: Path, venv: Path, marker: Path) -> None:
    """The wheel (downloaded with `--ignore-requires-python`), its runtime Requires-Dist, then the wheel itself."""
    shutil.rmtree(venv, ignore_errors=True)
    log = root / "install.log"
    log.write_text("")
    uv = str(Path(sys.executable).parent / "uv")  # a dependency of ours, in the test's environment
    python = venv / "bin" / "python"
    _run([uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], log)
    downloads = root / "dl"
    if not list(downloads.glob(f"nemo_gym-{PEER07_VERSION}-*.whl")):
        _run(
            [str(python), "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            + ["--ignore-requires-python", f"nemo-gym=={PEER07_VERSION}", "-d", str(downloads)],
            log,
        )
    (wheel,) = downloads.glob(f"nemo_gym-{PEER07_VERSION}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.HeaderParser().parsestr(archive.read(name).decode())
    requirements = root / "requirements.txt"
    requirements.write_text(
        "".join(f"{line}\n" for line in metadata.get_all("Requires-Dist") or [] if "extra ==" not in line)
    )
    _run([uv, "pip", "install", "--quiet", "--python", str(python), "-r", str(requirements)], log)
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-requires-python", str(wheel)], log)
    _run([str(python), "-c", "import nemo_gym.server_utils, nemo_gym.rollout_collection"], log)
    marker.touch()


# server folders of the wheel whose own requirements the tests install into the venv too (NeMo Gym's ng_run of the
# tests runs every folder from this venv): haystack_agent, 0.7.0's agent that calls a resources server's tools over
# MCP (haystack-ai, mcp-haystack), gdp_pdf, whose judge masks (liteparse), and ruler2 (editdistance): only additions
# to the venv
EXTRA_FOLDERS = ("responses_api_agents/haystack_agent", "resources_servers/gdp_pdf", "resources_servers/ruler2")


def _install_extras(venv: Path) -> None:
    """The requirements of EXTRA_FOLDERS (their `-e nemo-gym` line aside), once (a marker per set of folders)."""
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    lines = sorted(
        {
            line.strip()
            for folder in EXTRA_FOLDERS
            for line in (site / folder / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.strip().startswith(("-e", "#"))
        }
    )
    marker = venv / f".extras-{'-'.join(sorted(Path(f).name for f in EXTRA_FOLDERS))}-installed"
    if marker.exists():
        return
    uv = str(Path(sys.executable).parent / "uv")
    _run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *lines],
        peer07_root() / "install.log",
    )
    marker.touch()


def peer07_site_packages() -> Path:
    """The site-packages folder of the 0.7.0 venv (its `nemo_gym` and the wheel's server folders)."""
    return peer07_venv() / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def peer07_server_dir(server_type: str, name: str) -> Path:
    """A server folder of the 0.7.0 wheel, e.g. `peer07_server_dir('resources_servers', 'mcqa')`."""
    return peer07_site_packages() / server_type / name


def peer07_env(**extra: str) -> dict[str, str]:
    """An environment for NeMo Gym 0.7.0's commands (`nemo_gym_peer.nemo_gym_env` of its venv)."""
    return nemo_gym_env(peer07_venv(), **extra)


def nemo_gym07_run_argv(config_paths: list[str], head_port: int, *overrides: str) -> list[str]:
    """NeMo Gym 0.7.0's own `ng_run` of wheel folders (config paths relative to its site-packages, where it is run),
    its head server on `head_port`; every server folder of the wheel runs from the 0.7.0 venv (`+uv_venv_dir` with
    a `.venv` link per folder, `+skip_venv_if_present=true`: a wheel folder's `-e nemo-gym @ ../../` line cannot
    install)."""
    venvs = peer07_root() / "venvs"
    site = peer07_site_packages()
    for server_type in SERVER_TYPES:
        for folder in (site / server_type).iterdir():
            link = venvs / server_type / folder.name / ".venv"
            if folder.is_dir() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(peer07_venv())
    return [
        str(peer07_venv() / "bin" / "ng_run"),
        "+config_paths=[" + ",".join(config_paths) + "]",
        "+head_server.host=127.0.0.1",
        f"+head_server.port={head_port}",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={venvs}",
        *overrides,
    ]


def peer07_json(script: str, *args: str, cwd: Path | str = "/tmp", timeout: float = 120, **env: str) -> Any:
    """What `script` (Python run by 0.7.0's interpreter with `args`, in `cwd`, away from our own nemo_gym, in
    `peer07_env(**env)`) prints as JSON on its last line; an AssertionError with its stderr when it fails."""
    done = subprocess.run(
        [str(peer07_venv() / "bin" / "python"), "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=peer07_env(**env),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
