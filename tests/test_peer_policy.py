"""The run token's peer policy (`nemo_gym.serving.auth.PeerPolicy`) on real sockets: a server of ours (uvicorn with our
HTTP protocol, RunTokenAuth) and callers that are separate processes, found from the TCP connection itself.

- a caller without the token is refused, until its PID is in the run's allowed_peers.json (NeMo Gym servers the
  run started);
- with `same_user`, this user's processes are let in, but not a request that carries a browser's headers, and not
  a process of another user (run as `nobody`; needs root to start it, else skipped);
- the token itself (header, Bearer, cookie) works as before.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from nemo_gym.common.processes import free_port
from nemo_gym.serving.auth import TOKEN_COOKIE, PeerPolicy, RunTokenAuth, write_allowed_peers
from nemo_gym.serving.limits import UVICORN_LIMITS

TOKEN = "t0ken-for-tests"
# a caller: waits for a line on stdin, then GETs the URL (with optional headers) twice on one connection and
# prints the two status codes
CALLER = """
import sys, http.client
host, port, headers = sys.argv[1], int(sys.argv[2]), dict(h.split(": ", 1) for h in sys.argv[3:])
sys.stdin.readline()
conn = http.client.HTTPConnection(host, port, timeout=10)
codes = []
for _ in range(2):
    conn.request("GET", "/data", headers=headers)
    answer = conn.getresponse(); answer.read(); codes.append(answer.status)
print(*codes, flush=True)
"""


class Server:
    def __init__(self, policy: PeerPolicy):
        app = FastAPI()

        @app.get("/data")
        async def data() -> dict:
            return {"ok": True}

        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                RunTokenAuth(app, token=TOKEN, peers=policy),
                host="127.0.0.1",
                port=self.port,
                log_level="error",
                **UVICORN_LIMITS,
            )
        )
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def start_caller(port: int, *headers: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CALLER, "127.0.0.1", str(port), *headers],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )


def codes(caller: subprocess.Popen) -> str:
    out, _ = caller.communicate("go\n", timeout=30)
    return out.strip()


def test_a_caller_is_refused_until_the_run_allows_its_pid(tmp_path: Path):
    with Server(PeerPolicy(tmp_path)) as server:
        assert codes(start_caller(server.port)) == "401 401"
        allowed, other = start_caller(server.port), start_caller(server.port)
        write_allowed_peers(tmp_path, [allowed.pid])
        assert codes(allowed) == "200 200"
        assert codes(other) == "401 401"  # only the listed process


def test_same_user_lets_this_users_processes_in_but_not_browsers(tmp_path: Path):
    with Server(PeerPolicy(tmp_path, same_user=True)) as server:
        assert codes(start_caller(server.port)) == "200 200"
        assert codes(start_caller(server.port, "Origin: http://evil.example")) == "401 401"
        assert codes(start_caller(server.port, "Sec-Fetch-Site: cross-site")) == "401 401"


@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("curl"), reason="starting a process as another user needs root (and curl)"
)
def test_same_user_refuses_another_user(tmp_path: Path):
    """curl as `nobody` (this repository's Python may lie in a folder only its owner can read)."""
    with Server(PeerPolicy(tmp_path, same_user=True)) as server:
        command = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{server.port}/data"]
        assert subprocess.run(command, capture_output=True, text=True, timeout=30).stdout == "200"  # this user
        assert (
            subprocess.run(command, capture_output=True, text=True, timeout=30, user=65534, cwd="/").stdout == "401"
        )  # nobody


def test_the_token_still_works_in_every_form(tmp_path: Path):
    with Server(PeerPolicy(tmp_path)) as server:
        assert codes(start_caller(server.port, f"X-NG-Run-Token: {TOKEN}")) == "200 200"
        assert codes(start_caller(server.port, f"Authorization: Bearer {TOKEN}")) == "200 200"
        assert codes(start_caller(server.port, f"Cookie: a=1; {TOKEN_COOKIE}={TOKEN}")) == "200 200"
        assert codes(start_caller(server.port, f"Cookie: {TOKEN_COOKIE}=wrong")) == "401 401"
