"""simple_agent: the multi-step loop model → tool calls → tool outputs → ... → verify.

Each `/run` is one rollout: seed the resources server's session, call the policy model through its
Responses API, execute every `function_call` against the resources server (same session), feed the outputs
back, until the model answers without a tool call, hits `max_steps`, or runs out of output tokens; then
`/verify` the whole trajectory. Tool-argument JSON errors and tool errors go back to the model as text.
A failed `/verify` (e.g. a reward function that raised) fails the rollout with the verifier's typed error and the
trajectory it failed on (`error.response`), which the collector keeps in the failures file.

It also serves NeMo Gym 0.7.0's agent sessions (`nemo_gym.env.agent_sessions`), so that 0.7.0's `single_agent_turn`
environment server runs it: the session's `/v1/responses` runs the same loop, its tool calls through the direct-HTTP
tool access the environment server grants (a replica of one of the run's servers, with the cookies and headers of the
grant), else through its MCP grant (`tools/call`: `nemo_gym.env.tool_routes.McpToolRoutes`; 0.7.0's own simple_agent
refuses one); the close answers the grant's cookies after the calls. At most one grant of each kind, no sandbox;
`execute_tools: false` returns the model's tool calls unresolved (sessions only).

A `/run` at `/ng-rollout/<rollout id>/run` (what `ng_collect_rollouts +observability_enabled=true` calls) also answers
the rollout's `ng_trajectory`, NeMo Gym 0.7.0's capture record of its model calls, turns and tool calls
(`nemo_gym.env.capture`).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from nemo_gym.common.errors import ServerError
from nemo_gym.env.agent_server import AgentServer, ToolLoopConfig
from nemo_gym.env.agent_sessions import (
    AgentSeedSessionRequest,
    AgentSession,
    AgentSessionError,
    DirectHTTPToolAccess,
    MCPToolAccess,
)
from nemo_gym.env.capture import TrajectoryCapture, clock
from nemo_gym.env.episode import EndedEpisode, ModelCalls, StopReason, failed_run_answer, initial_input, run_answer
from nemo_gym.env.tool_routes import McpToolRoutes, ToolRoutes, call_function_tool
from nemo_gym.serving.api_schema import json_body
from nemo_gym.serving.limits import read_json_object
from nemo_gym.serving.server import forward_optional_route


class SimpleAgentConfig(ToolLoopConfig):
    execute_tools: bool = Field(
        True,
        description="false: the model's tool calls are returned unresolved (NeMo Gym 0.7.0 agent sessions only)",
    )
    session_close_retry_window_seconds: float = Field(
        300.0, gt=0, description="an agent session's close answer is kept this long for a retried close, seconds"
    )


# a failed tool call's `error_type` in the capture record, by how it failed
TOOL_ERROR_TYPES = {StopReason.parse_error: "invalid_arguments", StopReason.tool_error: "tool_error"}


class SimpleAgent(AgentServer):
    Config = SimpleAgentConfig
    config: SimpleAgentConfig
    captures_trajectory = True

    async def run(self, row: dict[str, Any], *, rollout_id: str | None = None) -> dict[str, Any] | JSONResponse:
        """The verify answer of one rollout (with its `ng_trajectory` when `rollout_id` is given), or, when /verify
        failed, its typed failure answer with the trajectory (`failed_run_answer`; with the record when captured, as
        when a model or tool call failed the captured episode)."""
        if not self.config.execute_tools:
            return JSONResponse(
                {"detail": "execute_tools: false is for NeMo Gym 0.7.0 agent sessions only; /run executes the tools"},
                status_code=422,
            )
        session_id = uuid.uuid4().hex
        cookies = httpx.Cookies()
        resources = self.config.resources_server.name
        await self.client.post(resources, "/seed_session", row, session_id=session_id, cookies=cookies)
        verified = None
        capture = None
        if rollout_id is not None:
            capture = TrajectoryCapture.of_row(self.config.model_server.name, row, rollout_id)
        try:
            tools = ToolRoutes(self.client, resources, session_id, cookies)
            try:
                ended = EndedEpisode(
                    row,
                    *await self.loop(row["responses_create_params"], session_id, tools, capture, self.model_path(row)),
                )
            except ServerError as exc:  # with the record of the calls made so far when captured
                return failed_run_answer(exc, capture)
            try:  # the verify answer ends the session: one call less per rollout than a separate /close_session
                verified = await self.client.post(
                    resources,
                    "/verify?close_session=true",
                    {**row, "response": ended.response},
                    session_id=session_id,
                    cookies=cookies,
                )
            except ServerError as exc:  # the trajectory it failed on goes with the failure, to debug the verifier
                return failed_run_answer(exc, capture, ended)
        finally:
            if verified is None:  # the rollout failed before its verify answer: the session is still open
                try:
                    await self.client.post(
                        resources, "/close_session", {}, session_id=session_id, cookies=cookies, timeout_s=10
                    )
                except Exception:  # closing is best effort; NeMo Gym servers have no such route
                    pass
        # a tool error or parse error still set here means the steps ran out after it: incomplete, as max_steps
        return run_answer(verified, ended, capture)

    async def responses(self, body: dict[str, Any], *, session_id: str | None = None) -> dict[str, Any]:
        if not self.config.execute_tools:
            raise AgentSessionError(422, "execute_tools: false is for NeMo Gym 0.7.0 agent sessions only: seed one")
        session_id = session_id or uuid.uuid4().hex
        tools = ToolRoutes(self.client, self.config.resources_server.name, session_id, httpx.Cookies())
        response, _ = await self.loop(body, session_id, tools)
        return response

    async def open_agent_session(self, request: AgentSeedSessionRequest) -> ToolRoutes | McpToolRoutes | None:
        """The session's tool routes: its direct-HTTP grant, else its MCP grant; either must reach one of the run's
        servers (the run token and the grant's cookies and headers go nowhere else). None without one (the model's
        tool calls then fail the episode, as in 0.7.0)."""
        if request.sandbox_access is not None:
            raise AgentSessionError(422, "simple_agent has no sandbox: sandbox_access is not supported")
        direct = [a for a in request.tool_accesses if isinstance(a, DirectHTTPToolAccess)]
        mcp = [a for a in request.tool_accesses if isinstance(a, MCPToolAccess)]
        if len(direct) > 1 or len(mcp) > 1:
            raise AgentSessionError(422, "simple_agent takes at most one direct_http and one mcp tool access")
        if not direct and not mcp:
            return None
        if not self.client.head_url:
            raise AgentSessionError(422, "this agent knows no run (no head server URL): it takes no tool access")
        grant = direct[0] if direct else mcp[0]
        url = str(grant.base_url if isinstance(grant, DirectHTTPToolAccess) else grant.connection.url)
        origin = urlsplit(url)  # an MCP endpoint is a path of its server: the server is its scheme, host and port
        found = await self.client.server_at(url if direct else f"{origin.scheme}://{origin.netloc}")
        if found is None:
            raise AgentSessionError(422, f"tool access {grant.name!r}: {url} is not a server of this run")
        server, token_headers = found
        if isinstance(grant, MCPToolAccess):
            return McpToolRoutes(server, url, {**grant.connection.headers, **token_headers})
        cookies = httpx.Cookies()
        for name, value in grant.cookies.items():  # as the answers' cookies are kept: for the grant's host
            cookies.set(name, value, domain=grant.base_url.host or "")
        return ToolRoutes(self.client, server, None, cookies, url, dict(grant.headers))

    async def responses_in_session(self, body: dict[str, Any], session: AgentSession) -> dict[str, Any]:
        session_id = f"{session.request.agent_session_id}-{session.activations}"
        if session.state is None:
            return (await self.loop(body, session_id, None))[0]
        async with session.state.connected() as tools:
            return (await self.loop(body, session_id, tools))[0]

    async def close_agent_session(self, session: AgentSession) -> dict[str, Any]:
        """The grant's cookies after the calls; None (the environment server keeps its own) without a cookie jar."""
        tools = session.state
        return {"resources_cookies": dict(tools.cookies.items()) if isinstance(tools, ToolRoutes) else None}

    async def loop(
        self,
        params: dict[str, Any],
        session_id: str,
        tools: ToolRoutes | McpToolRoutes | None,
        capture: TrajectoryCapture | None = None,
        model_path: str = "/v1/responses",
    ) -> tuple[dict[str, Any], StopReason]:
        """Run the episode, its tool calls through `tools` (None: an agent session granted none, so a tool call
        fails the episode), each model and tool call recorded in `capture` when given; returns the final
        `Response` (output = whole trajectory) and how it ended.

        Raises:
            AgentSessionError: the model called a tool and `tools` is None (422).
        """
        initial = initial_input(params)
        tool_names = {t.get("name") for t in params.get("tools") or [] if t.get("type") == "function"}
        trajectory: list[dict[str, Any]] = []
        model = ModelCalls(
            self.client, self.config.model_server.name, session_id, self.config.model_timeout_s, capture, model_path
        )
        stop_reason = StopReason.max_steps
        for _ in range(self.config.max_steps):
            # a context overflow on the task's own prompt is a failure, later it ends the episode
            output, stop = await model.step(params, [*initial, *trajectory], overflow_ends=bool(trajectory))
            trajectory.extend(output)
            if stop:
                stop_reason = stop
                break
            calls = [item for item in output if item.get("type") == "function_call"]
            if not calls or not self.config.execute_tools:
                stop_reason = StopReason.completed
                break
            if tools is None:
                raise AgentSessionError(422, "the model called a tool and this agent session has no tool access")
            for call in calls:
                started_at, started = clock()
                text, problem = await call_function_tool(
                    tools, call.get("name"), call.get("arguments"), tool_names, self.config.tool_timeout_s
                )
                if capture is not None:
                    failed = TOOL_ERROR_TYPES.get(problem) if problem else None
                    capture.tool_call(
                        call.get("call_id"), call.get("name"), started_at, clock()[1] - started, text, failed
                    )
                trajectory.append({"type": "function_call_output", "call_id": call.get("call_id"), "output": text})
                stop_reason = problem or StopReason.max_steps
        return model.final_response(trajectory), stop_reason

    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)

        @app.get("/row_schema")
        async def row_schema() -> Any:
            return await forward_optional_route(self.client, self.config.resources_server.name, "/row_schema")

        @app.post(
            "/aggregate_metrics",
            openapi_extra=json_body(
                {
                    "type": "object",
                    "required": ["verify_responses"],
                    "properties": {"verify_responses": {"type": "array"}},
                },
                required=True,
            ),
        )
        async def aggregate_metrics(request: Request) -> Any:
            body = await read_json_object(request)  # 4xx, not 500, for a body that is not a JSON object
            if isinstance(body, JSONResponse):
                return body
            if not isinstance(body.get("verify_responses"), list):
                return JSONResponse({"detail": 'body must be {"verify_responses": [...]}'}, status_code=422)
            metrics = await self.client.post(self.config.resources_server.name, "/aggregate_metrics", body)
            reasons = Counter(
                r.get("stop_reason")
                for r in body.get("verify_responses", [])
                if isinstance(r, dict) and r.get("stop_reason")
            )
            return {**(metrics or {}), "stop_reasons": dict(reasons)}
