"""The per-run token: servers of one `ng_run` accept calls only from holders of the run's random token.

`ng_run` draws the token (`new_run_token`), hands it to each server process in the environment
(`NEMO_GYM_RUN_TOKEN`, never on the command line, so `ps` does not show it) and writes it to
`<NEMO_GYM_HOME>/runs/<run_id>/token` (mode 0600) for the user's own tools (ng_collect_rollouts, ng_status,
ng_eval, ng_train), which find it by the run's head server URL (`nemo_gym.head.run_token_for_url`).
A server process takes the token out of its environment at start (`take_run_token_from_env`), so the
processes it starts (vLLM, sandboxed code) do not inherit it.

`RunTokenAuth` is the pure-ASGI middleware of every server and the head server: with a token configured,
every route but `GET /health` answers 401 unless the request carries the token in `X-NG-Run-Token` or
`Authorization: Bearer <token>` (compared in constant time). Without a token (a server built in a test,
or `ng_run +allow_unauthenticated=true`) nothing is checked. The token never appears in an answer or a log.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any, Awaitable, Callable, MutableMapping

from nemo_gym.limits import _send_last_body_then_close  # the same answer-then-close as the limits' 413

__all__ = [
    "RUN_TOKEN_ENV",
    "TOKEN_HEADER",
    "TOKEN_FILE_NAME",
    "OPEN_PATHS",
    "new_run_token",
    "write_token_file",
    "read_token_file",
    "take_run_token_from_env",
    "current_run_token",
    "RunTokenAuth",
]

RUN_TOKEN_ENV = "NEMO_GYM_RUN_TOKEN"
TOKEN_HEADER = "X-NG-Run-Token"
TOKEN_FILE_NAME = "token"
OPEN_PATHS = frozenset({"/health"})  # liveness only: no data, so it needs no token
DRAIN_LIMIT_BYTES = 1 << 20  # body of a refused request read (and dropped) before answering 401; beyond it, close

_process_token: str | None = None

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def new_run_token() -> str:
    """A fresh random token (256 bits, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def write_token_file(run_dir: Path, token: str) -> Path:
    """Write `token` to `run_dir/token`, readable by its owner only (0600). Returns the path.

    Raises:
        FileExistsError: the file exists already (a token is written once per run).
    """
    path = run_dir / TOKEN_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return path


def read_token_file(run_dir: Path) -> str | None:
    """The token of the run whose state folder is `run_dir`, or None when it has none (or it is unreadable)."""
    try:
        return (run_dir / TOKEN_FILE_NAME).read_text().strip() or None
    except OSError:
        return None


def take_run_token_from_env() -> str | None:
    """Remove `NEMO_GYM_RUN_TOKEN` from this process's environment and keep it for `current_run_token`.

    Called once by a server process at start, so that the processes it starts do not inherit the token.
    """
    global _process_token
    token = os.environ.pop(RUN_TOKEN_ENV, None)
    if token:
        _process_token = token
    return current_run_token()


def current_run_token() -> str | None:
    """The token of the run this process belongs to: taken from the environment at start, or still in it."""
    return _process_token or os.environ.get(RUN_TOKEN_ENV) or None


class RunTokenAuth:
    """ASGI middleware: with `token` set, answer 401 to every request but `GET /health` that lacks it.

    Accepted: header `X-NG-Run-Token: <token>` or `Authorization: Bearer <token>` (what an OpenAI client
    sends as its API key). The check comes before the app sees anything of the request.
    """

    def __init__(self, app: Callable, token: str | None = None):
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] not in {"http", "websocket"} or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self._authorized(scope.get("headers", [])):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _unauthorized(receive, send)

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        assert self.token is not None
        ok = False
        for name, value in headers:
            if name == b"x-ng-run-token":
                candidate = value.strip()
            elif name == b"authorization" and value[:7].lower() == b"bearer ":
                candidate = value[7:].strip()
            else:
                continue
            ok |= hmac.compare_digest(candidate, self.token)
        return ok


async def _unauthorized(receive: Receive, send: Send) -> None:
    """Answer 401. The request's body is read and dropped first (up to DRAIN_LIMIT_BYTES): closing a connection
    whose upload has not arrived whole resets it, and a reset can destroy the answer before the client reads it."""
    body = json.dumps({"detail": f"missing or wrong run token: servers of an ng_run accept only calls carrying the run's token (header {TOKEN_HEADER})"}).encode()
    drained = await _drain(receive, DRAIN_LIMIT_BYTES)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"www-authenticate", b"Bearer")]
    if drained:
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    # a large upload: answer and close the connection, with the pause that lets the answer leave first
    await send({"type": "http.response.start", "status": 401, "headers": [*headers, (b"connection", b"close")]})
    await _send_last_body_then_close(send, body)


async def _drain(receive: Receive, limit_bytes: int) -> bool:
    """Read the request body to its end; False when it is longer than `limit_bytes` or the client went away."""
    received = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
        if received > limit_bytes:
            return False
