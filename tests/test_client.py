"""ServerClient against real HTTP servers on loopback: retries are bounded, failures are typed."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from live_servers import serve

from nemo_gym.common.errors import ServerError, ServerHTTPError, ServerTimeoutError, ServerUnavailableError
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.retry_policy import ClientTimeouts

FAST = ClientTimeouts(connect_s=1.0, read_s=0.5, max_retries=2, backoff_s=0.01)


def flaky_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = {"flaky": 0, "down": 0, "bad": 0}

    @app.post("/flaky")
    async def flaky(request: Request):
        app.state.calls["flaky"] += 1
        if app.state.calls["flaky"] <= 2:
            return JSONResponse({"detail": "warming up"}, status_code=503)
        return {"ok": True, "session": request.headers.get("x-session-id"), "cookie": request.cookies.get("sid")}

    @app.post("/down")
    async def down():
        app.state.calls["down"] += 1
        return JSONResponse({"detail": "down"}, status_code=503)

    @app.post("/bad")
    async def bad():
        app.state.calls["bad"] += 1
        return JSONResponse({"detail": "no"}, status_code=422)

    @app.post("/slow")
    async def slow():
        await asyncio.sleep(3)
        return {}

    @app.post("/headers")
    async def headers(request: Request):
        return dict(request.headers)

    @app.post("/set_cookie")
    async def set_cookie():
        response = JSONResponse({})
        response.set_cookie("sid", "abc")
        return response

    return app


@pytest.mark.long
def test_retries_are_bounded_and_typed():
    app = flaky_app()
    with serve(app) as url:

        async def main():
            async with ServerClient(addresses={"s": url}, timeouts=FAST) as client:
                answer = await client.post("s", "/flaky", {}, session_id="sess-1")
                assert answer == {"ok": True, "session": "sess-1", "cookie": None}
                assert client.retries_used == 2
                with pytest.raises(ServerHTTPError) as info:
                    await client.post("s", "/down", {})
                assert info.value.status_code == 503 and info.value.failure_class == "http_error"
                assert app.state.calls["down"] == 3  # one try + max_retries=2
                with pytest.raises(ServerHTTPError):
                    await client.post("s", "/bad", {})
                assert app.state.calls["bad"] == 1  # a 4xx is never retried
                with pytest.raises(ServerTimeoutError):
                    await client.post("s", "/slow", {})

        asyncio.run(main())


def test_client_of_outside_endpoints_never_sends_the_run_token(monkeypatch):
    """`send_run_token=False` (openai_model's client of an OpenAI-compatible API): the run token of the process
    stays home, while the run's own clients send it; `retry_if` replaces the retry rule."""
    monkeypatch.setenv("NEMO_GYM_RUN_TOKEN", "run-token-canary")
    app = flaky_app()
    with serve(app) as url:

        async def main():
            async with (
                ServerClient(addresses={"s": url}, timeouts=FAST) as own,
                ServerClient(timeouts=FAST, send_run_token=False, retry_if=lambda e: False) as outside,
            ):
                assert (await own.post("s", "/headers", {}))["x-ng-run-token"] == "run-token-canary"
                sent = await outside.request_json(
                    "POST", f"{url}/headers", json={}, headers={"authorization": "Bearer sk-x"}
                )
                assert "run-token-canary" not in str(sent) and sent["authorization"] == "Bearer sk-x"
                with pytest.raises(ServerHTTPError):
                    await outside.request_json("POST", f"{url}/down", json={})
                assert app.state.calls["down"] == 1  # not retried: retry_if said no

        asyncio.run(main())


def test_cookies_stay_per_rollout():
    import httpx

    with serve(flaky_app()) as url:

        async def main():
            async with ServerClient(addresses={"s": url}, timeouts=FAST) as client:
                jar = httpx.Cookies()
                await client.post("s", "/set_cookie", {}, cookies=jar)
                assert jar.get("sid") == "abc"
                client.retries_used = 0
                await client.post("s", "/flaky", {})  # no jar: the pool keeps no cookie from another rollout
                await client.post("s", "/flaky", {})
                answer = await client.post("s", "/flaky", {}, cookies=jar)
                assert answer["cookie"] == "abc"

        asyncio.run(main())


def test_unreachable_server_is_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused

        async def main():
            async with ServerClient(addresses={"s": f"http://127.0.0.1:{port}"}, timeouts=FAST) as client:
                with pytest.raises(ServerUnavailableError):
                    await client.post("s", "/x", {})
                assert client.retries_used == 2

        asyncio.run(main())


def test_unknown_server_name_without_head():
    async def main():
        async with ServerClient(timeouts=FAST) as client:
            with pytest.raises(ServerError, match="no head server URL"):
                await client.post("nobody", "/x", {})

    asyncio.run(main())


def test_a_success_answer_that_is_not_json_is_a_typed_failure():
    from fastapi.responses import PlainTextResponse

    from nemo_gym.common.errors import ServerBadAnswerError

    app = FastAPI()

    @app.post("/text")
    async def text():
        return PlainTextResponse("not json")

    with serve(app) as url:

        async def main():
            async with ServerClient(addresses={"s": url}, timeouts=FAST) as client:
                with pytest.raises(ServerBadAnswerError) as info:
                    await client.post("s", "/text", {})
                assert info.value.failure_class == "bad_answer" and "not JSON" in str(info.value)

        asyncio.run(main())


def test_one_client_serves_several_event_loops():
    # A server's client is built before its event loop starts, and a test client may run each request in a loop
    # of its own: the aiohttp session under the client follows the running loop.
    with serve(flaky_app()) as url:
        client = ServerClient(addresses={"s": url}, timeouts=FAST)
        for _ in range(2):
            assert asyncio.run(client.post("s", "/set_cookie", {})) == {}
        asyncio.run(client.aclose())


def test_reachable_is_false_only_for_a_connection_refused():
    """The liveness probe of the collector (`nemo_gym.collect.liveness`): a refused connection is False; an answer of
    any status, or a server that accepts and never answers (slow, not gone), is True, within 2 × timeout_s."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return JSONResponse({"detail": "no token"}, status_code=401)

    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))  # bound, never listened on: a connect gets ECONNREFUSED
    silent = socket.create_server(("127.0.0.1", 0))  # listens (the kernel accepts), never answers

    async def main(url: str) -> tuple[bool, bool, bool, float]:
        async with ServerClient(timeouts=FAST) as client:
            answered, refused = (
                await client.reachable(f"{url}/health", 1.0),
                await client.reachable(f"http://127.0.0.1:{refusing.getsockname()[1]}/health", 1.0),
            )
            started = asyncio.get_running_loop().time()
            silent_answers = await client.reachable(f"http://127.0.0.1:{silent.getsockname()[1]}/health", 0.3)
            return answered, refused, silent_answers, asyncio.get_running_loop().time() - started

    try:
        with serve(app) as url:
            answered, refused, silent_answers, silent_s = asyncio.run(main(url))
    finally:
        refusing.close()
        silent.close()
    assert (answered, refused, silent_answers) == (True, False, True)
    assert silent_s < 0.7


def test_a_refresh_from_a_head_server_that_is_gone_is_one_attempt():
    """Every replica down: each retry re-reads the addresses from the head server first (under the refresh lock). A
    head server that is gone costs that refresh one refused attempt: no retry, whose own refresh would wait on the
    lock its caller holds until the refresh's deadline (connect_s) ends it (with connect_s = 5 s, a rollout
    of a collection whose ng_run had ended took ~10 s to fail instead of its ~3.5 s of backoff)."""
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    head = FastAPI()

    @head.get("/servers")
    async def servers():
        return [{"name": "s", "replica": 0, "url": f"http://127.0.0.1:{refusing.getsockname()[1]}"}]

    head_calls: list[str] = []

    async def count(request, handler):
        if request.url.path == "/servers":
            head_calls.append(str(request.url))
        return await handler(request)

    async def main(client: ServerClient) -> float:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ServerUnavailableError):
            await client.post("s", "/x", {})
        await client.aclose()
        return asyncio.get_running_loop().time() - started

    client = ServerClient(
        timeouts=ClientTimeouts(connect_s=2.0, read_s=0.5, max_retries=2, backoff_s=0.2),
        middlewares=[count],
        send_run_token=False,
    )
    try:
        with serve(head) as head_url:
            client.head_url = head_url
            asyncio.run(client.server_url("s"))  # addresses read while the head server is up
        head_calls.clear()
        failed_after_s = asyncio.run(main(client))
    finally:
        refusing.close()
    assert len(head_calls) == 2  # one refresh before each of the 2 retries, one attempt each
    assert failed_after_s < 1.8  # backoff 0.2 + 0.4 s; each refresh waiting for its deadline would add 2 × 2 s
