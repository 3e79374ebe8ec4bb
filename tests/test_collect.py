"""Rollout collection against a real agent server on loopback (uvicorn in a thread, found through a real head
server). The agent is a tiny deterministic `AgentServer`: reward = row["x"] + rollout index / 10; it can fail
(raising ServerUnavailableError, which the base class answers as 502 with a typed body), answer without a
reward, or be slow."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request

from nemo_gym.collect.command import CollectConfig, collect_main, collect_rollouts
from nemo_gym.collect.files import OutputPaths
from nemo_gym.collect.liveness import Verdict, decide
from nemo_gym.common.errors import ConfigError, DataError, ServerError, ServersGoneError, ServerUnavailableError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.agent_server import AgentServer
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import build_head_app, discover_head_url
from nemo_gym.serving.retry_policy import ClientTimeouts

REPO = Path(__file__).resolve().parent.parent
FAST = ClientTimeouts(connect_s=2.0, read_s=10.0, max_retries=1, backoff_s=0.01)


class ScoringAgent(AgentServer):
    """Deterministic agent: reward = row["x"] + _ng_rollout_index / 10. Knobs (set by the tests):
    `fail_tasks` (raise ServerUnavailableError), `no_reward_tasks` (answer without reward), `delay_s`."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.reset()

    def reset(self) -> None:
        self.fail_tasks: set[int] = set()
        self.no_reward_tasks: set[int] = set()
        self.delay_s = 0.0
        self.calls: Counter = Counter()
        self.in_flight = 0
        self.max_in_flight = 0

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        task, rollout = row["_ng_task_index"], row["_ng_rollout_index"]
        self.calls[(task, rollout)] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if task in self.fail_tasks:
                raise ServerUnavailableError("policy model unreachable", server="policy_model")
            answer = {
                **row,
                "response": {"output": [], "usage": {"output_tokens": 3}},
                "verifier_note": "ok",
                "stop_reason": "completed",
            }
            if task not in self.no_reward_tasks:
                answer["reward"] = float(row["x"]) + rollout / 10
            return answer
        finally:
            self.in_flight -= 1


class MetricsAgent(ScoringAgent):
    """Like ScoringAgent, and it serves `/aggregate_metrics` (sum of rewards)."""

    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)

        @app.post("/aggregate_metrics")
        async def aggregate_metrics(request: Request) -> dict:
            body = await request.json()
            return {
                "reward_sum": sum(r["reward"] for r in body["verify_responses"]),
                "n": len(body["verify_responses"]),
            }


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 (OS-chosen port) in a daemon thread."""

    def __init__(self, app: FastAPI):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def gym():
    """A head server with two agents registered: `agent` (ScoringAgent) and `metrics_agent` (MetricsAgent)."""
    agent, metrics_agent = ScoringAgent(name="agent"), MetricsAgent(name="metrics_agent")
    served = {
        "head": Served(build_head_app()),
        "agent": Served(agent.build_app()),
        "metrics_agent": Served(metrics_agent.build_app()),
    }
    for name in ("agent", "metrics_agent"):
        registration = {
            "name": name,
            "server_type": "responses_api_agents",
            "implementation": "test",
            "url": served[name].url,
            "pid": os.getpid(),
        }
        httpx.post(served["head"].url + "/register", json=registration, trust_env=False).raise_for_status()
    yield {"head_url": served["head"].url, "agent": agent, "metrics_agent": metrics_agent}
    for s in served.values():
        s.stop()


@pytest.fixture
def agent(gym):
    gym["agent"].reset()
    gym["metrics_agent"].reset()
    return gym["agent"]


def write_input(path: Path, n: int, **extra: Any) -> Path:
    rows = [{"responses_create_params": {"input": f"task {i}", "temperature": 0.0}, "x": i, **extra} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path: Path, gym: dict, **overrides: Any) -> CollectConfig:
    values = {
        "agent_name": "agent",
        "input_jsonl_fpath": str(tmp_path / "in.jsonl"),
        "output_jsonl_fpath": str(tmp_path / "out" / "rollouts.jsonl"),
        "head_server_url": gym["head_url"],
        "progress": False,
        "max_retries": 0,
        **overrides,
    }
    return CollectConfig(**values)


def collect(cfg: CollectConfig):
    async def run():
        async with ServerClient(discover_head_url(cfg.head_server_url), timeouts=FAST) as client:
            return await collect_rollouts(cfg, client)

    return asyncio.run(run())


def rows_of(path: Path | str) -> list[dict]:
    return read_jsonl(Path(path))


def pairs_of(path: Path | str) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows_of(path)]


# -- input validation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"responses_create_params": {}}', '{"responses_create_params": {}', '{"responses_create_params": {}}'],
            r"in\.jsonl:2: not valid JSON",
        ),
        (
            ['{"responses_create_params": {}}', "", '{"x": 1}'],
            r"in\.jsonl:3: needs a `responses_create_params` object \(it is missing\)",
        ),
        (['{"responses_create_params": "hi"}'], r"in\.jsonl:1: needs a `responses_create_params` object \(got str\)"),
        (['{"responses_create_params": {}, "agent_ref": "agent"}'], r"in\.jsonl:1: agent_ref must be an object"),
    ],
)
def test_malformed_input_stops_before_any_rollout(tmp_path, gym, agent, lines, message):
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    cfg = config(tmp_path, gym)
    with pytest.raises(DataError, match=message):
        collect(cfg)
    assert not agent.calls
    assert not Path(cfg.output_jsonl_fpath).exists()


def test_rows_without_agent_are_named(tmp_path, gym, agent):
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"responses_create_params": {}, "agent_ref": {"name": "agent"}}\n{"responses_create_params": {}}\n'
    )
    with pytest.raises(
        DataError, match=r"in\.jsonl:2: row has no agent_ref \(nor NeMo Gym.s task_source\); pass \+agent_name"
    ):
        collect(config(tmp_path, gym, agent_name=None))
    assert not agent.calls


def test_unknown_agent_fails_before_any_rollout(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 2)
    with pytest.raises(ServerError, match="'nobody' is not registered with the head server"):
        collect(config(tmp_path, gym, agent_name="nobody"))
    assert not agent.calls


# -- collection -------------------------------------------------------------------------------------------
def test_limit_repeats_and_row_contents(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 5)
    cfg = config(
        tmp_path, gym, limit=3, num_repeats=2, responses_create_params={"temperature": 0.7, "max_output_tokens": 16}
    )
    summary = collect(cfg)

    assert summary.rollouts_expected == summary.rollouts_done == summary.rollouts_this_run == 6
    assert summary.exit_status == 0 and summary.rollouts_missing == 0
    expected_pairs = {(t, r) for t in range(3) for r in range(2)}
    assert sorted(pairs_of(cfg.output_jsonl_fpath)) == sorted(expected_pairs)
    assert set(agent.calls) == expected_pairs and set(agent.calls.values()) == {1}
    # mean reward = mean over tasks 0..2 and repeats 0..1 of x + r/10 = (0+1+2)/3 + (0 + 0.1)/2 = 1.05
    assert summary.mean_reward == pytest.approx(1.05)
    for row in rows_of(cfg.output_jsonl_fpath):
        assert row["reward"] == pytest.approx(row["x"] + row["_ng_rollout_index"] / 10)
        assert row["agent_ref"] == {"name": "agent"}
        assert row["responses_create_params"] == {
            "input": f"task {row['x']}",
            "temperature": 0.7,
            "max_output_tokens": 16,
        }
        assert row["verifier_note"] == "ok" and row["response"]["usage"] == {"output_tokens": 3}

    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    materialized = rows_of(paths.materialized_inputs)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in materialized] == sorted(expected_pairs)
    assert materialized[0]["responses_create_params"]["temperature"] == 0.7
    assert not paths.failures.exists()
    assert json.loads(paths.state.read_text())["num_repeats"] == 2


def test_concurrency_bound_is_respected(tmp_path, gym, agent):
    agent.delay_s = 0.05
    write_input(tmp_path / "in.jsonl", 12)
    collect(config(tmp_path, gym, num_samples_in_parallel=3))
    assert sum(agent.calls.values()) == 12
    assert agent.max_in_flight == 3


def test_failures_go_to_failures_file_and_exit_status_1(tmp_path, gym, agent, capsys):
    agent.fail_tasks = {1}
    agent.no_reward_tasks = {3}
    write_input(tmp_path / "in.jsonl", 4)
    cfg = config(tmp_path, gym, num_repeats=2)

    assert collect_main(cfg) == 1

    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    assert sorted(pairs_of(paths.output)) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    failures = rows_of(paths.failures)
    assert sorted((f["_ng_task_index"], f["_ng_rollout_index"], f["failure_class"]) for f in failures) == [
        (1, 0, "unavailable"),
        (1, 1, "unavailable"),
        (3, 0, "bad_verify_answer"),
        (3, 1, "bad_verify_answer"),
    ]
    unavailable = next(f for f in failures if f["failure_class"] == "unavailable")
    assert "policy model unreachable" in unavailable["message"]
    assert unavailable["status_code"] == 502 and unavailable["failed_server"] == "policy_model"
    assert unavailable["agent_ref"] == {"name": "agent"} and unavailable["timestamp"]
    out = capsys.readouterr().out
    assert "Rollouts: 4/8" in out and "Failed: 4 rollouts (bad_verify_answer: 2, unavailable: 2)" in out
    assert str(paths.failures) in out

    metrics = json.loads(paths.aggregate_metrics.read_text())
    assert metrics["collection"]["rollouts_failed"] == 4
    assert metrics["collection"]["failures_by_class"] == {"unavailable": 2, "bad_verify_answer": 2}
    # rewards in the output: task 0: 0, 0.1; task 2: 2, 2.1 → mean 4.2 / 4 = 1.05; failures are not zeros
    assert metrics["agents"][0]["agent_metrics"]["mean_reward"] == pytest.approx(1.05)


def test_aggregate_metrics_from_agent_route_or_local(tmp_path, gym, agent):
    path = tmp_path / "in.jsonl"
    rows = [
        {"responses_create_params": {}, "x": 1},  # agent_name default: `agent`, which has no /aggregate_metrics
        {"responses_create_params": {}, "x": 2, "agent_ref": {"name": "metrics_agent"}},
        {"responses_create_params": {}, "x": 4, "agent_ref": {"name": "metrics_agent"}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(tmp_path, gym, num_repeats=2)
    summary = collect(cfg)

    metrics = json.loads(OutputPaths.for_output(cfg.output_jsonl_fpath).aggregate_metrics.read_text())
    by_name = {entry["agent_ref"]["name"]: entry for entry in metrics["agents"]}
    # local for `agent`: rewards 1.0, 1.1 → mean 1.05, min 1.0, max 1.1
    assert by_name["agent"]["source"] == "local" and "agent_metrics_error" not in by_name["agent"]
    local = by_name["agent"]["agent_metrics"]
    assert local.pop("stop_reasons") == {"completed": 2}
    assert local == pytest.approx({"num_rollouts": 2, "mean_reward": 1.05, "min_reward": 1.0, "max_reward": 1.1})
    # the agent's own route: sum of 2.0, 2.1, 4.0, 4.1 = 12.2 over 4 rollouts
    assert by_name["metrics_agent"]["source"] == "agent"
    assert by_name["metrics_agent"]["agent_metrics"] == pytest.approx({"reward_sum": 12.2, "n": 4})
    collection = metrics["collection"]
    assert collection["rollouts_done"] == 6 and collection["rollouts_this_run"] == 6 and collection["retries"] == 0
    assert collection["wall_s"] > 0 and collection["rollouts_per_s"] == pytest.approx(6 / collection["wall_s"])
    assert summary.rollouts_per_s == pytest.approx(collection["rollouts_per_s"])


# -- resume -------------------------------------------------------------------------------------------------
def test_resume_after_truncated_last_line_runs_only_missing_pairs(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 4)
    cfg = config(tmp_path, gym, num_repeats=2)
    collect(cfg)
    out = Path(cfg.output_jsonl_fpath)
    lines = out.read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[:3])
    out.write_bytes(kept + lines[3][: len(lines[3]) // 2])  # a crash in the middle of the 4th row
    OutputPaths.for_output(out).aggregate_metrics.unlink()
    finished = {(row["_ng_task_index"], row["_ng_rollout_index"]) for row in map(orjson.loads, lines[:3])}
    agent.calls.clear()

    summary = collect(cfg)

    assert out.read_bytes().startswith(kept)  # finished rows untouched
    pairs = pairs_of(out)
    assert len(pairs) == len(set(pairs)) == 8  # exactly one row per (task, repeat)
    assert set(agent.calls) == {(t, r) for t in range(4) for r in range(2)} - finished  # nothing redone
    assert summary.rollouts_resumed == 3 and summary.rollouts_this_run == 5 and summary.exit_status == 0
    # mean over all 8 rollouts: (0+1+2+3)/4 + 0.05 = 1.55
    assert summary.mean_reward == pytest.approx(1.55)
    assert OutputPaths.for_output(out).aggregate_metrics.exists()


def test_resume_retries_pairs_that_only_failed(tmp_path, gym, agent):
    agent.fail_tasks = {0}
    write_input(tmp_path / "in.jsonl", 3)
    cfg = config(tmp_path, gym, num_repeats=2)
    assert collect(cfg).exit_status == 1
    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    assert sorted(pairs_of(paths.failures)) == [(0, 0), (0, 1)]

    agent.fail_tasks = set()
    agent.calls.clear()
    summary = collect(cfg)

    assert set(agent.calls) == {(0, 0), (0, 1)}
    assert summary.exit_status == 0
    assert sorted(pairs_of(paths.output)) == [(t, r) for t in range(3) for r in range(2)]
    assert not paths.failures.exists()


def test_resume_refuses_a_changed_input_and_resume_false_starts_over(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 3)
    cfg = config(tmp_path, gym)
    collect(cfg)
    write_input(tmp_path / "in.jsonl", 3, extra_field="changed")
    agent.calls.clear()
    with pytest.raises(
        ConfigError, match=r"different input.*the task rows differ.*new \+output_jsonl_fpath, or \+resume=false"
    ):
        collect(cfg)
    with pytest.raises(ConfigError, match="num_repeats was 1, now 2"):
        collect(config(tmp_path, gym, num_repeats=2))
    with pytest.raises(ConfigError, match=r"it had 3 tasks, this input \(after limit\) has 2"):
        collect(config(tmp_path, gym, limit=2))
    assert not agent.calls

    old = Path(cfg.output_jsonl_fpath).read_bytes()
    summary = collect(config(tmp_path, gym, resume=False))
    assert summary.rollouts_this_run == 3
    assert Path(cfg.output_jsonl_fpath + ".bak").read_bytes() == old
    assert all(r["extra_field"] == "changed" for r in rows_of(cfg.output_jsonl_fpath))


def test_output_without_state_file_is_not_resumed_blindly(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 2)
    cfg = config(tmp_path, gym)
    Path(cfg.output_jsonl_fpath).parent.mkdir()
    Path(cfg.output_jsonl_fpath).write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1}\n')
    with pytest.raises(ConfigError, match="no rollouts_state.json"):
        collect(cfg)


def test_cancel_mid_run_then_resume(tmp_path, gym, agent):
    """Ctrl-C = cancelling the collection task: finished rows stay whole, resume completes the rest once."""
    agent.delay_s = 0.05
    write_input(tmp_path / "in.jsonl", 10)
    cfg = config(tmp_path, gym, num_samples_in_parallel=2)
    out = Path(cfg.output_jsonl_fpath)

    async def run_and_cancel() -> None:
        async with ServerClient(gym["head_url"], timeouts=FAST) as client:
            task = asyncio.create_task(collect_rollouts(cfg, client))
            while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run_and_cancel())
    partial = pairs_of(out)  # every line parses: nothing half-written
    assert 3 <= len(partial) < 10
    assert out.read_bytes().endswith(b"\n")
    assert not OutputPaths.for_output(out).aggregate_metrics.exists()

    agent.delay_s = 0.0
    summary = collect(cfg)
    pairs = pairs_of(out)
    assert sorted(pairs) == [(t, 0) for t in range(10)]
    assert all(agent.calls[pair] == 1 for pair in partial)  # finished ones were not redone
    assert summary.rollouts_resumed == len(partial)


# -- servers gone (nemo_gym.collect.liveness) -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("head_answers", "agent_answers", "agent_refused_s", "verdict"),
    [
        (False, False, 0.0, Verdict.GONE),  # ng_run ended: head server and agent refuse
        (False, True, 0.0, Verdict.GONE),  # the head server is gone: no address can be refreshed, the run is over
        (True, True, 0.0, Verdict.ANSWERS),  # one refused call among answers: the rollout's own failure
        (None, True, 0.0, Verdict.ANSWERS),  # fixed addresses, no head server
        (True, False, 0.0, Verdict.WAIT),  # the agent may be restarting
        (True, False, 9.9, Verdict.WAIT),
        (True, False, 10.0, Verdict.GONE),  # refused for servers_gone_s
        (None, False, 10.0, Verdict.GONE),
    ],
)
def test_servers_gone_decision(head_answers, agent_answers, agent_refused_s, verdict):
    assert decide(head_answers, agent_answers, agent_refused_s, servers_gone_s=10.0) is verdict


class Refuser:
    """A client middleware (`ServerClient(middlewares=[...])`): a request for which `refuses(base_url, path, body)`
    is true goes to a port bound and never listened on, so its connect fails with a real ECONNREFUSED."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.refuses = lambda base_url, path, body: False
        self.refused = 0

    async def __call__(self, request, handler):
        body = await request.body.as_bytes() if request.body else b""
        if self.refuses(f"http://{request.url.host}:{request.url.port}", request.url.path, body):
            self.refused += 1
            request.url = request.url.with_port(self.sock.getsockname()[1])
        return await handler(request)


def collect_refused(
    cfg: CollectConfig, refuser: Refuser, refuse: Any, *, once: Any = lambda: True, for_s: float | None = None
):
    """`collect_rollouts(cfg)` through a client with `refuser`; once `once()` is true (polled every 10 ms),
    `refuser.refuses` becomes `refuse` (for `for_s` seconds, then nothing is refused again; None: to the end)."""

    async def switch() -> None:
        while not once():
            await asyncio.sleep(0.01)
        refuser.refuses = refuse
        if for_s is not None:
            await asyncio.sleep(for_s)
            refuser.refuses = lambda base_url, path, body: False

    async def run():
        async with ServerClient(cfg.head_server_url, timeouts=FAST, middlewares=[refuser]) as client:
            switching = asyncio.create_task(switch())
            try:
                return await collect_rollouts(cfg, client)
            finally:
                switching.cancel()

    return asyncio.run(run())


def rows_written(cfg: CollectConfig) -> int:
    out = Path(cfg.output_jsonl_fpath)
    return out.read_bytes().count(b"\n") if out.exists() else 0


def test_one_refused_call_among_answers_is_a_failure_record_not_a_stop(tmp_path, gym, agent):
    """The agent refuses only task 2's /run (its /health answers): that rollout is an `unavailable` record, the
    collection goes on."""
    write_input(tmp_path / "in.jsonl", 6)
    cfg = config(tmp_path, gym, servers_gone_s=0.0)  # an agent that refused its probe would stop it at once
    refuser = Refuser()
    summary = collect_refused(
        cfg, refuser, lambda base_url, path, body: path == "/run" and b'"_ng_task_index":2,' in body
    )
    assert refuser.refused == 2  # the attempt and FAST's one retry
    assert summary.exit_status == 1 and summary.failures_by_class == {"unavailable": 1}
    assert sorted(pairs_of(cfg.output_jsonl_fpath)) == [(t, 0) for t in (0, 1, 3, 4, 5)]
    assert pairs_of(OutputPaths.for_output(cfg.output_jsonl_fpath).failures) == [(2, 0)]


def test_agent_restarting_briefly_does_not_stop_the_collection(tmp_path, gym, agent):
    """Every connection to the agent, /health too, refused for 1 s mid-collection (a restart): with servers_gone_s=5
    the collection goes on; each pair has a row or an `unavailable` record."""
    agent.delay_s = 0.02
    write_input(tmp_path / "in.jsonl", 40)
    cfg = config(tmp_path, gym, num_samples_in_parallel=4, servers_gone_s=5.0)
    refuser = Refuser()
    agent_url = httpx.get(f"{gym['head_url']}/servers/agent", trust_env=False).raise_for_status().json()["url"]
    summary = collect_refused(
        cfg, refuser, lambda base_url, path, body: base_url == agent_url, once=lambda: rows_written(cfg) >= 3, for_s=1.0
    )
    assert refuser.refused > 0
    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    done, failed = pairs_of(paths.output), pairs_of(paths.failures) if paths.failures.exists() else []
    assert sorted(done + failed) == [(t, 0) for t in range(40)]
    assert summary.rollouts_done == len(done) >= 36 and set(summary.failures_by_class) <= {"unavailable"}


def test_agent_gone_stops_after_servers_gone_s_and_resume_completes(tmp_path, gym, agent):
    """The agent refuses every connection from the 3rd row on, the head server answering: ServersGoneError names
    it after servers_gone_s; the rollouts not finished are not failure records; a resume completes each pair once."""
    agent.delay_s = 0.02
    write_input(tmp_path / "in.jsonl", 30)
    cfg = config(tmp_path, gym, num_samples_in_parallel=4, servers_gone_s=0.5)
    agent_url = httpx.get(f"{gym['head_url']}/servers/agent", trust_env=False).raise_for_status().json()["url"]
    started = time.monotonic()
    with pytest.raises(
        ServersGoneError, match=r"agent 'agent' \(http://127\.0\.0\.1:\d+\) refuses connections for [\d.]+ s"
    ) as gone:
        collect_refused(
            cfg, Refuser(), lambda base_url, path, body: base_url == agent_url, once=lambda: rows_written(cfg) >= 3
        )
    assert time.monotonic() - started < 10
    assert gone.value.head_url is None and gone.value.agents == {"agent": [agent_url]}
    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    done = pairs_of(paths.output)
    assert 3 <= len(done) == len(set(done)) < 30
    assert not paths.failures.exists()

    agent.calls.clear()
    summary = collect(cfg)
    assert summary.exit_status == 0 and summary.rollouts_resumed == len(done)
    assert sorted(pairs_of(paths.output)) == [(t, 0) for t in range(30)]
    assert not set(agent.calls) & set(done)


def test_head_server_and_agent_gone_stop_at_once(tmp_path, gym, agent):
    """Head server and agent refuse (their ng_run ended): the collection stops at the first such failure, well
    before servers_gone_s, naming both."""
    agent.delay_s = 0.02
    write_input(tmp_path / "in.jsonl", 30)
    cfg = config(tmp_path, gym, num_samples_in_parallel=4, servers_gone_s=60.0)
    agent_url = httpx.get(f"{gym['head_url']}/servers/agent", trust_env=False).raise_for_status().json()["url"]
    started = time.monotonic()
    with pytest.raises(
        ServersGoneError,
        match=r"the head server http://\S+ refuses connections .*; agent 'agent' \(\S+\) refuses connections$",
    ) as gone:
        collect_refused(
            cfg,
            Refuser(),
            lambda base_url, path, body: base_url in (agent_url, gym["head_url"]),
            once=lambda: rows_written(cfg) >= 3,
        )
    assert time.monotonic() - started < 10
    assert gone.value.head_url == gym["head_url"] and set(gone.value.agents) == {"agent"}
    assert not OutputPaths.for_output(cfg.output_jsonl_fpath).failures.exists()


def test_head_server_gone_stops_rollouts_still_in_flight(tmp_path, gym, agent):
    """The head server refuses while every rollout is still in flight (slow agent): the head server's watch stops
    the collection within seconds, without waiting for a rollout to end; nothing is recorded."""
    agent.delay_s = 3.0
    write_input(tmp_path / "in.jsonl", 8)
    cfg = config(tmp_path, gym, num_samples_in_parallel=4)
    started = time.monotonic()
    with pytest.raises(
        ServersGoneError,
        match=(
            r"^the servers stopped answering: the head server http://\S+ refuses connections \(its ng_run has ended\)$"
        ),
    ) as gone:
        collect_refused(
            cfg, Refuser(), lambda base_url, path, body: base_url == gym["head_url"], once=lambda: agent.in_flight == 4
        )
    assert time.monotonic() - started < 2.5  # the head server's probe every second; the rollouts take 3 s
    assert gone.value.head_url == gym["head_url"] and gone.value.agents == {}
    assert rows_written(cfg) == 0 and not OutputPaths.for_output(cfg.output_jsonl_fpath).failures.exists()
    deadline = time.monotonic() + 10
    while agent.in_flight:  # let the agent finish the requests the collector left, before the next test counts
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.long
@pytest.mark.integration
def test_sigint_exits_130_and_says_how_to_resume(tmp_path, gym, agent):
    agent.delay_s = (
        0.5  # 20 rows, 2 at a time: ~5 s of work, so the SIGINT comes mid-collection even on a loaded machine
    )
    write_input(tmp_path / "in.jsonl", 20)
    cfg = config(tmp_path, gym, num_samples_in_parallel=2)
    # Started with SIGINT ignored, as a background job (`cmd &` without job control, as CI harnesses start pytest) is:
    # Python then installs no KeyboardInterrupt, and ng_collect_rollouts must stop on SIGINT all the same.
    code = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    code += (
        "import sys; from nemo_gym.collect.command import CollectConfig, collect_main;"
        f" sys.exit(collect_main(CollectConfig.model_validate_json({cfg.model_dump_json()!r})))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out = Path(cfg.output_jsonl_fpath)
    deadline = time.monotonic() + 30
    while not (out.exists() and out.read_bytes().count(b"\n") >= 2):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Rerun the same command to collect only the missing ones" in stderr
    assert len(pairs_of(out)) < 20

    agent.delay_s = 0.0
    assert collect_main(cfg) == 0
    assert sorted(pairs_of(out)) == [(t, 0) for t in range(20)]


@pytest.mark.long
@pytest.mark.integration
def test_cli_collect_and_profile_through_ng_run(tmp_path):
    """The console scripts against real processes: ng_run (simple_agent, scripted model, weather server)."""
    from ng_process import BIN, NgRun

    data = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
    out, profile = tmp_path / "rollouts.jsonl", tmp_path / "profile.jsonl"
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]") as run:
        head = run.wait_ready()
        collect_cmd = [
            str(BIN / "ng_collect_rollouts"),
            f"+head_server_url={head}",
            "+agent_name=weather_agent",
            f"+input_jsonl_fpath={data}",
        ]
        collect_cmd += [f"+output_jsonl_fpath={out}", "+num_repeats=2", "+progress=false"]
        done = subprocess.run(collect_cmd, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "Rollouts: 10/10" in done.stdout
        # NeMo Gym 0.7.0's collated rows: no agent_ref, the declaring instance in task_source (here the resources
        # server `weather`, which only weather_agent's config names); no +agent_name
        sourced = tmp_path / "sourced.jsonl"
        sourced.write_text("".join(json.dumps({**row, "task_source": "weather"}) + "\n" for row in rows_of(data)))
        sourced_cmd = [str(BIN / "ng_collect_rollouts"), f"+head_server_url={head}", f"+input_jsonl_fpath={sourced}"]
        sourced_cmd += [f"+output_jsonl_fpath={tmp_path / 'sourced_rollouts.jsonl'}", "+progress=false"]
        done = subprocess.run(sourced_cmd, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert {r["agent_ref"]["name"] for r in rows_of(tmp_path / "sourced_rollouts.jsonl")} == {"weather_agent"}
        run.stop()
    assert sorted(pairs_of(out)) == [(t, r) for t in range(5) for r in range(2)]
    metrics = json.loads(OutputPaths.for_output(out).aggregate_metrics.read_text())
    assert metrics["agents"][0]["source"] == "agent" and metrics["agents"][0]["agent_metrics"]["num_rollouts"] == 10

    profile_cmd = [
        str(BIN / "ng_profile"),
        f"+input_jsonl_fpath={data}",
        f"+rollouts_jsonl_fpath={out}",
        f"+output_jsonl_fpath={profile}",
        "+pass_threshold=1",
    ]
    done = subprocess.run(profile_cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [row["total_samples"] for row in rows_of(profile)] == [2] * 5
    assert "Tasks: 5/5 profiled, 10 samples" in done.stdout
