"""One nemo_gym server (e.g. vllm_model) as a child process on 127.0.0.1, without ng_run: start, wait, stop.

The child (`python -m nemo_gym.art._serve`) runs in a session of its own (a Ctrl-C in the terminal reaches
only this process, which then stops it in order), `stop` reaches everything it started (vLLM and its engine
processes), and it gets SIGTERM if this process dies (Linux parent-death signal). A fresh random token guards every
route but `/health`; an OpenAI client sends it as
its API key (`Authorization: Bearer`), which the server accepts (`nemo_gym.serving.auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from nemo_gym.common.errors import ServerStartError
from nemo_gym.common.processes import die_with_parent  # the same parent-death signal vLLM's process gets
from nemo_gym.orchestration.server_processes import tail
from nemo_gym.serving.auth import RUN_TOKEN_ENV, new_run_token

__all__ = ["ServerProcess"]


class ServerProcess:
    """A server class of a nemo_gym `app.py` served by a child process.

    Attributes:
        url: `http://127.0.0.1:<port>` once `start` returned.
        token: the access token (send it as `Authorization: Bearer <token>` or `X-NG-Run-Token`).
    """

    def __init__(self, app_path: str | Path, config: dict[str, Any], *, name: str, state_dir: str | Path):
        self.app_path = Path(app_path).resolve()
        self.config = config
        self.name = name
        self.state_dir = Path(state_dir)
        self.log_path = self.state_dir / f"{name}.server.log"
        self.token = new_run_token()
        self.url: str | None = None
        self.process: subprocess.Popen | None = None

    async def start(self, timeout_s: float = 1800.0) -> str:
        """Start the child and wait until `GET /health` answers 200; returns the URL.

        Raises:
            ServerStartError: the child exited (config error, crash) or was not healthy within `timeout_s`,
                with the last lines of its log.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config_path, url_file = self.state_dir / f"{self.name}.config.json", self.state_dir / f"{self.name}.url"
        url_file.unlink(missing_ok=True)
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # may hold an API key
        with os.fdopen(fd, "w") as handle:
            json.dump(self.config, handle)
        command = [
            sys.executable,
            "-m",
            "nemo_gym.art._serve",
            "--app",
            str(self.app_path),
            "--name",
            self.name,
            "--config",
            str(config_path),
            "--url-file",
            str(url_file),
        ]
        env = {**os.environ, RUN_TOKEN_ENV: self.token}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        try:
            await self._wait_healthy(url_file, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url  # type: ignore[return-value]

    async def _wait_healthy(self, url_file: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise ServerStartError(
                        f"server {self.name!r} exited with code {self.process.returncode} during start; last lines of"
                        f" {self.log_path}:\n{tail(self.log_path, 40)}"
                    )
                if self.url is None and url_file.is_file():
                    self.url = url_file.read_text().strip()
                if self.url is not None:
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get(f"{self.url}/health")).status_code == 200:
                            return
                await asyncio.sleep(0.25)
        raise ServerStartError(
            f"server {self.name!r} was not healthy after {timeout_s:.0f} s; last lines of"
            f" {self.log_path}:\n{tail(self.log_path, 40)}"
        )

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the child (it stops what it started, e.g. vLLM), then SIGKILL whatever of its tree is left
        after `grace_s`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        process.terminate()
        _, alive = psutil.wait_procs(tree, timeout=grace_s)
        for leftover in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()
        psutil.wait_procs(alive, timeout=5)
        process.poll()
