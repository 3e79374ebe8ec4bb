"""The per-run token: servers of one `ng_run` accept calls only from holders of the run's random token.

`ng_run` draws the token (`new_run_token`), hands it to each server process in the environment
(`NEMO_GYM_RUN_TOKEN`, never on the command line, so `ps` does not show it) and writes it to
`<NEMO_GYM_HOME>/runs/<run_id>/token` (mode 0600) for the user's own tools (ng_collect_rollouts, ng_status,
ng_eval, ng_train), which find it by the run's head server URL (`nemo_gym.serving.head.run_token_for_url`).
A server process takes the token out of its environment at start (`take_run_token_from_env`), so the
processes it starts (vLLM, sandboxed code) do not inherit it.

`RunTokenAuth` is the pure-ASGI middleware of every server and the head server: with a token configured,
every route but `GET /health` answers 401 unless the request carries the token in `X-NG-Run-Token`,
`Authorization: Bearer <token>` or the cookie `nemo_gym_run_token` (compared in constant time), or comes from a
caller the run's `PeerPolicy` allows. Without a token (a server built in a test, or `ng_run
+allow_unauthenticated=true`) nothing is checked. The token never appears in an answer or a log.

Callers that cannot send the token (NeMo Gym's own servers and commands, which know nothing of it) are let in by
the peer policy, never silently: the calling process is found from the TCP connection itself (over loopback, the
kernel's socket table `/proc/net/tcp` gives the caller's socket: its owner's uid and its inode; the process holding
that inode is found in `/proc/<pid>/fd`), and a call is accepted when
- it comes from a NeMo Gym server that this run's ng_run started (their PIDs, in the run's `allowed_peers.json`), or
- `ng_run +allow_same_user=true` was given and the caller runs as the user who started ng_run (for NeMo Gym's
  `ng_collect_rollouts` and other tools run by hand). That user's processes can read the run's 0600 token file
  anyway, so the token adds nothing against them; the one same-user client that cannot read files, a web
  browser, is still refused: a request with an `Origin` or `Sec-Fetch-*` header (which browsers send) needs the token.
Other users' processes, other machines and browsers still get 401. The decision is taken once per connection.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import psutil

from nemo_gym.serving.limits import send_last_body_then_close  # the same answer-then-close as the limits' 413

__all__ = [
    "RUN_TOKEN_ENV",
    "TOKEN_HEADER",
    "TOKEN_COOKIE",
    "CONNECTION_SCOPE_KEY",
    "ALLOWED_PEERS_FILE",
    "PeerPolicy",
    "write_allowed_peers",
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
TOKEN_COOKIE = "nemo_gym_run_token"
CONNECTION_SCOPE_KEY = (  # a dict per TCP connection in the ASGI scope (nemo_gym.serving.limits' protocol)
    "nemo_gym.connection"
)
ALLOWED_PEERS_FILE = "allowed_peers.json"  # in the run's folder: {"pids": [...]} of the NeMo Gym servers ng_run started
SAME_USER_ENV = "NEMO_GYM_ALLOW_SAME_USER"  # "1": ng_run +allow_same_user=true
_BROWSER_HEADERS = frozenset({b"origin", b"sec-fetch-site", b"sec-fetch-mode", b"sec-fetch-dest"})
TOKEN_FILE_NAME = "token"
# liveness and readiness only (NeMo Gym 0.7.0's probe routes too): no data, so they need no token
OPEN_PATHS = frozenset({"/health", "/healthz", "/readyz", "/livez", "/"})
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


def write_allowed_peers(run_dir: Path, pids: list[int]) -> None:
    """Write the PIDs whose calls the run's servers accept without the token (`PeerPolicy`), 0600, atomically."""
    path = run_dir / ALLOWED_PEERS_FILE
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"pids": sorted(set(pids))}, fh)
    os.replace(temporary, path)


class PeerPolicy:
    """Which callers without the token a run's servers accept (see the module docstring).

    Args:
        run_dir: the run's folder, whose `allowed_peers.json` lists the allowed PIDs (re-read when it changes).
        same_user: also accept any process of this user (`ng_run +allow_same_user=true`).
    """

    def __init__(self, run_dir: Path | None, same_user: bool = False):
        self.path = run_dir / ALLOWED_PEERS_FILE if run_dir else None
        self.same_user = same_user
        self._pids: frozenset[int] = frozenset()
        self._mtime_ns = -1

    @classmethod
    def from_env(cls) -> PeerPolicy | None:
        """The policy of a server started by ng_run (`$NEMO_GYM_RUN_DIR`, `$NEMO_GYM_ALLOW_SAME_USER`), else None."""
        run_dir = os.environ.get("NEMO_GYM_RUN_DIR")
        return cls(Path(run_dir), same_user=os.environ.get(SAME_USER_ENV) == "1") if run_dir else None

    def allows(self, scope: Scope) -> bool:
        """Whether the caller of this request may go without the token; decided once per connection."""
        if any(name in _BROWSER_HEADERS for name, _ in scope.get("headers", [])):
            return False
        connection = scope.get(CONNECTION_SCOPE_KEY)
        if connection is not None and "peer_allowed" in connection:
            return connection["peer_allowed"]
        allowed = self._decide(scope.get("client"), scope.get("server"))
        if connection is not None:
            connection["peer_allowed"] = allowed
        return allowed

    def _decide(self, client: Any, server: Any) -> bool:
        if not client or not server or not _is_loopback(client[0]) or not _is_loopback(server[0]):
            return False
        peer = caller_socket(tuple(client[:2]), tuple(server[:2]))
        if peer is None:
            return False
        uid, inode = peer
        if self.same_user and uid == os.getuid():
            return True
        return any(_holds_socket(pid, inode) for pid in self._allowed_pids())

    def _allowed_pids(self) -> frozenset[int]:
        if self.path is None:
            return frozenset()
        try:
            mtime_ns = self.path.stat().st_mtime_ns
        except OSError:
            return frozenset()
        if mtime_ns != self._mtime_ns:
            try:
                pids = json.loads(self.path.read_text()).get("pids", [])
                self._pids, self._mtime_ns = frozenset(int(p) for p in pids), mtime_ns
            except (OSError, ValueError, TypeError, AttributeError):
                return frozenset()
        return self._pids


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _proc_address(text: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6} (`0100007F:1F90`: the IP as the kernel's 32-bit words in host byte order,
    the port in hex) as `(ip, port)`."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(struct.pack("=I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    address = ipaddress.ip_address(socket.inet_ntop(family, words))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return str(address), int(port, 16)


def caller_socket(client: tuple[str, int], server: tuple[str, int]) -> tuple[int, int] | None:
    """`(uid, inode)` of the caller's end of a loopback TCP connection from `client` to `server` (each `(ip,
    port)` as the server sees them), read from the kernel's socket tables; None when it is not found."""
    want = (_normalized(client), _normalized(server))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) < 10:
                        continue
                    if (_proc_address(fields[1]), _proc_address(fields[2])) == want:
                        return int(fields[7]), int(fields[9])
        except OSError:
            continue
    return None


def _normalized(address: tuple[str, int]) -> tuple[str, int]:
    ip = ipaddress.ip_address(address[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip), int(address[1])


def _holds_socket(pid: int, inode: int) -> bool:
    """Whether process `pid`, or one of its uvicorn worker processes (multiprocessing children), holds socket
    `inode`."""
    target = f"socket:[{inode}]"
    candidates = [pid]
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return False
    for child in children:
        try:
            if "multiprocessing" in " ".join(child.cmdline()):
                candidates.append(child.pid)
        except (
            psutil.Error
        ):  # a child that exited (a zombie not yet reaped, or gone): not a caller, and no reason to refuse `pid`
            continue
    for candidate in candidates:
        fd_dir = f"/proc/{candidate}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(f"{fd_dir}/{name}") == target:
                    return True
            except OSError:
                continue
    return False


class RunTokenAuth:
    """ASGI middleware: with `token` set, answer 401 to every request but `GET /health` that lacks it.

    Accepted: header `X-NG-Run-Token: <token>`, `Authorization: Bearer <token>` (what an OpenAI client sends as
    its API key) or cookie `nemo_gym_run_token=<token>`; or a caller that `peers` allows (see the module
    docstring). The check comes before the app sees anything of the request.
    """

    def __init__(self, app: Callable, token: str | None = None, peers: PeerPolicy | None = None):
        self.app = app
        self.token = token.encode() if token else None
        self.peers = peers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] not in {"http", "websocket"} or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self._authorized(scope.get("headers", [])) or (self.peers is not None and self.peers.allows(scope)):
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
            elif name == b"cookie" and TOKEN_COOKIE.encode() in value:
                candidate = _cookie_value(value, TOKEN_COOKIE.encode())
            else:
                continue
            ok |= hmac.compare_digest(candidate, self.token)
        return ok


def _cookie_value(header: bytes, name: bytes) -> bytes:
    """The value of cookie `name` in a `Cookie` header (b'' when absent)."""
    for part in header.split(b";"):
        key, _, value = part.strip().partition(b"=")
        if key == name:
            return value.strip().strip(b'"')
    return b""


async def _unauthorized(receive: Receive, send: Send) -> None:
    """Answer 401. The request's body is read and dropped first (up to DRAIN_LIMIT_BYTES): closing a connection
    whose upload has not arrived whole resets it, and a reset can destroy the answer before the client reads it."""
    body = json.dumps(
        {
            "detail": (
                "missing or wrong run token: servers of an ng_run accept only calls carrying the run's token (header"
                f" {TOKEN_HEADER}, Authorization: Bearer, or cookie {TOKEN_COOKIE}); for clients that cannot send it,"
                " see ng_run +allow_same_user=true"
            )
        }
    ).encode()
    drained = await _drain(receive, DRAIN_LIMIT_BYTES)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer"),
    ]
    if drained:
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    # a large upload: answer and close the connection, with the pause that lets the answer leave first
    await send({"type": "http.response.start", "status": 401, "headers": [*headers, (b"connection", b"close")]})
    await send_last_body_then_close(send, body)


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
