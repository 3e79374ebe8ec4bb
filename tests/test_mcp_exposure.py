"""A resources server's tools over MCP (`expose_tools_over_mcp: true`, nemo_gym.env.mcp_exposure), through the `mcp`
SDK's own client over real HTTP on loopback: the seed answer's MCP access, tools/list, tools/call in the rollout's
session (seen by verify), the refusals, and the names an MCP client namespaces. Against NeMo Gym 0.7.0's own MCP
agent: tests/test_nemo_gym07.py::test_nemo_gym_07s_mcp_agent_on_our_resources_server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import httpx2
import pytest
from live_servers import serve
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from nemo_gym.env import ResourcesServer, Session, VerifyRequest, VerifyResult, tool
from nemo_gym.env.mcp_exposure import SESSION_TOKEN_HEADER, unnamespaced
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.client import SESSION_COOKIE


class Counter(ResourcesServer):
    """A tool that counts its calls in the rollout's session; the reward is the count seen by verify."""

    @tool
    async def bump(self, by: int, session: Session) -> dict[str, int]:
        """Add `by` to the rollout's counter."""
        session["count"] = session.get("count", 0) + by
        return {"count": session["count"]}

    @tool
    def echo(self, text: str) -> str:
        """Echo the text (a plain def tool)."""
        return text

    async def seed_session(self, row: dict[str, Any], session: Session) -> dict[str, Any]:
        session["count"] = int(row.get("start", 0))
        return {"started_at": session["count"]}

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        named = len(Trajectory.of(request.response).calls_named("bump"))
        return VerifyResult(reward=1.0 if session.get("count") else 0.0, count=session.get("count"), named=named)


@pytest.fixture
def exposed():
    with serve(Counter({"expose_tools_over_mcp": True}, name="counter").build_app()) as url:
        yield url


async def _mcp(url: str, token: str | None, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[Any]]:
    """tools/list, then each call, through the mcp SDK's client with the session token header."""
    headers = {SESSION_TOKEN_HEADER: token} if token else {}
    async with httpx2.AsyncClient(headers=headers) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            results = [await client.call_tool(name, arguments) for name, arguments in calls]
    return names, results


def test_tools_called_over_mcp_work_in_the_rollouts_session_and_verify_sees_them(exposed):
    seeded = httpx.post(f"{exposed}/seed_session", json={"start": 2}, timeout=10)
    access = seeded.json()["mcp"]
    assert seeded.json()["started_at"] == 2
    assert access["server_name"] == "counter" and access["url_path"] == "/mcp" and access["transport"] == "http"
    token = access["headers"][SESSION_TOKEN_HEADER]
    assert token == seeded.cookies.get(SESSION_COOKIE)  # the session the cookie names

    names, results = asyncio.run(_mcp(exposed, token, [("bump", {"by": 3}), ("echo", {"text": "hi"})]))
    assert sorted(names) == ["bump", "echo"]
    assert not results[0].is_error and results[0].structured_content == {"count": 5}
    assert results[0].content[0].text == '{"count":5}'  # the bytes POST /bump answers
    assert results[1].content[0].text == "hi"

    # verify in the same session sees the MCP calls; a name the MCP client namespaced counts as the tool's
    response = {"output": [{"type": "function_call", "name": "mcp__counter__bump", "arguments": "{}", "call_id": "c"}]}
    body = {"responses_create_params": {"input": []}, "response": response}
    verified = httpx.post(f"{exposed}/verify", json=body, cookies=seeded.cookies, timeout=10).json()
    assert verified["count"] == 5 and verified["named"] == 1 and verified["reward"] == 1.0
    assert verified["response"]["output"][0]["name"] == "mcp__counter__bump"  # the row keeps what the agent wrote


def test_a_call_without_a_live_session_or_with_bad_arguments_runs_nothing(exposed):
    seeded = httpx.post(f"{exposed}/seed_session", json={}, timeout=10)
    token = seeded.json()["mcp"]["headers"][SESSION_TOKEN_HEADER]
    _, (no_token,) = asyncio.run(_mcp(exposed, None, [("bump", {"by": 1})]))
    _, (forged,) = asyncio.run(_mcp(exposed, "not-a-session", [("bump", {"by": 1})]))
    _, (bad, unknown, reserved) = asyncio.run(
        _mcp(exposed, token, [("bump", {"by": "many"}), ("nope", {}), ("verify", {})])
    )
    assert no_token.is_error and SESSION_TOKEN_HEADER in no_token.content[0].text
    assert forged.is_error and "no live session" in forged.content[0].text
    assert bad.is_error and "by" in bad.content[0].text
    assert unknown.is_error and "unknown tool 'nope'" in unknown.content[0].text
    assert reserved.is_error  # a server route is never a tool
    body = {"responses_create_params": {"input": []}, "response": {"output": []}}
    assert httpx.post(f"{exposed}/verify", json=body, cookies=seeded.cookies, timeout=10).json()["count"] == 0


def test_environment_server_seed_gets_the_access_as_resources_tools(exposed):
    seed = {"resources_session_id": "r-1", "episode_id": "e", "task_id": 0, "task_data": {"start": 1}}
    answer = httpx.post(f"{exposed}/seed_session", json=seed, timeout=10).json()
    assert answer["resources_session_id"] == "r-1"
    assert answer["resources_tools"]["headers"] == {SESSION_TOKEN_HEADER: "r-1"}
    _, (bumped,) = asyncio.run(_mcp(exposed, "r-1", [("bump", {"by": 1})]))
    assert bumped.structured_content == {"count": 2}
    httpx.post(f"{exposed}/close_session", json={"resources_session_id": "r-1", "episode_id": "e"}, timeout=10)
    _, (closed,) = asyncio.run(_mcp(exposed, "r-1", [("bump", {"by": 1})]))
    assert closed.is_error


def test_without_the_flag_there_is_no_mcp_route_and_no_access_in_the_seed_answer():
    with serve(Counter({}, name="counter").build_app()) as url:
        assert "mcp" not in httpx.post(f"{url}/seed_session", json={}, timeout=10).json()
        assert httpx.post(f"{url}/mcp", json={}, timeout=10).status_code in (404, 405)
        assert "/mcp" not in httpx.get(f"{url}/openapi.json", timeout=10).json()["paths"]


def test_unnamespaced_strips_only_this_servers_prefix():
    output = [
        {"type": "function_call", "name": "mcp__counter__bump"},
        {"type": "function_call", "name": "mcp__other__bump"},
        {"type": "function_call", "name": "bump"},
        {"type": "message", "name": "mcp__counter__x"},
    ]
    names = [item["name"] for item in unnamespaced({"output": output}, "counter")["output"]]
    assert names == ["bump", "mcp__other__bump", "bump", "mcp__counter__x"]


class NarrowCounter(Counter):
    """Counter whose rows may name the tools their rollout gets (`allowed_tools`), as 0.7.0's tavily_search does."""

    def mcp_allowed_tools_for_session(self, row: dict[str, Any]) -> list[str] | None:
        return row.get("allowed_tools")


def test_a_server_narrows_a_rollouts_tools_over_mcp():
    """0.7.0's `mcp_allowed_tools_for_session`: a rollout seeded with `allowed_tools: [echo]` lists only echo and
    cannot call bump (an error result, its counter unchanged); another rollout, and a listing without a token, see
    every tool; an environment server's seed is narrowed by its task_data; the narrowing ends with the session."""
    server = NarrowCounter({"expose_tools_over_mcp": True}, name="counter")
    with serve(server.build_app()) as url:
        narrow = httpx.post(f"{url}/seed_session", json={"allowed_tools": ["echo"]}, timeout=10)
        token = narrow.json()["mcp"]["headers"][SESSION_TOKEN_HEADER]
        names, (refused, echoed) = asyncio.run(_mcp(url, token, [("bump", {"by": 1}), ("echo", {"text": "hi"})]))
        assert names == ["echo"] and echoed.content[0].text == "hi"
        assert refused.is_error and "not allowed in this rollout" in refused.content[0].text
        body = {"responses_create_params": {"input": []}, "response": {"output": []}}
        assert httpx.post(f"{url}/verify", json=body, cookies=narrow.cookies, timeout=10).json()["count"] == 0
        wide = httpx.post(f"{url}/seed_session", json={}, timeout=10).json()["mcp"]["headers"][SESSION_TOKEN_HEADER]
        assert sorted(asyncio.run(_mcp(url, wide, []))[0]) == ["bump", "echo"]
        assert sorted(asyncio.run(_mcp(url, None, []))[0]) == ["bump", "echo"]
        seed = {
            "resources_session_id": "r-2",
            "episode_id": "e",
            "task_id": 0,
            "task_data": {"allowed_tools": ["bump"]},
        }
        httpx.post(f"{url}/seed_session", json=seed, timeout=10)
        assert asyncio.run(_mcp(url, "r-2", []))[0] == ["bump"]
        httpx.post(f"{url}/close_session", json={"resources_session_id": "r-2", "episode_id": "e"}, timeout=10)
        assert "r-2" not in server._mcp_allowed  # closed: its narrowing is gone with it
