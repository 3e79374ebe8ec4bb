"""Request limits of every gym server: body size, header size, JSON nesting depth and JSON values.

`RequestLimits` is a pure-ASGI middleware: it answers 413 from `Content-Length` before the app runs, and for a
chunked body it counts bytes as the app receives them and stops at the first chunk over the cap, so a 1 GiB
upload is never held whole. The 413 goes out with `Connection: close`, so the server stops reading the rest.
`parse_json_body` is the strict JSON parser of the framework's routes (4xx, never a RecursionError or a 500,
for NaN, infinite numbers, lone surrogates, integers beyond 64 bits, nesting deeper than
MAX_JSON_DEPTH). Headers: `HeadLimitedHttpToolsProtocol` refuses (400) an incomplete request head over
MAX_HEADER_BYTES (pass `UVICORN_LIMITS` to `uvicorn.Config`), the middleware any complete one over it (431).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic_core import from_json
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "DEFAULT_MAX_BODY_MB",
    "MAX_JSON_DEPTH",
    "MAX_HEADER_BYTES",
    "UVICORN_LIMITS",
    "HeadLimitedHttpToolsProtocol",
    "RequestRejected",
    "RequestLimits",
    "parse_json_body",
    "is_json_content_type",
    "read_json_object",
    "send_last_body_then_close",
]

DEFAULT_MAX_BODY_MB = 64.0
MAX_JSON_DEPTH = 200  # pydantic-core's (jiter's) recursion limit; deeper bodies are answered 422
MAX_HEADER_BYTES = 16 * 1024
_FLUSH_BEFORE_CLOSE_S = 0.05

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class HeadLimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (the C parser llhttp, cheaper per request than the pure-Python h11: see
    benchmarks/README.md, "Collection throughput") with the guard h11 has and uvicorn's httptools protocol lacks
    (`h11_max_incomplete_event_size`): a request head still incomplete after MAX_HEADER_BYTES is answered 400 and
    the connection closed, so a client cannot make the server buffer headers without end. Bytes are counted per
    read while a head is open (from the end of the previous message to the end of this one's headers), so at most
    MAX_HEADER_BYTES plus one read is buffered. A complete head over MAX_HEADER_BYTES is answered 431 by
    `RequestLimits`."""

    _head_open = True
    _head_bytes = 0
    _connection: dict[str, Any] | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # one dict per TCP connection, in every request's scope: where per-connection decisions are kept (the run
        # token check's caller lookup, nemo_gym.serving.auth.PeerPolicy)
        if self._connection is None:
            self._connection = {}
        self.scope["nemo_gym.connection"] = self._connection  # type: ignore[typeddict-unknown-key]

    def data_received(self, data: bytes) -> None:
        if self._head_open:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_open and self._head_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
            self.send_400_response(f"Request head larger than {MAX_HEADER_BYTES // 1024} KiB.")

    def on_headers_complete(self) -> None:
        self._head_open = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open, self._head_bytes = True, 0


# Keyword arguments of uvicorn.Config: the httptools protocol above; h11's own limit stays set for a caller that
# picks h11 (`http="h11"`).
UVICORN_LIMITS: dict[str, Any] = {
    "http": HeadLimitedHttpToolsProtocol,
    "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
}


class RequestRejected(HTTPException):
    """A request over a limit (413 body, 431 headers); the answer closes the connection."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(status_code, detail, headers={"Connection": "close"})


class RequestLimits:
    """ASGI middleware capping the request body at `max_body_bytes` (413) and the headers at MAX_HEADER_BYTES (431).

    A declared `Content-Length` over the cap is answered before the app runs; otherwise the bytes are counted
    as the app receives them and the first chunk over the cap raises `RequestRejected` inside the app (answered
    by its exception handling, or here when it reaches this middleware before a response started).
    """

    def __init__(self, app: Callable, max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20)):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(name) + len(value) + 4 for name, value in scope.get("headers", [])) > MAX_HEADER_BYTES:
            # h11 caps only a head that is still incomplete; one read can bring a longer one whole.
            await _reject(send, RequestRejected(431, f"request headers larger than {MAX_HEADER_BYTES // 1024} KiB"))
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _reject(send, RequestRejected(413, self._too_large()))
            return
        received = 0
        started = rejected = False

        async def limited_receive() -> Message:
            nonlocal received, rejected
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    rejected = True
                    raise RequestRejected(413, self._too_large())
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            if rejected and message["type"] == "http.response.body" and not message.get("more_body"):
                await send_last_body_then_close(send, message.get("body", b""))
            else:
                await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except RequestRejected as exc:
            if started:
                raise
            await _reject(send, exc)

    def _too_large(self) -> str:
        return f"request body larger than {self.max_body_bytes / 2**20:g} MiB (max_body_mb of the server's config)"


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _reject(send: Send, exc: RequestRejected) -> None:
    body = json.dumps({"detail": exc.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send_last_body_then_close(send, body)


async def send_last_body_then_close(send: Send, body: bytes) -> None:
    """Send the answer's last bytes, wait, then end it (uvicorn closes the connection on `Connection: close`): how
    a server answers a request it refuses while the client may still be uploading (the limits' 413, the run token's
    401 in `nemo_gym.serving.auth`).

    The client is still uploading, so the close resets the connection, and a reset drops whatever the kernel
    had not sent yet (TCP autocorking holds back a small segment that follows another): the pause lets the
    answer leave first, so the client reads the 413 after its upload fails.
    """
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await asyncio.sleep(_FLUSH_BEFORE_CLOSE_S)
    await send({"type": "http.response.body", "body": b""})


def is_json_content_type(content_type: str | None) -> bool:
    """True for a missing content type, `application/json` and `application/<x>+json` (any parameters)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# Only a 3-digit exponent or 20 digits in a row can give an infinite float or an integer beyond 64 bits:
# only then is the parsed value walked.
_MAYBE_OUT_OF_RANGE = re.compile(rb"\d[eE][+-]?\d{3}|\d{20}")
_INT_RANGE = (-(2**63), 2**64 - 1)  # what orjson (the client's encoder) and most JSON stacks can carry


def parse_json_body(raw: bytes) -> Any:
    """Parse a request body as strict JSON (RFC 8259) with pydantic-core's parser; an empty body is `{}`.

    Rejects what the stdlib parser accepts and the rest of a server would choke on: NaN/Infinity, numbers
    beyond the float range, integers beyond 64 bits (the client's orjson cannot send them on), lone UTF-16
    surrogates, nesting deeper than MAX_JSON_DEPTH (the parser's recursion guard, so no RecursionError).

    Raises:
        ValueError: the body is none of the above.
    """
    value = from_json(raw or b"{}", allow_inf_nan=False, cache_strings=False)
    if _MAYBE_OUT_OF_RANGE.search(raw or b""):
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, float) and not math.isfinite(item):
                raise ValueError("a number is out of the range of a 64-bit float")
            elif isinstance(item, int) and not _INT_RANGE[0] <= item <= _INT_RANGE[1]:
                raise ValueError("an integer is out of the 64-bit range")
    return value


async def read_json_object(request: Request) -> dict[str, Any] | JSONResponse:
    """The request body as a JSON object, or a 4xx answer saying what is wrong (415 content type, 422 body)."""
    content_type = request.headers.get("content-type")
    if not is_json_content_type(content_type):
        return JSONResponse({"detail": f"content type must be application/json, got {content_type!r}"}, status_code=415)
    raw = await request.body()
    try:
        body = parse_json_body(raw)
    except ValueError as exc:
        return JSONResponse({"detail": f"body is not valid JSON: {exc}"}, status_code=422)
    if not isinstance(body, dict):
        return JSONResponse({"detail": "body must be a JSON object"}, status_code=422)
    return body
