"""No fabricated rewards, and the collector's watchdog.

A seeded fault plan injects faults into about 10 % of calls: the `FaultProxy` between the agent and the
model (connection refused, connection reset before the answer, accept-and-never-answer, reset in the middle of
the body, 500, 503, 429), the same proxy in front of the judge the environment calls, and exceptions in the
verifier. The agent's and the environment's clients take the proxy's client middleware, where a refused connection is
chosen before the call connects (a real ECONNREFUSED; see `fault_proxy`). Each
faulty call stays faulty for a drawn number of attempts (1 to 8), so some recover within the retry budgets
and some exhaust them. After the collection: the rewards in the output equal those of a fault-free run for
the same (task, repeat); the failure records are exactly the pairs whose last call was a fault (the faults
that exhausted their budget), with the failure class that fault maps to.

Real HTTP on 127.0.0.1: scripted_model, simple_agent and a small environment served by uvicorn in threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from chaos.chaos_helpers import assert_exactly_once, read_rows, side_file
from chaos.fault_proxy import FAULTS, FaultProxy, ProxiedRequest
from live_servers import serve

from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.serving.server import Session

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

REPO = Path(__file__).resolve().parents[2]
NUM_TASKS, REPEATS, FAULT_RATE = 20, 2, 0.10
AGENT_TIMEOUTS = ClientTimeouts(
    connect_s=1.0, read_s=1.0, max_retries=1, backoff_s=0.01, backoff_max_s=0.02, retry_after_max_s=0.5
)
COLLECTOR_TIMEOUTS = ClientTimeouts(
    connect_s=1.0, read_s=60.0, max_retries=1, backoff_s=0.01, backoff_max_s=0.02, retry_after_max_s=0.5
)
FAILURE_CLASS = {
    "refused": "unavailable",
    "reset": "unavailable",
    "reset_mid_body": "unavailable",
    "blackhole": "timeout",
    "500": "http_error",
    "503": "http_error",
    "429": "http_error",
    "verifier_exception": "http_error",
}
MODEL_RULES = [{"match": "^JUDGE yes", "reply": "[[A=B]]"}, {"match": "even", "reply": "yes"}]
Pair = tuple[int, int]


class FaultPlan:
    """Which attempt of which call fails, a pure function of (seed, pair, call, attempt number); logs every call."""

    def __init__(self, seed: int, rate: float):
        self.seed, self.rate = seed, rate
        self.sessions: dict[str, Pair] = {}  # session id -> pair, filled by the environment's seed_session
        self.attempts: Counter = Counter()
        self.events: dict[Pair, list[tuple[str, int, str | None]]] = defaultdict(list)  # pair -> (call, attempt, fault)
        self.lock = threading.Lock()

    def fault_for(self, pair: Pair, call: str, kinds: tuple[str, ...]) -> str | None:
        with self.lock:
            attempt = self.attempts[pair, call]
            self.attempts[pair, call] += 1
            rng = random.Random(f"{self.seed}|{pair}|{call}")
            faulty, kind, lasting = rng.random() < self.rate, rng.choice(kinds), rng.choice([1, 2, 3, 8])
            fault = kind if faulty and attempt < lasting else None
            self.events[pair].append((call, attempt, fault))
            return fault

    def decide(self, request: ProxiedRequest) -> str | None:
        pair = self.sessions[request.headers["x-session-id"]]
        return self.fault_for(pair, f"{request.path}#{hashlib.sha256(request.body).hexdigest()[:12]}", FAULTS)

    def last_faults(self) -> dict[Pair, str]:
        """Pairs whose last call was a fault (their budget ran out), with that fault."""
        return {pair: events[-1][2] for pair, events in self.events.items() if events[-1][2] is not None}


class JudgedEnvironment(ResourcesServer):
    """reward = 0.5 × (the answer equals the row's `expected`) + 0.5 × (the judge model says [[A=B]])."""

    plan: FaultPlan

    async def seed_session(self, row: dict[str, Any], session: Session) -> dict[str, Any]:
        self.plan.sessions[session.session_id] = (row["_ng_task_index"], row["_ng_rollout_index"])
        return {}

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        pair = self.plan.sessions[session.session_id]
        if self.plan.fault_for(pair, "verify", ("verifier_exception",)):
            raise RuntimeError("injected verifier bug")
        answer = "".join(
            part.get("text", "")
            for item in request.response["output"]
            if item.get("type") == "message"
            for part in item["content"]
        )
        judged = await self.client.post(
            "judge",
            "/v1/chat/completions",
            {"model": "judge", "messages": [{"role": "user", "content": f"JUDGE {answer}"}]},
            session_id=session.session_id,
        )
        verdict = judged["choices"][0]["message"]["content"]
        return VerifyResult(reward=0.5 * (answer == request.model_extra["expected"]) + 0.5 * ("[[A=B]]" in verdict))


def task_rows() -> list[dict[str, Any]]:
    parity = ["even", "odd"]
    return [
        {"responses_create_params": {"input": f"Is {i} {parity[i % 2]}?"}, "expected": "yes" if i % 3 else "no"}
        for i in range(NUM_TASKS)
    ]


def collect_with_faults(tmp_path: Path, plan: FaultPlan, **cfg: Any) -> tuple[Any, Path, FaultProxy]:
    """Serve model, proxy, environment and agent; collect every (task, repeat); returns (summary, output path,
    proxy)."""
    model = load_server_class(REPO / "responses_api_models/scripted_model/app.py")(
        {"rules": MODEL_RULES, "default_reply": "no"}, name="policy_model"
    )
    with serve(model.build_app()) as model_url, FaultProxy(model_url, plan.decide) as proxy:
        environment = JudgedEnvironment(
            name="env",
            client=ServerClient(
                addresses={"judge": proxy.url}, timeouts=AGENT_TIMEOUTS, middlewares=[proxy.middleware()]
            ),
        )
        environment.plan = plan
        agent_class = load_server_class(REPO / "responses_api_agents/simple_agent/app.py")
        with serve(environment.build_app()) as env_url:
            agent = agent_class(
                {
                    "resources_server": {"type": "resources_servers", "name": "env"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "model_timeout_s": 1.0,
                    "max_steps": 2,
                },
                name="agent",
                client=ServerClient(
                    addresses={"policy_model": proxy.url, "env": env_url},
                    timeouts=AGENT_TIMEOUTS,
                    middlewares=[proxy.middleware()],
                ),
            )
            with serve(agent.build_app()) as agent_url:
                (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task_rows()))
                config = CollectConfig(
                    agent_name="agent",
                    input_jsonl_fpath=str(tmp_path / "in.jsonl"),
                    output_jsonl_fpath=str(tmp_path / "out.jsonl"),
                    num_repeats=REPEATS,
                    num_samples_in_parallel=8,
                    max_retries=COLLECTOR_TIMEOUTS.max_retries,
                    progress=False,
                    **cfg,
                )

                async def main():
                    async with ServerClient(addresses={"agent": agent_url}, timeouts=COLLECTOR_TIMEOUTS) as client:
                        return await collect_rollouts(config, client)

                return asyncio.run(main()), tmp_path / "out.jsonl", proxy


@pytest.mark.parametrize("seed", [2, 5])  # plans that refuse some connections; seed 5 draws every fault kind
def test_faults_never_change_a_reward_and_exhausted_faults_are_the_failures(tmp_path, seed):
    pairs = {(t, r) for t in range(NUM_TASKS) for r in range(REPEATS)}
    (tmp_path / "clean").mkdir()
    (tmp_path / "faulty").mkdir()
    _, clean_out, _ = collect_with_faults(tmp_path / "clean", FaultPlan(seed, 0.0))
    clean, _ = assert_exactly_once(clean_out, pairs, allow_failures=False)
    assert len({r["reward"] for r in clean.values()}) > 1  # rewards vary, so a swapped or zeroed one shows

    plan = FaultPlan(seed, FAULT_RATE)
    summary, out, proxy = collect_with_faults(tmp_path / "faulty", plan)
    rows, failures = assert_exactly_once(out, pairs)
    injected = Counter(fault for events in plan.events.values() for _, _, fault in events if fault)
    calls = sum(len(events) for events in plan.events.values())
    exhausted = plan.last_faults()
    assert 0.04 * calls <= injected.total() <= 0.25 * calls, (injected, calls)
    assert injected["refused"] >= 1 and proxy.refused_connects == injected["refused"], (
        injected,
        proxy.refused_connects,
    )  # each one a real ECONNREFUSED
    assert (
        exhausted and len(exhausted) < injected.total()
    )  # some faults exhausted their budget, others were retried away
    assert {pair: row["reward"] for pair, row in rows.items()} == {pair: clean[pair]["reward"] for pair in rows}
    assert set(failures) == set(exhausted)
    assert {pair: f["failure_class"] for pair, f in failures.items()} == {
        pair: FAILURE_CLASS[fault] for pair, fault in exhausted.items()
    }
    assert summary.rollouts_done == len(rows) and summary.rollouts_missing == len(failures)


class BlackHole:
    """A loopback socket that accepts every connection and never answers (the connections are held)."""

    def __init__(self):
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("watchdog_s", [0.5, 0.0])
def test_watchdog_names_the_rollouts_stuck_on_a_black_holed_model(tmp_path, capsys, watchdog_s):
    """Item 3: with the model black-holed nothing completes for longer than +watchdog_s: a stderr line names
    the rollouts in flight, the state file has the stall as it happens, the aggregate metrics list it. 0 disables it."""
    hole = BlackHole()
    timeouts = ClientTimeouts(connect_s=1.0, read_s=3.0, max_retries=0)
    try:
        agent_class = load_server_class(REPO / "responses_api_agents/simple_agent/app.py")
        environment = JudgedEnvironment(name="env")
        environment.plan = FaultPlan(0, 0.0)
        with serve(environment.build_app()) as env_url:
            agent = agent_class(
                {
                    "resources_server": {"type": "resources_servers", "name": "env"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "model_timeout_s": 2.0,
                    "max_steps": 1,
                },
                name="agent",
                client=ServerClient(addresses={"policy_model": hole.url, "env": env_url}, timeouts=timeouts),
            )
            with serve(agent.build_app()) as agent_url:
                (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task_rows()[:3]))
                config = CollectConfig(
                    agent_name="agent",
                    input_jsonl_fpath=str(tmp_path / "in.jsonl"),
                    output_jsonl_fpath=str(tmp_path / "out.jsonl"),
                    max_retries=0,
                    progress=False,
                    watchdog_s=watchdog_s,
                )
                states: list[dict] = []

                async def main():
                    async with ServerClient(
                        addresses={"agent": agent_url},
                        timeouts=ClientTimeouts(connect_s=1.0, read_s=10.0, max_retries=0),
                    ) as client:
                        collecting = asyncio.create_task(collect_rollouts(config, client))
                        while not collecting.done():  # the state file while the collection hangs
                            await asyncio.sleep(0.1)
                            state_path = side_file(tmp_path / "out.jsonl", "state.json")
                            if state_path.exists():
                                states.append(json.loads(state_path.read_text()))
                        return collecting.result()

                summary = asyncio.run(main())
    finally:
        hole.close()
    stderr = capsys.readouterr().err
    metrics = json.loads(side_file(tmp_path / "out.jsonl", "aggregate_metrics.json").read_text())["collection"][
        "watchdog"
    ]
    assert summary.rollouts_missing == 3 and {
        f["failure_class"] for f in read_rows(side_file(tmp_path / "out.jsonl", "failures.jsonl"))
    } == {"timeout"}
    if not watchdog_s:
        assert "watchdog" not in stderr and metrics == {"watchdog_s": 0.0, "stalls": []}
        assert not any("watchdog_stall" in s for s in states)
        return
    assert "watchdog: no rollout completed for" in stderr and "3 in flight: (task 0, repeat 0) via agent" in stderr
    assert metrics["watchdog_s"] == 0.5 and metrics["stalls"]
    stall = metrics["stalls"][0]
    assert stall["in_flight_count"] == 3 and stall["idle_s"] >= 0.5
    assert {(s["task_index"], s["rollout_index"], s["agent"]) for s in stall["in_flight"]} == {
        (0, 0, "agent"),
        (1, 0, "agent"),
        (2, 0, "agent"),
    }
    assert any(s.get("watchdog_stall", {}).get("in_flight_count") == 3 for s in states)  # seen live, before the end
