"""HTTP client for talking to gym servers by instance name.

Every attempt has a connect deadline and a total deadline (connect + read seconds, for the whole answer, so
a server that trickles bytes cannot hold a call forever); there are at most `max_retries` retries, with
exponential backoff (or the server's `Retry-After` after a 429, up to `retry_after_max_s`), and only for
transient failures (`nemo_gym.common.errors.is_transient`: connection errors, timeouts, 429, 502/503/504 without a
deterministic inner failure class). So one call lasts at most `ClientTimeouts.worst_case_s()` (plus one connect
deadline per other replica of the instance, for a call that a refused connection moves to another replica; see
`ServerClient` and `nemo_gym.serving.replicas`; the policy: `nemo_gym.serving.retry_policy`). Failures raise the typed
errors of `nemo_gym.common.errors`; nothing hangs forever.

The HTTP client underneath is aiohttp: a rollout makes several calls between the same few servers, at
hundreds in flight, and aiohttp's connection pool hands out a kept-alive connection in constant time (httpx's
pool, used here before, scanned every pooled connection on each request: ~40 % of an agent's CPU at
concurrency 256; see benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson

from nemo_gym.common.errors import (
    ServerBadAnswerError,
    ServerError,
    ServerHTTPError,
    ServerTimeoutError,
    ServerUnavailableError,
    is_transient,
)
from nemo_gym.serving.auth import TOKEN_HEADER
from nemo_gym.serving.head import run_token_for_url
from nemo_gym.serving.nemo_gym_discovery import nemo_gym_head_servers
from nemo_gym.serving.replicas import DEFAULT_COOLDOWN_S, Replica, ReplicaPool
from nemo_gym.serving.retry_policy import ClientTimeouts, retry_after_s

__all__ = ["ServerClient", "SESSION_HEADER", "SESSION_COOKIE", "HEAD_URL_ENV"]

SESSION_HEADER = "X-Session-Id"
SESSION_COOKIE = "nemo_gym_session_id"
HEAD_URL_ENV = "NEMO_GYM_HEAD_URL"
# Idle kept-alive connections are closed after this many seconds: well below the servers' own keep-alive
# (60 s, nemo_gym.serving.entrypoint), so the client, not the server, closes an idle connection and a request never
# goes out on a connection the server is closing.
KEEPALIVE_S = 15.0


class ServerClient:
    """Async client that resolves instance names through the head server and posts JSON.

    An instance may run several replicas (`num_replicas`, see `nemo_gym.serving.replicas`): a call with a sticky key
    (`session_id`, else the `cookies` jar object) always goes to the same replica, where the rollout's session
    lives; other calls go to the up replica with the fewest calls in flight. A replica that refuses a
    connection is marked down for `replica_cooldown_s`: calls without a key move to another replica at once;
    when its cool-down ends, or when every replica is down, the addresses are read again from the head server
    (a restarted replica registers its new address there) and it is tried again. A sticky call never moves:
    it re-reads the addresses and retries its replica (bounded retries), then raises.

    Args:
        head_url: base URL of the head server (`ng_run` prints it; env `NEMO_GYM_HEAD_URL`).
        addresses: optional fixed `{instance name: base URL, or a list of replica base URLs}` map; names in
            it skip the head server.
        timeouts: deadlines and retry policy.
        max_connections: connection-pool size.
        run_token: the run's token (see `nemo_gym.serving.auth`), sent on every request; default: this process's
            own (a server of the run), else the one `ng_run` wrote for the run at `head_url`.
        replica_cooldown_s: how long a replica that refused a connection gets no calls without a key, seconds.
        middlewares: aiohttp client middlewares (`async def m(request, handler) -> response`) every request
            passes through before it connects, redirects included: the seam where tests route or fault
            individual calls, and where `nemo_gym.serving.net_guard.guard_middleware` checks addresses.
        send_run_token: false for a client of endpoints outside the run (an OpenAI-compatible API behind a
            model server): no run token is sent (`run_token` is ignored, none is looked up).
        retry_if: which failures are retried (within `timeouts.max_retries`); default `errors.is_transient`.
        trust_env: use the proxy settings of the environment (`HTTPS_PROXY` ...); off for the run's own servers.
    """

    def __init__(
        self,
        head_url: str | None = None,
        *,
        addresses: dict[str, str | list[str]] | None = None,
        timeouts: ClientTimeouts = ClientTimeouts(),
        max_connections: int = 1024,
        run_token: str | None = None,
        replica_cooldown_s: float = DEFAULT_COOLDOWN_S,
        middlewares: Iterable[aiohttp.ClientMiddlewareType] = (),
        send_run_token: bool = True,
        retry_if: Callable[[ServerError], bool] = is_transient,
        trust_env: bool = False,
    ):
        self.head_url = (head_url or os.environ.get(HEAD_URL_ENV) or "").rstrip("/") or None
        token = (run_token or run_token_for_url(self.head_url)) if send_run_token else None
        self.timeouts = timeouts
        self.replica_cooldown_s = replica_cooldown_s
        self._pools: dict[str, ReplicaPool] = {
            name: ReplicaPool(
                name,
                dict(enumerate([urls] if isinstance(urls, str) else urls)),
                cooldown_s=replica_cooldown_s,
                fixed=True,
            )
            for name, urls in (addresses or {}).items()
        }
        self._refreshing = asyncio.Lock()
        # per request: not every server gets it (`_take_addresses`)
        self._token_headers = {TOKEN_HEADER: token} if token else {}
        self._max_connections = max_connections
        self._middlewares = tuple(middlewares)
        self._retry_if = retry_if
        self._trust_env = trust_env
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.retries_used = 0
        self._head_is_nemo_gym = False  # the head server answered /servers with 404: NeMo Gym's (see list_servers)

    def _session(self) -> aiohttp.ClientSession:
        """The aiohttp session, made on first use: it belongs to the event loop that runs the calls (a client is
        often built before that loop starts). One closed by `aclose`, or made in another, finished event loop (a
        client used by several `asyncio.run`s, or by a test client's per-request loops) is made again."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.closed or self._loop is not loop:
            self._loop = loop
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.timeouts.connect_s
                ),  # the total deadline: `_attempt`
                cookie_jar=aiohttp.DummyCookieJar(),  # never share cookies between rollouts: a call's jar is its own
                trust_env=self._trust_env,
                middlewares=self._middlewares,
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- addresses ---------------------------------------------------------------------------------
    async def server_url(self, name: str) -> str:
        """Base URL of instance `name` (of its lowest-numbered replica that is up).

        Raises:
            ServerError: no head server URL, or the head server does not know `name`.
        """
        return (await self._pool(name)).first_url()

    async def call_headers(self, name: str) -> dict[str, str]:
        """The headers this client's calls to `name` carry (the run token, when it takes it); errors as `server_url`."""
        return dict(self._token_headers) if (await self._pool(name)).send_run_token else {}

    async def replica_urls(self, name: str) -> dict[int, str]:
        """`{replica index: base URL}` of instance `name` (see `server_url` for the errors raised)."""
        return {r.replica: r.url for r in (await self._pool(name)).replicas.values()}

    def replica_stats(self, name: str) -> list[dict[str, Any]]:
        """Per-replica counters of the calls this client made to `name`: `[{replica, url, calls, failures,
        in_flight, down}]` (`calls` counts attempts, `failures` attempts with no answer); `[]` before any."""
        pool = self._pools.get(name)
        return pool.stats() if pool else []

    async def list_servers(self, *, max_retries: int | None = None) -> list[dict[str, Any]]:
        """The head server's `GET /servers` answer: one `{name, replica, server_type, implementation, url, pid,
        ...}` per replica. The head server of NVIDIA NeMo Gym's ng_run, which has no `/servers` (404), is read
        through its `GET /global_config_dict_yaml` instead (each instance's host and port; its servers get no run
        token). `max_retries`: instead of the client's (`timeouts.max_retries`)."""
        if not self._head_is_nemo_gym:
            try:
                return await self.request_json(
                    "GET", f"{self.head_url}/servers", server="head", max_retries=max_retries
                )
            except ServerHTTPError as exc:
                if exc.status_code != 404:
                    raise
            self._head_is_nemo_gym = True
        answer = await self.request_json(
            "GET", f"{self.head_url}/global_config_dict_yaml", server="head", max_retries=max_retries
        )
        return nemo_gym_head_servers(answer, self.head_url or "")

    async def reachable(self, url: str, timeout_s: float) -> bool:
        """Whether `GET url` (a server's `/health`) gets through: one attempt, no retry, no run token. False when no
        connection is made within `timeout_s` seconds or it is refused, reset or dropped before the answer (the
        server's process is gone, or its host unreachable); an answer of any status (a 401 too), or a connection
        that holds no answer (a slow server is not a gone one) is True. It lasts at most 2 × `timeout_s`."""
        probe_timeout = aiohttp.ClientTimeout(total=2 * timeout_s, sock_connect=timeout_s, sock_read=timeout_s)
        try:
            async with self._session().get(url, timeout=probe_timeout) as answer:
                await answer.read()
        except aiohttp.ConnectionTimeoutError:
            return False
        except TimeoutError:  # connected, and no whole answer in time
            return True
        except aiohttp.ClientError:
            return False
        return True

    async def _pool(self, name: str) -> ReplicaPool:
        pool = self._pools.get(name)
        if pool is not None:
            return pool
        if not self.head_url:
            raise ServerError(
                f"no address for server {name!r}: no head server URL (set {HEAD_URL_ENV} or +head_server_url=...)",
                server=name,
            )
        servers = await self.list_servers()
        self._take_addresses(servers)
        if name not in self._pools:
            known = ", ".join(sorted({s["name"] for s in servers})) or "none"
            raise ServerError(
                f"server {name!r} is not registered with the head server {self.head_url} (known: {known})", server=name
            )
        return self._pools[name]

    def _take_addresses(self, servers: list[dict[str, Any]]) -> None:
        """Create or update the pools of the names in a `GET /servers` answer (fixed ones stay as given)."""
        by_name: dict[str, dict[int, str]] = {}
        token_for: dict[str, bool] = {}
        for entry in servers:
            by_name.setdefault(entry["name"], {})[int(entry.get("replica", 0))] = entry["url"]
            token_for[entry["name"]] = bool(entry.get("send_run_token", True))
        for name, urls in by_name.items():
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = ReplicaPool(name, urls, cooldown_s=self.replica_cooldown_s)
            elif not pool.fixed:
                pool.update(urls)
            if not pool.fixed:
                pool.send_run_token = token_for[name]

    async def _refresh(self, pool: ReplicaPool) -> None:
        """Read the addresses of `pool` again from the head server (once for concurrent callers); ends the
        cool-downs that are over. A head server that does not answer (one attempt: a call waiting on a refresh
        waits no retries of a head server that is gone) leaves the addresses as they are."""
        seen = pool.generation
        async with self._refreshing:
            if pool.generation != seen:
                return  # another call refreshed it meanwhile
            if pool.fixed or not self.head_url:
                pool.update({})
                return
            try:
                async with asyncio.timeout(self.timeouts.connect_s):
                    servers = await self.list_servers(max_retries=0)
            except (ServerError, aiohttp.ClientError, TimeoutError, ValueError):
                pool.update({})
                return
            self._take_addresses(servers)
            if pool.generation == seen:  # the head server no longer lists it
                pool.update({})

    async def _choose(self, pool: ReplicaPool, key: str | None, avoid: set[int]) -> Replica:
        """The replica for the next attempt of a call (see the class docstring)."""
        if pool.cooldown_ended():
            await self._refresh(pool)
        if key is not None:
            if pool.sticky(key).is_down(time.monotonic()):
                await self._refresh(pool)  # restarted at a new address?
            return pool.sticky(key)
        replica = pool.balanced(avoid) or pool.balanced()
        if replica is None:  # every replica is down
            await self._refresh(pool)
            replica = pool.balanced() or pool.soonest_up()
        return replica

    # -- calls -------------------------------------------------------------------------------------
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
        rollouts never share a cookie. Either one makes the call sticky: every call with the same session id
        (else the same jar object) reaches the same replica.

        Raises:
            ServerError: the name is unknown (see `server_url`).
            ServerUnavailableError: connection failed after the retries (and, without a sticky key, on every replica).
            ServerTimeoutError: no whole answer within connect_s + read_s (or `timeout_s`), after the retries.
            ServerHTTPError: a 4xx/5xx answer (transient ones, `retry_if`, are retried first).
            ServerBadAnswerError: a success status with a body that is not JSON.
        """
        headers = {SESSION_HEADER: session_id} if session_id else {}
        key = f"session:{session_id}" if session_id else f"jar:{id(cookies)}" if cookies is not None else None
        pool = await self._pool(server)
        return await self._send(
            "POST",
            pool,
            "/" + path.lstrip("/"),
            json=json,
            headers=headers,
            cookies=cookies,
            key=key,
            server=server,
            timeout_s=timeout_s,
        )

    async def server_at(self, url: str) -> tuple[str, dict[str, str]] | None:
        """The name of the run's server that has a replica at base URL `url` (as the head server lists it, a trailing
        slash aside) and the headers a call to it carries (the run token, when it takes it), else None. The head
        server is asked again when no known server has it.

        Raises:
            ServerError: no head server URL (see `server_url`).
        """
        wanted = url.rstrip("/")
        for listed in (False, True):
            if listed:  # no known server has it: the head server's list, once
                if not self.head_url:
                    raise ServerError(f"no head server URL to find the server at {url} ({HEAD_URL_ENV} is not set)")
                self._take_addresses(await self.list_servers())
            for name, pool in self._pools.items():
                if not pool.fixed and any(r.url.rstrip("/") == wanted for r in pool.replicas.values()):
                    return name, dict(self._token_headers) if pool.send_run_token else {}
        return None

    async def get(self, server: str, path: str, *, timeout_s: float | None = None) -> Any:
        """GET `/path` of instance `server` (balanced over its replicas); errors as for `post`."""
        pool = await self._pool(server)
        return await self._send("GET", pool, "/" + path.lstrip("/"), server=server, timeout_s=timeout_s)

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
        max_retries: int | None = None,
    ) -> Any:
        """One request to an absolute URL with bounded retries (`max_retries`, default the client's); see `post` for
        the errors raised. The run token goes with it unless `server` names a known server that does not take it
        (e.g. a replica's URL that `server_at` found)."""
        pool = ReplicaPool(server or url, {0: url}, fixed=True)
        if server in self._pools:
            pool.send_run_token = self._pools[server].send_run_token
        return await self._send(
            method,
            pool,
            "",
            json=json,
            headers=headers,
            cookies=cookies,
            server=server,
            timeout_s=timeout_s,
            max_retries=max_retries,
        )

    async def _send(
        self,
        method: str,
        pool: ReplicaPool,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        cookies: httpx.Cookies | None = None,
        key: str | None = None,
        server: str | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
    ) -> Any:
        """Send to `<replica url><path>` with bounded retries (`max_retries`, default `timeouts.max_retries`): a
        connection refused by one replica moves a call without `key` to another one at once (not counted against
        them); other transient failures wait (backoff or `Retry-After`) and count."""
        max_retries = self.timeouts.max_retries if max_retries is None else max_retries
        content = orjson.dumps(json, option=orjson.OPT_SERIALIZE_NUMPY) if json is not None else None
        all_headers = {**self._token_headers} if pool.send_run_token else {}
        if content is not None:
            all_headers["content-type"] = "application/json"
        all_headers.update(headers or {})
        if cookies:
            all_headers["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        deadline_s = self.timeouts.connect_s + (timeout_s or self.timeouts.read_s)
        attempt = 0
        tried: set[int] = set()
        while True:
            replica = await self._choose(pool, key, tried)
            url = replica.url + path
            replica.calls += 1
            replica.in_flight += 1
            try:
                outcome, wait_s = await self._attempt(
                    method, url, content, all_headers, cookies, deadline_s, server, path or urlsplit(url).path
                )
            finally:
                replica.in_flight -= 1
            if isinstance(outcome, _Answer):
                return outcome.value
            error: ServerError = outcome
            tried.add(replica.replica)
            if isinstance(error, (ServerUnavailableError, ServerTimeoutError)):
                replica.failures += 1
            if isinstance(error, ServerUnavailableError):
                pool.mark_down(replica)
                if key is None and pool.up(tried):
                    self.retries_used += 1
                    continue  # another replica takes the call right away
            if not self._retry_if(error) or attempt >= max_retries:
                raise error
            if wait_s is not None and wait_s > self.timeouts.retry_after_max_s:
                raise error  # the server asks to come back later than we are willing to wait
            attempt += 1
            self.retries_used += 1
            await asyncio.sleep(wait_s if wait_s is not None else self.timeouts.backoff_delay_s(attempt))

    async def _attempt(
        self,
        method: str,
        url: str,
        content: bytes | None,
        headers: dict[str, str],
        cookies: httpx.Cookies | None,
        deadline_s: float,
        server: str | None,
        path: str,
    ) -> tuple[Any, float | None]:
        """One attempt: `(_Answer(value), None)` on success, else `(the typed error, Retry-After seconds or None)`.
        `deadline_s` bounds the whole attempt, from connecting to the last byte of the answer.

        Raises:
            ServerBadAnswerError: a success status with a body that is not JSON.
        """
        try:
            async with (
                asyncio.timeout(deadline_s),
                self._session().request(method, url, data=content, headers=headers) as answer,
            ):
                body = await answer.read()
        except TimeoutError as exc:  # also aiohttp's connect and read timeouts (subclasses)
            return (
                ServerTimeoutError(
                    f"{method} {url} timed out after {deadline_s:g} s ({type(exc).__name__})", server=server, path=path
                ),
                None,
            )
        except aiohttp.ClientError as exc:  # refused, reset, closed mid-answer, malformed answer
            return (
                ServerUnavailableError(f"{method} {url} failed: {type(exc).__name__}: {exc}", server=server, path=path),
                None,
            )
        if cookies is not None and "set-cookie" in answer.headers:
            set_cookies = [("set-cookie", value) for value in answer.headers.getall("set-cookie")]
            cookies.extract_cookies(
                httpx.Response(answer.status, headers=set_cookies, request=httpx.Request(method, url))
            )
        if answer.status < 400:
            try:
                return _Answer(orjson.loads(body) if body else None), None
            except orjson.JSONDecodeError as exc:
                text = body[:200].decode("utf-8", "replace")
                raise ServerBadAnswerError(
                    f"{method} {url} answered {answer.status} with a body that is not JSON ({exc}): {text!r}",
                    server=server,
                    path=path,
                ) from None
        text = body.decode("utf-8", "replace")
        error = ServerHTTPError(
            f"{method} {url} answered {answer.status}: {text[:2000]}",
            status_code=answer.status,
            body=text,
            server=server,
            path=path,
        )
        return error, retry_after_s(answer.headers) if answer.status == 429 else None


@dataclass(frozen=True)
class _Answer:
    """A successful attempt's decoded JSON (None for an empty body)."""

    value: Any
