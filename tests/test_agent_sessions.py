"""NeMo Gym 0.7.0's agent sessions on our simple_agent (nemo_gym.env.agent_sessions), driven over real HTTP on
loopback as 0.7.0's single_agent_turn environment server drives them: a head server, our example_session_state_mgmt
resources server (a counter kept per session, so a tool call made outside the granted session shows in the reward),
scripted_model and simple_agent, each served by uvicorn. The rules of seeding, calling and closing are 0.7.0's
(its SimpleResponsesAPIAgent); against 0.7.0's own environment server:
tests/test_nemo_gym07.py::test_nemo_gym_07s_environment_server_runs_our_agent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live_servers import serve_registered

from nemo_gym.env.agent_sessions import (
    AGENT_SESSION_COOKIE,
    AgentCloseSessionRequest,
    AgentSeedSessionRequest,
    AgentSessionError,
    AgentSessions,
)
from nemo_gym.serving.client import SESSION_COOKIE

EPISODE = {"rollout_id": "3-1", "attempt": 0}
TASK = {"taskset": "counter", "task_id": "3"}
# the model's turns: add 2 to the counter, then answer (scripted_model plays turn k at the k-th call of the rollout)
SCRIPT = [{"tool_calls": [{"name": "increment_counter", "arguments": {"count": 2}}]}, {"text": "done"}]
TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
    }
]
CREATE_PARAMS = {"input": "add two", "tools": TOOLS, "metadata": {"script": json.dumps(SCRIPT)}}


@pytest.fixture(scope="module")
def run() -> Iterator[dict[str, str]]:
    """The servers' base URLs by name, each registered with the head server."""
    agent_config = {
        "resources_server": {"type": "resources_servers", "name": "counter"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    counter = {"expose_tools_over_mcp": True}
    servers = {
        "counter": ("resources_servers", "resources_servers/example_session_state_mgmt", counter),
        "policy_model": ("responses_api_models", "responses_api_models/scripted_model", {}),
        "agent": ("responses_api_agents", "responses_api_agents/simple_agent", agent_config),
        "gym_agent": ("responses_api_agents", "responses_api_agents/gymnasium_agent", agent_config),
    }
    with serve_registered(servers) as urls:
        yield urls


def seed_resources(client: httpx.Client, urls: dict[str, str], session_id: str) -> dict[str, str]:
    """0.7.0's environment server seeding the resources server's session (counter at 5); returns its cookies."""
    return dict(seed_resources_answer(client, urls, session_id).cookies)


def seed_resources_answer(client: httpx.Client, urls: dict[str, str], session_id: str) -> httpx.Response:
    task_data = {"initial_count": 5, "expected_count": 7}
    body = {"resources_session_id": session_id, "episode_id": EPISODE, "task_id": TASK, "task_data": task_data}
    seeded = client.post(f"{urls['counter']}/seed_session", json=body)
    assert seeded.status_code == 200, seeded.text
    return seeded


def verify_counter(urls: dict[str, str], response: dict[str, Any], cookies: dict[str, str]) -> float:
    """The resources server's reward for `response` in the session `cookies` name (1.0: the counter is at 7)."""
    body = {"initial_count": 5, "expected_count": 7, "responses_create_params": CREATE_PARAMS, "response": response}
    return httpx.post(f"{urls['counter']}/verify", json=body, cookies=cookies, trust_env=False).json()["reward"]


def agent_seed(session_id: str, base_url: str, cookies: dict[str, str], **extra: Any) -> dict[str, Any]:
    grant = {"kind": "direct_http", "name": "counter.direct_http", "required": True, "base_url": base_url}
    return {
        "agent_session_id": session_id,
        "episode_id": EPISODE,
        "task_id": TASK,
        "tool_accesses": [{**grant, "cookies": cookies}],
        **extra,
    }


def test_an_environment_server_runs_the_agent_in_a_session_with_the_tools_it_grants(run):
    """seed the resources session, seed the agent's with a direct_http grant of it, /v1/responses with the agent's
    cookie, close (the grant's cookies back), /verify with them: the tool call changed the granted session's counter
    (5 + 2 = 7, reward 1.0); seeding and closing again are answered as the first time (retries)."""
    with httpx.Client(trust_env=False) as env:
        resources_cookies = seed_resources(env, run, "res-1")
        seed = agent_seed("agent-1", run["counter"], resources_cookies)
        seeded = httpx.post(f"{run['agent']}/v1/agent_sessions", json=seed, trust_env=False)
        assert (seeded.status_code, seeded.json()) == (200, {"agent_session_id": "agent-1"})
        agent_cookies = dict(seeded.cookies)
        assert AGENT_SESSION_COOKIE in agent_cookies
        again = httpx.post(f"{run['agent']}/v1/agent_sessions", json=seed, trust_env=False)
        assert again.status_code == 200  # a retried seed: the session it has
        answered = httpx.post(
            f"{run['agent']}/ng-rollout/3-1/v1/responses", json=CREATE_PARAMS, cookies=agent_cookies, trust_env=False
        )
        assert answered.status_code == 200, answered.text
        response = answered.json()
        kinds = [item["type"] for item in response["output"]]
        assert kinds == ["function_call", "function_call_output", "message"]
        assert json.loads(response["output"][1]["output"]) == {"success": True}
        close = {"agent_session_id": "agent-1", "episode_id": EPISODE}
        closed = httpx.post(
            f"{run['agent']}/v1/agent_sessions/close", json=close, cookies=agent_cookies, trust_env=False
        )
        assert closed.status_code == 200, closed.text
        receipt = closed.json()
        assert receipt["agent_session_id"] == "agent-1" and receipt["agent_observations"] is None
        assert receipt["resources_cookies"][SESSION_COOKIE] == "res-1"
        retried = httpx.post(f"{run['agent']}/v1/agent_sessions/close", json=close, trust_env=False)
        assert retried.json() == receipt  # a retried close: the same receipt
        assert verify_counter(run, response, receipt["resources_cookies"]) == 1.0  # counted in the session: 5 + 2


def test_an_mcp_grant_runs_the_tools_over_mcp_in_the_granted_session(run):
    """single_agent_turn with `resources_tool_transports: [mcp]`: the grant is the resources seed's MCP access (its
    /mcp endpoint, the session token header); the agent's tool calls go over MCP (the mcp SDK's client) in that
    session, so verify, with the environment server's own cookies (the close leaves them: `resources_cookies` None),
    sees them. 0.7.0's own simple_agent refuses an MCP grant."""
    with httpx.Client(trust_env=False) as env:
        seeded = seed_resources_answer(env, run, "res-mcp")
        access = seeded.json()["resources_tools"]
        mcp = {
            "kind": "mcp",
            "name": access["server_name"],
            "required": True,
            "connection": {"url": run["counter"] + access["url_path"], "headers": access["headers"]},
        }
        seed = {"agent_session_id": "agent-mcp", "episode_id": EPISODE, "task_id": TASK, "tool_accesses": [mcp]}
        agent_cookies = dict(httpx.post(f"{run['agent']}/v1/agent_sessions", json=seed, trust_env=False).cookies)
        answered = httpx.post(
            f"{run['agent']}/v1/responses", json=CREATE_PARAMS, cookies=agent_cookies, trust_env=False
        )
        assert answered.status_code == 200, answered.text
        response = answered.json()
        assert json.loads(response["output"][1]["output"]) == {"success": True}
        close = {"agent_session_id": "agent-mcp", "episode_id": EPISODE}
        receipt = httpx.post(f"{run['agent']}/v1/agent_sessions/close", json=close, trust_env=False).json()
        assert receipt["resources_cookies"] is None
        assert verify_counter(run, response, dict(seeded.cookies)) == 1.0


def test_session_calls_that_0_7_0_refuses_are_refused(run):
    """409: a seed of a bound id with another body, of a closed id, of an id closed before its seed, a call or close
    naming another session than the cookie, a close naming another episode, a /v1/responses in a session that is
    closed or was never seeded (never run outside it). 422: grants simple_agent cannot use (two MCP servers, a
    sandbox, two direct_http grants, a base_url or an MCP endpoint that is not a server of this run); nothing is
    kept, so the seed can be sent again. 501: an agent that does not implement sessions."""
    agent = run["agent"]
    post = lambda path, body, **kw: httpx.post(f"{agent}{path}", json=body, trust_env=False, **kw)  # noqa: E731
    seed = agent_seed("agent-2", run["counter"], {})
    assert post("/v1/agent_sessions", seed).status_code == 200
    other = {**seed, "task_id": {"taskset": "counter", "task_id": "4"}}
    assert post("/v1/agent_sessions", other).status_code == 409
    other_cookie = {AGENT_SESSION_COOKIE: "agent-9"}
    assert post("/v1/agent_sessions", seed, cookies=other_cookie).status_code == 409
    wrong_episode = {"agent_session_id": "agent-2", "episode_id": {"rollout_id": "3-1", "attempt": 1}}
    assert post("/v1/agent_sessions/close", wrong_episode).status_code == 409
    assert post("/v1/agent_sessions/close", {"agent_session_id": "agent-2", "episode_id": EPISODE}).status_code == 200
    closed = post("/v1/agent_sessions", seed)
    assert closed.status_code == 409 and "already closed" in closed.text
    stale = post("/v1/responses", CREATE_PARAMS, cookies={AGENT_SESSION_COOKIE: "agent-2"})
    assert stale.status_code == 409  # a call of a closed session is not run as a plain /v1/responses
    assert post("/v1/responses", CREATE_PARAMS, cookies={AGENT_SESSION_COOKIE: "never"}).status_code == 409
    # a close that came first (its seed was lost or late) keeps the seed out
    early = post("/v1/agent_sessions/close", {"agent_session_id": "agent-3", "episode_id": EPISODE})
    assert early.json() == {"agent_session_id": "agent-3", "agent_observations": None, "resources_cookies": None}
    assert post("/v1/agent_sessions", agent_seed("agent-3", run["counter"], {})).status_code == 409

    mcp = {"kind": "mcp", "name": "m", "required": True, "connection": {"url": f"{run['counter']}/mcp"}}
    elsewhere = {**mcp, "connection": {"url": "http://127.0.0.1:9/mcp"}}
    refused = {
        "two mcp": {**agent_seed("agent-4", run["counter"], {}), "tool_accesses": [mcp, {**mcp, "name": "n"}]},
        "mcp not of this run": {**agent_seed("agent-4", run["counter"], {}), "tool_accesses": [elsewhere]},
        "sandbox": agent_seed("agent-4", run["counter"], {}, sandbox_access={"kind": "x"}),
        "two grants": {
            **agent_seed("agent-4", run["counter"], {}),
            "tool_accesses": [
                {"kind": "direct_http", "name": name, "required": True, "base_url": run["counter"]}
                for name in ("a", "b")
            ],
        },
        "not of this run": agent_seed("agent-4", "http://127.0.0.1:9/", {}),
    }
    for label, body in refused.items():
        answer = post("/v1/agent_sessions", body)
        assert answer.status_code == 422, (label, answer.text)
    assert "is not a server of this run" in answer.text
    assert post("/v1/agent_sessions", agent_seed("agent-4", run["counter"], {})).status_code == 200  # nothing kept
    duplicate = {**seed, "tool_accesses": [*seed["tool_accesses"], *seed["tool_accesses"]]}
    assert post("/v1/agent_sessions", duplicate).status_code == 422  # grant names are unique
    no_sessions = httpx.post(f"{run['gym_agent']}/v1/agent_sessions", json=seed, trust_env=False)
    assert no_sessions.status_code == 501 and "does not implement agent sessions" in no_sessions.text


def test_a_session_without_tool_access_fails_a_tool_call_and_plain_calls_run_as_before(run):
    """0.7.0's single_agent_turn with no transports grants no tools: a tool call of the model is refused (422),
    never sent to the agent's configured resources server, whose session the episode does not own. Without the
    cookie, /v1/responses runs the loop on the configured resources server, as before."""
    agent = run["agent"]
    seed = {"agent_session_id": "agent-5", "episode_id": EPISODE, "task_id": TASK}
    seeded = httpx.post(f"{agent}/v1/agent_sessions", json=seed, trust_env=False)
    answered = httpx.post(f"{agent}/v1/responses", json=CREATE_PARAMS, cookies=dict(seeded.cookies), trust_env=False)
    assert answered.status_code == 422 and "no tool access" in answered.text
    plain = httpx.post(f"{agent}/v1/responses", json=CREATE_PARAMS, trust_env=False, timeout=30)
    assert plain.status_code == 200 and plain.json()["output"][-1]["type"] == "message"


def test_a_close_receipt_is_kept_for_the_retry_window_only():
    """After `retry_window_s` the receipt is dropped: a close of that id is answered as for an id never seeded, and
    the id may be seeded anew (0.7.0's session_close_retry_window_seconds)."""

    async def scenario() -> list[Any]:
        sessions = AgentSessions(retry_window_s=0.05)
        seed = AgentSeedSessionRequest.model_validate({"agent_session_id": "s", "episode_id": EPISODE, "task_id": TASK})
        close = AgentCloseSessionRequest.model_validate({"agent_session_id": "s", "episode_id": EPISODE})

        async def opened(request: AgentSeedSessionRequest) -> str:
            return "state"

        async def released(session: Any) -> dict[str, Any]:
            return {"resources_cookies": {"c": session.state}}

        await sessions.seed(seed, None, opened)
        first = await sessions.close(close, None, released)
        with pytest.raises(AgentSessionError) as refused:
            await sessions.seed(seed, None, opened)
        time.sleep(0.1)
        await sessions.seed(seed, None, opened)  # the receipt expired: a new session
        return [first, refused.value.status, sessions.live("s").state]

    first, status, state = asyncio.run(scenario())
    assert first == {"agent_session_id": "s", "agent_observations": None, "resources_cookies": {"c": "state"}}
    assert (status, state) == (409, "state")
