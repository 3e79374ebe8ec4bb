"""HTTP client for talking to gym servers by instance name.

Every attempt has a connect deadline and a total deadline (connect + read seconds, for the whole answer, so
a server that trickles bytes cannot hold a call forever); there are at most `max_retries` retries, with
exponential backoff (or the server's `Retry-After` after a 429, up to `retry_after_max_s`), and only for
transient failures (`nemo_gym.errors.is_transient`: connection errors, timeouts, 429, 502/503/504 without a
deterministic inner failure class). So one call lasts at most `ClientTimeouts.worst_case_s()`. Failures raise
the typed errors of `nemo_gym.errors`; nothing hangs forever.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import os
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from nemo_gym.auth import TOKEN_HEADER
from nemo_gym.errors import ServerBadAnswerError, ServerError, ServerHTTPError, ServerTimeoutError, ServerUnavailableError, is_transient
from nemo_gym.head import run_token_for_url

__all__ = ["ClientTimeouts", "ServerClient", "SESSION_HEADER", "SESSION_COOKIE", "HEAD_URL_ENV"]

SESSION_HEADER = "X-Session-Id"
SESSION_COOKIE = "nemo_gym_session_id"
HEAD_URL_ENV = "NEMO_GYM_HEAD_URL"


@dataclass(frozen=True)
class ClientTimeouts:
    """Deadlines and retry policy. Durations in seconds."""

    connect_s: float = 5.0
    read_s: float = 600.0
    max_retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 60.0  # a 429 asking to wait longer ends the retries

    def worst_case_s(self, timeout_s: float | None = None) -> float:
        """Longest a call can last, seconds: every attempt at its total deadline (connect + read, or
        connect + `timeout_s`), plus the longest waits between them."""
        attempt = self.connect_s + (timeout_s or self.read_s)
        wait = max(self.backoff_max_s, self.retry_after_max_s)
        return (self.max_retries + 1) * attempt + self.max_retries * wait


class ServerClient:
    """Async client that resolves instance names through the head server and posts JSON.

    Args:
        head_url: base URL of the head server (`ng_run` prints it; env `NEMO_GYM_HEAD_URL`).
        addresses: optional fixed `{instance name: base URL}` map; names in it skip the head server.
        timeouts: deadlines and retry policy.
        max_connections: connection-pool size.
        run_token: the run's token (see `nemo_gym.auth`), sent on every request; default: this process's
            own (a server of the run), else the one `ng_run` wrote for the run at `head_url`.
    """

    def __init__(
        self,
        head_url: str | None = None,
        *,
        addresses: dict[str, str] | None = None,
        timeouts: ClientTimeouts = ClientTimeouts(),
        max_connections: int = 1024,
        run_token: str | None = None,
    ):
        self.head_url = (head_url or os.environ.get(HEAD_URL_ENV) or "").rstrip("/") or None
        token = run_token or run_token_for_url(self.head_url)
        self.timeouts = timeouts
        self._addresses: dict[str, str] = dict(addresses or {})
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeouts.read_s, connect=timeouts.connect_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            trust_env=False,
            headers={TOKEN_HEADER: token} if token else None,
        )
        self.retries_used = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "ServerClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def server_url(self, name: str) -> str:
        """Base URL of instance `name`. Raises ServerError when the head server does not know it."""
        if name in self._addresses:
            return self._addresses[name]
        if not self.head_url:
            raise ServerError(f"no address for server {name!r}: no head server URL (set {HEAD_URL_ENV} or +head_server_url=...)", server=name)
        servers = await self.list_servers()
        for entry in servers:
            self._addresses.setdefault(entry["name"], entry["url"])
        if name not in self._addresses:
            known = ", ".join(sorted(s["name"] for s in servers)) or "none"
            raise ServerError(f"server {name!r} is not registered with the head server {self.head_url} (known: {known})", server=name)
        return self._addresses[name]

    async def list_servers(self) -> list[dict[str, Any]]:
        """The head server's `GET /servers` answer: `[{name, server_type, implementation, url, pid, ...}]`."""
        return await self.request_json("GET", f"{self.head_url}/servers", server="head")

    async def post(
        self,
        server: str,
        path: str,
        json: Any = None,
        *,
        session_id: str | None = None,
        cookies: httpx.Cookies | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """POST `json` to `/path` of instance `server`; returns the decoded JSON answer.

        `session_id` goes in the `X-Session-Id` header. `cookies` is a per-rollout jar: it is sent and
        updated from the answer, so servers that keep sessions in cookies (NeMo Gym's) work too, and two
        rollouts never share a cookie.

        Raises:
            ServerUnavailableError: connection failed after the retries.
            ServerTimeoutError: no whole answer within connect_s + read_s (or `timeout_s`), after the retries.
            ServerHTTPError: a 4xx/5xx answer (transient ones, `errors.is_transient`, are retried first).
            ServerBadAnswerError: a success status with a body that is not JSON.
        """
        url = await self.server_url(server) + "/" + path.lstrip("/")
        headers = {SESSION_HEADER: session_id} if session_id else {}
        return await self.request_json("POST", url, json=json, headers=headers, cookies=cookies, server=server, timeout_s=timeout_s)

    async def get(self, server: str, path: str, *, timeout_s: float | None = None) -> Any:
        url = await self.server_url(server) + "/" + path.lstrip("/")
        return await self.request_json("GET", url, server=server, timeout_s=timeout_s)

    async def request_json(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        cookies: httpx.Cookies | None = None,
        server: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One request with bounded retries; see `post` for the errors raised."""
        content = orjson.dumps(json, option=orjson.OPT_SERIALIZE_NUMPY) if json is not None else None
        all_headers = {"content-type": "application/json", **(headers or {})} if content is not None else dict(headers or {})
        if cookies:
            all_headers["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        timeout = httpx.Timeout(timeout_s, connect=self.timeouts.connect_s) if timeout_s else httpx.USE_CLIENT_DEFAULT
        deadline_s = self.timeouts.connect_s + (timeout_s or self.timeouts.read_s)
        path = httpx.URL(url).path
        attempt = 0
        while True:
            outcome, wait_s = await self._attempt(method, url, content, all_headers, cookies, timeout, deadline_s, server, path)
            if isinstance(outcome, _Answer):
                return outcome.value
            error: ServerError = outcome
            if not is_transient(error) or attempt >= self.timeouts.max_retries:
                raise error
            if wait_s is not None and wait_s > self.timeouts.retry_after_max_s:
                raise error  # the server asks to come back later than we are willing to wait
            attempt += 1
            self.retries_used += 1
            await asyncio.sleep(wait_s if wait_s is not None else min(self.timeouts.backoff_s * 2 ** (attempt - 1), self.timeouts.backoff_max_s))

    async def _attempt(self, method: str, url: str, content: bytes | None, headers: dict[str, str], cookies: httpx.Cookies | None,
                       timeout: Any, deadline_s: float, server: str | None, path: str) -> tuple[Any, float | None]:
        """One attempt: `(_Answer(value), None)` on success, else `(the typed error, Retry-After seconds or None)`.

        Raises:
            ServerBadAnswerError: a success status with a body that is not JSON.
        """
        try:
            async with asyncio.timeout(deadline_s):
                answer = await self._http.request(method, url, content=content, headers=headers, timeout=timeout)
        except (httpx.TimeoutException, TimeoutError) as exc:
            return ServerTimeoutError(f"{method} {url} timed out after {deadline_s:g} s ({type(exc).__name__})", server=server, path=path), None
        except httpx.TransportError as exc:
            return ServerUnavailableError(f"{method} {url} failed: {type(exc).__name__}: {exc}", server=server, path=path), None
        self._http.cookies.clear()  # never share cookies between rollouts through the pool's jar
        if cookies is not None:
            cookies.extract_cookies(answer)
        if answer.status_code < 400:
            try:
                return _Answer(orjson.loads(answer.content) if answer.content else None), None
            except orjson.JSONDecodeError as exc:
                raise ServerBadAnswerError(f"{method} {url} answered {answer.status_code} with a body that is not JSON ({exc}): {answer.text[:200]!r}", server=server, path=path) from None
        error = ServerHTTPError(f"{method} {url} answered {answer.status_code}: {answer.text[:2000]}", status_code=answer.status_code,
                                body=answer.text, server=server, path=path)
        return error, retry_after_s(answer) if answer.status_code == 429 else None


@dataclass(frozen=True)
class _Answer:
    """A successful attempt's decoded JSON (None for an empty body)."""

    value: Any


def retry_after_s(answer: httpx.Response) -> float | None:
    """The answer's `Retry-After` in seconds (delay-seconds or an HTTP date; RFC 9110 §10.2.3), else None."""
    value = answer.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())
