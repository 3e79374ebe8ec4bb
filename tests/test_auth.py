"""The per-run token (nemo_gym.serving.auth): every route but /health needs it when configured; clients find and send
it."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient
from live_servers import serve

from nemo_gym.common.errors import ServerHTTPError
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving import auth
from nemo_gym.serving.auth import (
    RUN_TOKEN_ENV,
    TOKEN_HEADER,
    new_run_token,
    read_token_file,
    take_run_token_from_env,
    write_token_file,
)
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import build_head_app, run_token_for_url
from nemo_gym.serving.server import Session

TOKEN = "tok-" + "x" * 40


class Echo(ResourcesServer):
    @tool
    async def echo(self, text: str) -> dict:
        """Echo the text."""
        return {"text": text}

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        return VerifyResult(reward=1.0)


def test_without_a_token_nothing_is_checked():
    with TestClient(Echo().build_app()) as client:
        assert client.post("/echo", json={"text": "a"}).json() == {"text": "a"}
        assert client.get("/openapi.json").status_code == 200


def test_every_route_but_health_needs_the_token():
    app = Echo().build_app(run_token=TOKEN)
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        for method, path in [
            ("POST", "/echo"),
            ("GET", "/tools"),
            ("POST", "/verify"),
            ("POST", "/seed_session"),
            ("GET", "/openapi.json"),
            ("GET", "/docs"),
            ("POST", "/close_session"),
            ("GET", "/no_such_route"),
            ("GET", "/health/../tools"),
        ]:
            answer = client.request(method, path, json={"text": "a"})
            assert answer.status_code == 401, (method, path, answer.status_code)
            assert answer.headers["www-authenticate"] == "Bearer" and TOKEN not in answer.text
        for wrong in ["", "tok-", TOKEN + "x", TOKEN.upper(), f"Bearer {TOKEN}"]:
            assert client.post("/echo", json={"text": "a"}, headers={TOKEN_HEADER: wrong}).status_code == 401, wrong
        assert client.post("/echo", json={"text": "a"}, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
        assert client.post("/echo", json={"text": "a"}, headers={TOKEN_HEADER: TOKEN}).json() == {"text": "a"}
        assert client.post("/echo", json={"text": "a"}, headers={"Authorization": f"Bearer {TOKEN}"}).json() == {
            "text": "a"
        }
        assert client.get("/openapi.json", headers={TOKEN_HEADER: TOKEN}).status_code == 200


def test_token_is_checked_before_the_body_is_read():
    """A caller without the token gets 401 even for a body over the size limit: nothing of the request is processed."""
    with TestClient(Echo({"max_body_mb": 0.001}).build_app(run_token=TOKEN)) as client:
        assert (
            client.post("/echo", content=b"x" * 10_000, headers={"content-type": "application/json"}).status_code == 401
        )
        assert (
            client.post(
                "/echo", content=b"x" * 10_000, headers={"content-type": "application/json", TOKEN_HEADER: TOKEN}
            ).status_code
            == 413
        )


def test_head_server_needs_the_token():
    with TestClient(build_head_app(run_token=TOKEN)) as client:
        assert client.get("/health").status_code == 200
        registration = {
            "name": "x",
            "server_type": "resources_servers",
            "implementation": "y",
            "url": "http://127.0.0.1:1",
            "pid": 1,
        }
        assert client.post("/register", json=registration).status_code == 401
        assert client.get("/servers").status_code == 401
        assert client.post("/register", json=registration, headers={TOKEN_HEADER: TOKEN}).status_code == 200
        assert client.get("/servers", headers={TOKEN_HEADER: TOKEN}).json()[0]["name"] == "x"


def test_server_client_sends_the_token_over_real_http():
    head = build_head_app(run_token=TOKEN)
    with serve(head) as head_url, serve(Echo().build_app(run_token=TOKEN)) as echo_url:
        head.state.servers["echo"] = {"name": "echo", "url": echo_url}

        async def call(token: str | None) -> dict:
            async with ServerClient(head_url, run_token=token) as client:
                return await client.post("echo", "/echo", {"text": "hi"})

        assert asyncio.run(call(TOKEN)) == {"text": "hi"}
        with pytest.raises(ServerHTTPError) as caught:
            asyncio.run(call(None))
        assert caught.value.status_code == 401 and TOKEN not in str(caught.value)


def test_token_file_is_owner_only(tmp_path):
    token = new_run_token()
    assert len(token) >= 40 and token != new_run_token()
    path = write_token_file(tmp_path, token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(tmp_path) == token
    with pytest.raises(FileExistsError):
        write_token_file(tmp_path, "other")
    assert read_token_file(tmp_path / "missing") is None


def _fake_live_run(home, run_id: str, head_url: str, server_url: str, token: str | None) -> None:
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    me = psutil.Process()
    state = {
        "run_id": run_id,
        "pid": me.pid,
        "process_create_time": me.create_time(),
        "started_at": time.time(),
        "head_url": head_url,
        "servers": [{"name": "s", "url": server_url}],
    }
    (run_dir / "state.json").write_text(json.dumps(state))
    if token:
        write_token_file(run_dir, token)


def test_tools_outside_the_run_find_its_token_by_address(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path))
    monkeypatch.delenv(RUN_TOKEN_ENV, raising=False)
    _fake_live_run(tmp_path, "a", "http://127.0.0.1:1111", "http://127.0.0.1:2222", "token-a")
    _fake_live_run(tmp_path, "b", "http://127.0.0.1:3333", "http://127.0.0.1:4444", None)  # +allow_unauthenticated=true
    assert run_token_for_url("http://127.0.0.1:1111") == "token-a"
    assert run_token_for_url("http://127.0.0.1:2222/v1/responses") == "token-a"
    assert run_token_for_url("http://127.0.0.1:3333") is None
    assert run_token_for_url("http://127.0.0.1:9999") is None
    assert run_token_for_url(None) is None


def test_a_server_takes_the_token_out_of_its_environment(monkeypatch):
    monkeypatch.setenv(RUN_TOKEN_ENV, TOKEN)
    monkeypatch.setattr(auth, "_process_token", None)
    assert take_run_token_from_env() == TOKEN
    assert RUN_TOKEN_ENV not in os.environ  # children it starts (vLLM, sandboxes) do not inherit it
    assert auth.current_run_token() == TOKEN and run_token_for_url("http://127.0.0.1:1") == TOKEN


def test_head_and_401_answers_never_carry_the_token():
    with TestClient(build_head_app(run_token=TOKEN)) as client:
        texts = [client.get(p).text for p in ["/health", "/servers", "/openapi.json", "/servers/x"]]
        texts += [
            client.get(p, headers={TOKEN_HEADER: TOKEN}).text for p in ["/servers", "/openapi.json", "/servers/x"]
        ]
    assert not [t for t in texts if TOKEN in t]


def test_refused_uploads_get_their_401_over_real_http():
    """The body of a refused request is drained (small) or the connection closed after the answer (large):
    either way the client reads the 401, never a reset."""
    with serve(Echo().build_app(run_token=TOKEN)) as url, httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(50):  # one keep-alive connection: each 401 leaves it usable
            assert client.post("/echo", json={"text": "x" * 5000}).status_code == 401
        assert client.post("/echo", json={"text": "a"}, headers={TOKEN_HEADER: TOKEN}).json() == {"text": "a"}
        assert (
            client.post("/echo", content=b"x" * (8 << 20), headers={"content-type": "application/json"}).status_code
            == 401
        )
        assert client.get("/tools", headers={TOKEN_HEADER: TOKEN}).status_code == 200


def test_nemo_gym_07_probe_routes_need_no_token():
    """NeMo Gym 0.7.0's probe routes on our servers and head, without the token (they hold no data): a server's
    `/readyz` and `/healthz` as its `/health`, `/livez` and `/` liveness; the head's `/readyz` and `/healthz` 503
    until ng_run marks the run ready (every server healthy), as 0.7.0's head answers."""
    with TestClient(Echo().build_app(run_token=TOKEN)) as client:
        for path in ("/readyz", "/healthz"):
            assert (
                client.get(path).json()
                == client.get("/health").json()
                == {
                    "status": "ok",
                    "name": "server",
                    "server_type": "resources_servers",
                }
            )
        for path in ("/livez", "/"):
            assert client.get(path).json() == {"status": "ok"}
    app = build_head_app(run_token=TOKEN)
    with TestClient(app) as client:
        for path in ("/readyz", "/healthz"):
            answer = client.get(path)
            assert (answer.status_code, answer.json()) == (503, {"status": "starting"})
        assert client.get("/livez").json() == client.get("/").json() == {"status": "ok"}
        app.state.ready = True
        assert [client.get(p).json() for p in ("/readyz", "/healthz")] == [{"status": "ok"}] * 2
        assert client.get("/servers").status_code == 401  # the rest still needs the token


def test_nemo_gym_07s_rollout_path_prefix_is_taken_off():
    """NeMo Gym 0.7.0's agents call `/ng-rollout/<rollout id>/v1/responses`: our servers serve `/ng-rollout/<id>/<rest>`
    as `/<rest>` (`nemo_gym.serving.rollout_prefix`), behind the same token check; an id that is no path-safe
    segment is not taken off (404)."""
    with TestClient(Echo().build_app(run_token=TOKEN)) as client:
        headers = {TOKEN_HEADER: TOKEN}
        assert client.post("/ng-rollout/3-0/echo", json={"text": "a"}, headers=headers).json() == {"text": "a"}
        assert client.post("/ng-rollout/3-0/echo", json={"text": "a"}).status_code == 401
        assert client.post("/ng-rollout/.hidden/echo", json={"text": "a"}, headers=headers).status_code == 404
