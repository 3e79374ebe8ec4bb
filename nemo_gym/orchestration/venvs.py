"""Virtual environments for server processes, built with `uv`, one per distinct requirements set.

The key of an environment is a hash of: the Python version, this checkout's path (nemo_gym is installed
editable), nemo_gym's own dependency list, and the
server's `requirements.txt` text. Servers with the same needs share one environment; an environment is
reused across runs (a `.ready` marker is written only after a complete install, and a file lock keeps two
builders of the same key apart). torch and other wheels on local disk are found through pip's configured
`find-links`, which uv does not read by itself.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from pathlib import Path

from nemo_gym.common.errors import NemoGymError
from nemo_gym.common.layout import REPO_ROOT, nemo_gym_home

__all__ = [
    "VenvBuildError",
    "venv_key",
    "venvs_dir",
    "ensure_venv",
    "ensure_built",
    "requirements_text",
    "run_logged",
    "find_links_args",
    "pip_find_links",
    "uv_executable",
    "COMPILE_BYTECODE",
]

# uv's flag that compiles every module of the environment to bytecode once, at install (uv does not by default, pip
# does): a server, a collector or vLLM then starts without compiling its imports from source, which it does at every
# start where nothing writes the bytecode back (PYTHONDONTWRITEBYTECODE, as container images set it, or a read-only
# environment). On 2 AVX2 cores a server's imports took 2.9 s instead of 1.4 s, for 8 s more at its environment's build
COMPILE_BYTECODE = "--compile-bytecode"


class VenvBuildError(NemoGymError):
    """`uv` failed to build a server environment; the message has uv's last output lines."""


@lru_cache(maxsize=1)
def pip_find_links() -> tuple[str, ...]:
    """Directories/URLs of pip's configured `find-links` (`pip config list`, `$PIP_FIND_LINKS`)."""
    links: list[str] = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            links.extend(value.strip().strip("'\"").split())
    return tuple(dict.fromkeys(link for link in links if link))


def uv_executable() -> str:
    """Path of `uv` (next to this interpreter, then on PATH). Raises VenvBuildError when missing."""
    candidate = Path(sys.executable).parent / "uv"
    found = str(candidate) if candidate.exists() else shutil.which("uv")
    if not found:
        raise VenvBuildError("uv is not installed: pip install uv")
    return found


def _core_dependencies() -> list[str]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as fh:
        return list(tomllib.load(fh)["project"]["dependencies"])


def venv_key(requirements_text: str) -> str:
    """Hash of what decides an environment's content (16 hex characters)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    blob = "\n".join([python, str(REPO_ROOT), *_core_dependencies(), "--", requirements_text.strip()])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def venvs_dir() -> Path:
    return nemo_gym_home() / "venvs"


async def ensure_venv(
    requirements_file: Path | None,
    *,
    extra_requirements: Sequence[Path] = (),
    log_file: Path | None = None,
    timeout_s: float = 1800,
) -> Path:
    """The Python executable of an environment with nemo_gym (editable, from this checkout), the requirements of
    `requirements_file` and those of each of `extra_requirements` (e.g. a ReinforceNow project's own
    requirements.txt); built if missing, reused otherwise (one environment per distinct set of their contents).

    Raises:
        VenvBuildError: uv failed or took longer than `timeout_s` seconds.
    """
    files = [
        f for f in (requirements_file, *extra_requirements) if f is not None and f.is_file() and f.read_text().strip()
    ]
    text = requirements_text(requirements_file, extra_requirements)

    async def build(root: Path) -> str:
        return await _build(root, files, log_file, timeout_s)

    return await ensure_built(venv_key(text), build)


def requirements_text(requirements_file: Path | None, extra_requirements: Sequence[Path] = ()) -> str:
    """What decides an environment's requirements: the text of `requirements_file`, then of each extra file that
    has one (files that do not exist count as empty; an extra file's text is marked by its position)."""
    text = requirements_file.read_text() if requirements_file is not None and requirements_file.is_file() else ""
    for index, extra in enumerate(extra_requirements):
        if extra.is_file() and extra.read_text().strip():
            text += f"\n# -- extra requirements {index}\n" + extra.read_text()
    return text


async def ensure_built(name: str, build: Callable[[Path], Awaitable[str]]) -> Path:
    """The Python executable of the environment `venvs_dir()/name`, built by `await build(root)` when it is not
    complete yet (a `.ready` marker, holding what `build` returns, is written only after a build that finished; a
    file lock keeps two builders of the same name apart, in this process or another).

    Raises:
        whatever `build` raises (VenvBuildError for a failed install); the half-built folder is rebuilt next time.
    """
    root = venvs_dir() / name
    python = root / "bin" / "python"
    if (root / ".ready").exists():
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / f"{name}.lock"
    with lock_path.open("w") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        try:
            if not (root / ".ready").exists():
                if root.exists():
                    shutil.rmtree(root)
                marker = await build(root)
                (root / ".ready").write_text(marker + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return python


async def _build(root: Path, requirement_files: list[Path], log_file: Path | None, timeout_s: float) -> str:
    uv = uv_executable()
    links = find_links_args()
    install = [
        uv,
        "pip",
        "install",
        COMPILE_BYTECODE,
        "--python",
        str(root / "bin" / "python"),
        *links,
        "-e",
        str(REPO_ROOT),
    ]
    for requirements_file in requirement_files:
        install += ["-r", str(requirements_file)]
    for command in ([uv, "venv", "--quiet", "--python", sys.executable, str(root)], install):
        await run_logged(
            command, log_file, timeout_s, cwd=requirement_files[0].parent if requirement_files else REPO_ROOT
        )
    return " ".join(install)


def find_links_args() -> list[str]:
    """`--find-links <dir>` for each of pip's configured find-links (uv does not read pip's configuration)."""
    return [arg for link in pip_find_links() for arg in ("--find-links", link)]


async def run_logged(
    command: list[str], log_file: Path | None, timeout_s: float, cwd: Path, env: dict[str, str] | None = None
) -> str:
    """Run an install command (`VIRTUAL_ENV` and `PYTHONPATH` dropped from the environment), append its output to
    `log_file`, and return that output.

    Raises:
        VenvBuildError: it exited non-zero (its last 20 output lines are in the message) or ran past `timeout_s`
        seconds.
    """
    env = env or {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd=cwd
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        raise VenvBuildError(f"{' '.join(command)} took longer than {timeout_s:.0f} s") from None
    text = output.decode(errors="replace")
    if log_file:
        with log_file.open("a") as fh:
            fh.write(f"$ {' '.join(command)}\n{text}\n")
    if process.returncode != 0:
        tail = "\n".join(text.splitlines()[-20:])
        raise VenvBuildError(f"{' '.join(command)} failed (exit {process.returncode}):\n{tail}")
    return text
