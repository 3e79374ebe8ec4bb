"""`SessionCookieEcho`: the ASGI middleware that keeps a NeMo Gym agent's cookie-named session alive (installed by
`nemo_gym.serving.server.BaseServer.build_app`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_gym.serving.client import SESSION_COOKIE

__all__ = ["SessionCookieEcho"]


class SessionCookieEcho:
    """ASGI middleware: every answer to a request that carries the session cookie sets it again.

    NeMo Gym's agents keep the cookies of the last answer only (NeMo Gym 0.4.0's simple_agent replaces its cookie
    jar with each tool answer's cookies), so a session that only `/seed_session` set the cookie for would be lost
    at the first tool answer without one. Requests that name their session with the `X-Session-Id` header (our
    clients) carry no cookie and pass untouched.
    """

    _COOKIE = SESSION_COOKIE.encode()

    def __init__(self, app: Callable):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        session_id = _request_cookie(scope, self._COOKIE) if scope["type"] == "http" else None
        if not session_id:
            await self.app(scope, receive, send)
            return
        cookie = self._COOKIE + b"=" + session_id + b"; HttpOnly; Path=/; SameSite=lax"

        async def send_with_cookie(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(
                    name.lower() == b"set-cookie" and value.startswith(self._COOKIE + b"=") for name, value in headers
                ):
                    message = {**message, "headers": [*headers, (b"set-cookie", cookie)]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def _request_cookie(scope: Any, name: bytes) -> bytes | None:
    """The value of cookie `name` in the request's `Cookie` headers, else None (only URL-safe ids are taken)."""
    for header, value in scope.get("headers", []):
        if header == b"cookie" and name in value:
            for part in value.split(b";"):
                key, _, found = part.strip().partition(b"=")
                if key == name and found and all(c in _ID_BYTES for c in found):
                    return found
    return None


_ID_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
