"""A fault-injecting HTTP/1.1 proxy for the chaos tests: real sockets on 127.0.0.1, requests parsed with h11.

Each request is passed to `decide(request)`; it returns None (forward to the upstream and relay the answer)
or a fault:
    "refused"         the client's connect is refused (ECONNREFUSED): see below
    "reset"           read the request, then reset the connection (RST) without a byte of answer
    "blackhole"       read the request and never answer (the connection is held until the proxy closes)
    "reset_mid_body"  forward, send the upstream's status line, headers and half its body, then RST
    "500" / "503" / "429"   answer that status (a 429 carries `Retry-After: 0`) without forwarding
Keep-alive connections are served request after request, as the pooled clients of the servers use them.

A refused connection comes before any byte of the request, so no server can refuse one request and not
another: the choice has to be made where the request starts. Clients that take `proxy.middleware()` (in the
`middlewares` of `nemo_gym.serving.client.ServerClient`, an aiohttp client middleware) have each request to the proxy
decided there, before it connects: "refused" sends it to a port that is bound but never listened on, so the kernel
answers the SYN with
an RST and the client's connect fails with a real ECONNREFUSED (counted in `refused_connects`); any other
decision travels to the proxy in the `x-injected-fault` header (removed before forwarding), so each attempt
is decided once. Requests that arrive without the header are decided by the proxy itself.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import h11
import httpx

__all__ = ["FaultProxy", "ProxiedRequest", "FAULTS"]

FAULTS = ("refused", "reset", "blackhole", "reset_mid_body", "500", "503", "429")
FAULT_HEADER = "x-injected-fault"  # the client-side decision for one request ("" = none); never forwarded
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", FAULT_HEADER.encode()}


@dataclass(frozen=True)
class ProxiedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes


class FaultProxy:
    """Serve on a free loopback port in a background thread; use as a context manager (`url` inside)."""

    def __init__(self, upstream_url: str, decide: Callable[[ProxiedRequest], str | None]):
        self.upstream_url = upstream_url.rstrip("/")
        self.decide = decide
        self.url = ""
        self.refused_connects = 0  # connects of `middleware()` clients that failed with ECONNREFUSED
        self._count_lock = threading.Lock()  # the middlewares run in the threads of several servers
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        # Bound and never listened on: a SYN to it gets an RST, and no other process can take the port meanwhile.
        self._refusing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._refusing.bind(("127.0.0.1", 0))
        self.refusing_port: int = self._refusing.getsockname()[1]

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._refusing.close()

    def count_refused_connect(self) -> None:
        with self._count_lock:
            self.refused_connects += 1

    def middleware(self) -> aiohttp.ClientMiddlewareType:
        """An aiohttp client middleware for a client of the proxy (`ServerClient(middlewares=[...])`): its
        requests to the proxy are decided before they connect (see the module docstring); others pass untouched."""

        async def decide_before_connect(
            request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
        ) -> aiohttp.ClientResponse:
            if f"http://{request.url.host}:{request.url.port}" != self.url:
                return await handler(request)
            headers = {k.lower(): v for k, v in request.headers.items()}
            body = await request.body.as_bytes() if request.body else b""
            fault = self.decide(ProxiedRequest(request.method, request.url.raw_path_qs, headers, body))
            if fault != "refused":
                request.headers[FAULT_HEADER] = fault or ""
                return await handler(request)
            request.url = request.url.with_port(self.refusing_port)
            try:
                return await handler(request)
            except aiohttp.ClientConnectorError as exc:
                if _caused_by_refusal(exc.os_error):
                    self.count_refused_connect()
                raise

        return decide_before_connect

    async def _start(self) -> None:
        self._closing = asyncio.Event()
        self._connections: set[asyncio.Task] = set()
        self._http = httpx.AsyncClient(timeout=60, trust_env=False)
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        self._closing.set()
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._http.aclose()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(asyncio.current_task())
        conn = h11.Connection(h11.SERVER)
        try:
            while (request := await _read_request(conn, reader)) is not None:
                decided = request.headers.get(FAULT_HEADER)
                fault = (decided or None) if decided is not None else self.decide(request)
                if fault in (
                    "reset",
                    "refused",
                ):  # "refused" here: a client without `middleware()`; reset is the nearest
                    return _reset(writer)
                if fault == "blackhole":
                    await self._closing.wait()
                    return _reset(writer)
                if fault in ("500", "503", "429"):
                    headers = [("retry-after", "0")] if fault == "429" else []
                    await _answer(conn, writer, int(fault), b'{"detail": "injected fault"}', headers)
                else:
                    answer = await self._http.request(
                        request.method,
                        self.upstream_url + request.path,
                        content=request.body,
                        headers={k: v for k, v in request.headers.items() if k.encode() not in HOP_BY_HOP},
                    )
                    headers = [(k, v) for k, v in answer.headers.items() if k.encode() not in HOP_BY_HOP]
                    if fault == "reset_mid_body":
                        writer.write(
                            conn.send(
                                h11.Response(
                                    status_code=answer.status_code,
                                    headers=[*headers, ("content-length", str(len(answer.content)))],
                                )
                            )
                        )
                        writer.write(answer.content[: len(answer.content) // 2])
                        await writer.drain()
                        return _reset(writer)
                    await _answer(conn, writer, answer.status_code, answer.content, headers)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return writer.close()
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
            writer.close()
        finally:
            self._connections.discard(asyncio.current_task())
        writer.close()


def _caused_by_refusal(exc: BaseException | None) -> bool:
    """Whether an exception chain holds the OS's ECONNREFUSED."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> ProxiedRequest | None:
    """The next whole request of the connection, or None at its end."""
    head, body = None, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            headers = {k.decode().lower(): v.decode() for k, v in head.headers}
            return ProxiedRequest(head.method.decode(), head.target.decode(), headers, bytes(body))
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _answer(
    conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: bytes, headers: list[tuple[str, str]]
) -> None:
    writer.write(conn.send(h11.Response(status_code=status, headers=[*headers, ("content-length", str(len(body)))])))
    writer.write(conn.send(h11.Data(data=body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
