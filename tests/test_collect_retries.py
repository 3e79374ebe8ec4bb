"""Retries only for transient failures, and bounded time to failure.

Real HTTP on 127.0.0.1 throughout: small FastAPI apps answering chosen failures, real agent servers (the
`simple_agent` against `scripted_model` with `error_status`, or a black-holed model: a socket that accepts and
never answers), collections through `collect_rollouts`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from live_servers import serve

from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.common.errors import (
    ServerBadAnswerError,
    ServerHTTPError,
    ServerTimeoutError,
    ServerUnavailableError,
    is_transient,
)
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.agent_server import AgentServer
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.serving.server import Session

REPO = Path(__file__).resolve().parent.parent
FAST = ClientTimeouts(
    connect_s=1.0, read_s=2.0, max_retries=2, backoff_s=0.01, backoff_max_s=0.05, retry_after_max_s=1.0
)


def typed(status: int, failure_class: str) -> ServerHTTPError:
    body = json.dumps({"error": {"type": failure_class, "server": "x", "message": "m"}})
    return ServerHTTPError("failed", status_code=status, body=body)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ServerUnavailableError("refused"), True),
        (ServerTimeoutError("slow"), True),
        (ServerHTTPError("busy", status_code=429), True),
        (ServerHTTPError("gateway", status_code=502, body="<html>bad gateway</html>"), True),
        (ServerHTTPError("unavailable", status_code=503), True),
        (ServerHTTPError("gateway timeout", status_code=504), True),
        (typed(502, "unavailable"), True),
        (typed(502, "timeout"), True),
        (typed(502, "judge_unparsable"), False),
        (typed(502, "bad_answer"), False),
        (typed(502, "sandbox_unavailable"), False),
        (typed(502, "http_error"), False),
        (typed(503, "judge_unparsable"), False),
        (ServerHTTPError("invalid", status_code=422), False),
        (ServerHTTPError("bad request", status_code=400), False),
        (typed(424, "http_error"), False),
        (ServerHTTPError("bug", status_code=500), False),
        (ServerBadAnswerError("not json"), False),
        (ValueError("not a server error"), False),
    ],
)
def test_transient_classification(error, transient):
    assert is_transient(error) is transient


# -- the client against a real app --------------------------------------------------------------------------
def failing_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = Counter()

    @app.post("/{kind}")
    async def answer(kind: str):
        app.state.calls[kind] += 1
        n = app.state.calls[kind]
        if kind == "judge_unparsable":
            return JSONResponse(
                {"error": {"type": "judge_unparsable", "server": "judge", "message": "no verdict"}}, status_code=502
            )
        if kind == "inner_unavailable":
            return JSONResponse(
                {"error": {"type": "unavailable", "server": "policy_model", "message": "refused"}}, status_code=502
            )
        if kind == "plain_502":
            return JSONResponse({"detail": "bad gateway"}, status_code=502)
        if kind == "validation":
            return JSONResponse({"detail": [{"loc": ["body", "x"], "msg": "field required"}]}, status_code=422)
        if kind == "rate_limited_once":
            return (
                JSONResponse({"detail": "slow down"}, status_code=429, headers={"Retry-After": "0.3"})
                if n == 1
                else {"ok": n}
            )
        if kind == "rate_limited_long":
            return JSONResponse({"detail": "come back tomorrow"}, status_code=429, headers={"Retry-After": "3600"})
        if kind == "trickle":

            async def drip():
                while True:
                    yield b" "
                    await asyncio.sleep(0.1)

            return StreamingResponse(drip(), media_type="application/json")
        raise HTTPException(404)

    return app


def test_client_retries_only_transient_failures():
    app = failing_app()
    with serve(app) as url:

        async def main():
            async with ServerClient(addresses={"s": url}, timeouts=FAST) as client:
                for kind, status in (("judge_unparsable", 502), ("validation", 422), ("rate_limited_long", 429)):
                    with pytest.raises(ServerHTTPError) as info:
                        await client.post("s", f"/{kind}", {})
                    assert info.value.status_code == status
                for kind in ("inner_unavailable", "plain_502"):
                    with pytest.raises(ServerHTTPError):
                        await client.post("s", f"/{kind}", {})
                start = time.monotonic()
                assert await client.post("s", "/rate_limited_once", {}) == {"ok": 2}
                assert time.monotonic() - start >= 0.3  # Retry-After honoured

        asyncio.run(main())
    assert app.state.calls == {
        "judge_unparsable": 1,
        "validation": 1,
        "rate_limited_long": 1,
        "inner_unavailable": 3,
        "plain_502": 3,
        "rate_limited_once": 2,
    }


def test_a_trickling_answer_hits_the_total_deadline():
    """httpx's read timeout is per chunk; the attempt's total deadline (connect + read) still ends the call."""
    timeouts = ClientTimeouts(
        connect_s=0.5, read_s=0.5, max_retries=1, backoff_s=0.01, backoff_max_s=0.01, retry_after_max_s=0.01
    )
    with serve(failing_app()) as url:

        async def main():
            async with ServerClient(addresses={"s": url}, timeouts=timeouts) as client:
                start = time.monotonic()
                with pytest.raises(ServerTimeoutError):
                    await client.post("s", "/trickle", {})
                return time.monotonic() - start

        elapsed = asyncio.run(main())
    assert elapsed <= timeouts.worst_case_s() + 1.0


# -- collections through real agents ------------------------------------------------------------------------
class ChainAgent(AgentServer):
    """An agent whose /run fails as its row's `fail` says: `judge_unparsable` (a typed deterministic failure
    further down: 502), `flaky` (unreachable model the first two calls: transient 502), `invalid` (422),
    `busy` (429 with Retry-After once); otherwise reward 1."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.calls: Counter = Counter()

    def add_routes(self, app: FastAPI) -> None:
        @app.post("/run")
        async def run(request: Request):
            row = await request.json()
            kind = row.get("fail")
            self.calls[kind] += 1
            n = self.calls[kind]
            if kind == "judge_unparsable":
                return JSONResponse(
                    {"error": {"type": "judge_unparsable", "server": "judge", "message": "verdict not found"}},
                    status_code=502,
                )
            if kind == "flaky" and n <= 2:
                return JSONResponse(
                    {"error": {"type": "unavailable", "server": "policy_model", "message": "refused"}}, status_code=502
                )
            if kind == "invalid":
                return JSONResponse({"detail": [{"loc": ["body", "x"], "msg": "field required"}]}, status_code=422)
            if kind == "busy" and n == 1:
                return JSONResponse({"detail": "busy"}, status_code=429, headers={"Retry-After": "0.2"})
            return {**row, "reward": 1.0, "response": {"output": []}}


def make_config(tmp_path: Path, rows: list[dict], **overrides: Any) -> CollectConfig:
    """Write `rows` as the input and return a config collecting them through the agent named `agent`."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return CollectConfig(
        agent_name="agent",
        input_jsonl_fpath=str(tmp_path / "in.jsonl"),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        progress=False,
        **overrides,
    )


def run_collection(cfg: CollectConfig, addresses: dict[str, str], timeouts: ClientTimeouts):
    async def main():
        async with ServerClient(addresses=addresses, timeouts=timeouts) as client:
            return await collect_rollouts(cfg, client)

    return asyncio.run(main())


def rows_if_any(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def test_collection_retries_transient_failures_only(tmp_path):
    agent = ChainAgent(name="agent")
    rows = [
        {"responses_create_params": {"input": kind}, "fail": kind}
        for kind in ("judge_unparsable", "flaky", "invalid", "busy", None)
    ]
    with serve(agent.build_app()) as url:
        cfg = make_config(tmp_path, rows, max_retries=3)
        summary = run_collection(cfg, {"agent": url}, FAST)
    assert agent.calls == {"judge_unparsable": 1, "flaky": 3, "invalid": 1, "busy": 2, None: 1}
    assert sorted(r["fail"] or "" for r in rows_if_any(tmp_path / "out.jsonl")) == ["", "busy", "flaky"]
    failures = {r["_ng_task_index"]: r for r in rows_if_any(tmp_path / "out_failures.jsonl")}
    assert {i: (f["failure_class"], f["transient"]) for i, f in failures.items()} == {
        0: ("judge_unparsable", False),
        2: ("http_error", False),
    }
    assert failures[2]["status_code"] == 422
    assert summary.retries == 3  # flaky twice, busy once


class EchoResources(ResourcesServer):
    """An environment that scores every answer 1 (the black-hole test never gets to verify)."""

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        return VerifyResult(reward=1.0)


def simple_agent(model_url: str, resources_url: str, timeouts: ClientTimeouts, model_timeout_s: float):
    agent_class = load_server_class(REPO / "responses_api_agents" / "simple_agent" / "app.py")
    config = {
        "resources_server": {"type": "resources_servers", "name": "env"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
        "model_timeout_s": model_timeout_s,
        "max_steps": 2,
    }
    return agent_class(
        config,
        name="agent",
        client=ServerClient(addresses={"policy_model": model_url, "env": resources_url}, timeouts=timeouts),
    )


@pytest.mark.parametrize(
    ("error_status", "failure_class", "model_calls"),
    [(500, "http_error", 1), (422, "http_error", 1), (503, "http_error", 3)],
)
def test_model_errors_through_simple_agent_are_not_retried_by_the_collector(
    tmp_path, error_status, failure_class, model_calls
):
    """scripted_model answering `error_status`: the agent's client retries a 503 itself (transient), then answers
    a typed deterministic failure; the collector does not multiply those retries."""
    model_class = load_server_class(REPO / "responses_api_models" / "scripted_model" / "app.py")
    model = model_class({"error_status": error_status}, name="policy_model")
    app = model.build_app()
    calls = Counter()

    @app.middleware("http")
    async def count(request: Request, call_next):
        calls[request.url.path] += 1
        return await call_next(request)

    with serve(app) as model_url, serve(EchoResources(name="env").build_app()) as env_url:
        agent = simple_agent(model_url, env_url, FAST, model_timeout_s=2.0)
        with serve(agent.build_app()) as agent_url:
            cfg = make_config(tmp_path, [{"responses_create_params": {"input": "hi"}}], max_retries=2)
            summary = run_collection(cfg, {"agent": agent_url}, FAST)
    failures = rows_if_any(tmp_path / "out_failures.jsonl")
    assert [(f["failure_class"], f["transient"]) for f in failures] == [(failure_class, False)]
    assert sum(n for path, n in calls.items() if path.startswith("/v1/")) == model_calls
    assert summary.retries == 0


class BlackHole:
    """A TCP socket on 127.0.0.1 that accepts every connection and never answers (holds them until closed)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.long
@pytest.mark.integration
def test_black_holed_model_ends_with_typed_failures_in_bounded_time(tmp_path):
    """50 rollouts against a model server that accepts and never answers end with `timeout`
    failure records within the sum of the deadlines + 10 s."""
    agent_timeouts = ClientTimeouts(
        connect_s=1.0, read_s=1.0, max_retries=1, backoff_s=0.05, backoff_max_s=0.1, retry_after_max_s=0.1
    )
    model_timeout_s = 1.0
    agent_worst_s = agent_timeouts.worst_case_s(model_timeout_s)  # one /run: the model call's attempts and waits
    collector = ClientTimeouts(
        connect_s=1.0,
        read_s=agent_worst_s + 2.0,
        max_retries=1,
        backoff_s=0.05,
        backoff_max_s=0.1,
        retry_after_max_s=0.1,
    )
    rows, parallel = 50, 50
    budget_s = -(-rows // parallel) * collector.worst_case_s() + 10.0
    hole = BlackHole()
    try:
        with serve(EchoResources(name="env").build_app()) as env_url:
            agent = simple_agent(hole.url, env_url, agent_timeouts, model_timeout_s)
            with serve(agent.build_app()) as agent_url:
                cfg = make_config(
                    tmp_path,
                    [{"responses_create_params": {"input": f"task {i}"}} for i in range(rows)],
                    max_retries=collector.max_retries,
                    num_samples_in_parallel=parallel,
                )
                start = time.monotonic()
                summary = run_collection(cfg, {"agent": agent_url}, collector)
                elapsed = time.monotonic() - start
    finally:
        hole.close()
    failures = rows_if_any(tmp_path / "out_failures.jsonl")
    assert summary.rollouts_done == 0 and len(failures) == rows
    assert {f["failure_class"] for f in failures} == {"timeout"}
    # the agent's model call timed out (on a loaded machine the collector's own /run deadline may come first)
    assert {f.get("failed_server") for f in failures} <= {"policy_model", None}
    assert elapsed <= budget_s, f"took {elapsed:.1f} s, budget {budget_s:.1f} s"
    assert len(hole.held) > 0  # the agents did reach the black hole
