"""A resources server's tools over MCP (the Model Context Protocol, streamable HTTP at `/mcp`): NVIDIA NeMo Gym
0.7.0's `expose_tools_over_mcp: true`, with its wire, so that an MCP agent (0.7.0's haystack_agent, claude_code_agent,
or any MCP client) works a rollout through the same tools, sessions and verify as an agent calling `POST /<tool>`.

- `/seed_session` answers, besides what the server's `seed_session` returns, `mcp: {server_name, url_path: "/mcp",
  transport: "http", headers: {X-NeMo-Gym-Session-Token: <token>}}` (an environment server's typed seed gets the
  same object as `resources_tools`). The agent sends that header on every MCP request.
- `tools/list` lists every tool the server serves over HTTP (`ResourcesServer.add_tool_route`), each with the JSON
  schema of its arguments; `tools/call` runs the tool with the arguments validated as over HTTP (a bad one is an
  error result naming the field) and the session the token names, so `verify` sees what the MCP calls did.
- The token is the rollout's session id, which the session cookie carries already: a call without one, or with one
  that names no live session, is an error result and runs nothing.
- A server may narrow one rollout's tools (0.7.0's `mcp_allowed_tools_for_session(seed_body)`, overridden on the
  server: `ResourcesServer.mcp_allowed_tools_for_session`): with that session's token, `tools/list` lists only those
  and `tools/call` of another is an error result that runs nothing; without a token, `tools/list` lists them all.
- Tool-call names an MCP client namespaces in the trajectory (`mcp__<server>__<tool>`, Claude Code's form) get
  their tool name back before `verify` reads them (0.7.0's `normalize_tool_name`).

Engine: the `mcp` SDK's low-level `Server` behind its `StreamableHTTPSessionManager` (stateless, JSON answers),
entered for the app's life (`ResourcesServer.serving_contexts`). DNS-rebinding protection, a defence for browsers, is
off as in 0.7.0: agents reach the server by whatever host the run gives it; the run token and peer policy
(`nemo_gym.serving.auth`) guard `/mcp` as every other route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

__all__ = ["MCP_METADATA_KEY", "MCP_PATH", "SESSION_TOKEN_HEADER", "mount_mcp", "session_metadata", "unnamespaced"]

MCP_PATH = "/mcp"
MCP_METADATA_KEY = "mcp"  # the key of the seed answer's MCP access (0.7.0's NEMO_GYM_MCP_METADATA_KEY)
SESSION_TOKEN_HEADER = "X-NeMo-Gym-Session-Token"  # 0.7.0's NEMO_GYM_MCP_SESSION_TOKEN_HEADER
# names that would shadow a resources server's own routes if advertised as tools (0.7.0's RESERVED_MCP_TOOL_NAMES)
RESERVED_TOOL_NAMES = frozenset({"verify", "seed_session", "close_session", "aggregate_metrics", "mcp"})


class ToolCallError(Exception):
    """A tool call over MCP that runs nothing (no session, bad arguments): its text is the error result's."""


def session_metadata(server_name: str, session_id: str) -> dict[str, Any]:
    """The MCP access of one rollout, as 0.7.0's `MCPServerMetadata`: `{server_name, url_path, transport, headers}`."""
    return {
        "server_name": server_name,
        "url_path": MCP_PATH,
        "transport": "http",
        "headers": {SESSION_TOKEN_HEADER: session_id},
    }


def unnamespaced(response: Mapping[str, Any], server_name: str) -> dict[str, Any]:
    """`response` (a Responses object) with each `function_call` item named `mcp__<server_name>__<tool>` renamed
    `<tool>` (0.7.0's `normalize_tool_name` with the server's name); other names unchanged. A new dict."""
    prefix = f"mcp__{server_name}__"
    output = response.get("output")
    if not isinstance(output, list):
        return dict(response)
    renamed = [
        {**item, "name": item["name"][len(prefix) :]}
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and isinstance(item.get("name"), str)
        and item["name"].startswith(prefix)
        else item
        for item in output
    ]
    return {**response, "output": renamed}


class _Handlers:
    """The MCP server's `tools/list` and `tools/call` handlers over the tools `tools()` names, less those named as a
    server route (`RESERVED_TOOL_NAMES`)."""

    def __init__(
        self,
        tools: Callable[[str | None], Mapping[str, dict[str, Any]]],
        call: Callable[[str, dict[str, Any], str | None], Awaitable[Any]],
    ):
        self.tools, self.call = tools, call

    def served(self, token: str | None) -> dict[str, dict[str, Any]]:
        return {name: tool for name, tool in self.tools(token).items() if name not in RESERVED_TOOL_NAMES}

    async def list_tools(self, context: Any, params: Any) -> Any:
        import mcp.types as types

        return types.ListToolsResult(
            tools=[
                types.Tool(name=name, description=tool.get("description") or "", input_schema=tool["parameters"])
                for name, tool in self.served(_token(context)).items()
            ]
        )

    async def call_tool(self, context: Any, params: Any) -> Any:
        import mcp.types as types

        def result(text: str, structured: Any = None, is_error: bool = False) -> types.CallToolResult:
            content = [types.TextContent(type="text", text=text)]
            return types.CallToolResult(content=content, structured_content=structured, is_error=is_error)

        if params.name in RESERVED_TOOL_NAMES:
            return result(f"{params.name!r} is a route of the server, not a tool", is_error=True)
        try:
            answer = await self.call(params.name, dict(params.arguments or {}), _token(context))
        except ToolCallError as exc:
            return result(str(exc), is_error=True)
        # a string as it is; anything else as the bytes `POST /<tool>` answers (FastAPI's encoding: compact JSON)
        encoded = jsonable_encoder(answer)
        text = answer if isinstance(answer, str) else JSONResponse(encoded).body.decode()
        return result(text, encoded if isinstance(encoded, dict) else None)


def _token(context: Any) -> str | None:
    """The session token of an MCP request (its header), else None."""
    return context.request.headers.get(SESSION_TOKEN_HEADER) if context.request is not None else None


def mount_mcp(
    app: FastAPI,
    server_name: str,
    tools: Callable[[str | None], Mapping[str, dict[str, Any]]],
    call: Callable[[str, dict[str, Any], str | None], Awaitable[Any]],
) -> AbstractAsyncContextManager:
    """Serve the tools `tools(session token or None)` names (`{name: {"description", "parameters"}}`, parameters a
    JSON schema; asked at each `tools/list`, as a server may add tools once started, and a session may be allowed
    fewer) over MCP at `/mcp` of `app`; one named as a server route
    (`RESERVED_TOOL_NAMES`) is left out. `call(name, arguments, session token or None)` runs one and returns its
    JSON-able result, raising `ToolCallError` for a call that runs nothing, an unknown tool's included (any other
    exception is an error result too, by the SDK); a tool call costs no listing. Returns the context the app must
    be served inside (the SDK's session manager).

    Raises:
        ValueError: `app` serves `/mcp` already.
    """
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.routing import Mount, Route

    if any(getattr(route, "path", None) == MCP_PATH for route in app.router.routes):
        raise ValueError(f"the app serves {MCP_PATH} already")
    handlers = _Handlers(tools, call)
    manager = StreamableHTTPSessionManager(
        app=Server(server_name, on_list_tools=handlers.list_tools, on_call_tool=handlers.call_tool),
        json_response=True,
        stateless=True,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    class Endpoint:  # an ASGI app: starlette's Route takes a plain function for a GET request-response route
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await manager.handle_request(scope, receive, send)

    endpoint = Endpoint()
    # first, before any catch-all route; `/mcp` itself and its subpaths, with no redirect between them
    app.router.routes.insert(0, Route(MCP_PATH, endpoint, include_in_schema=False))
    app.router.routes.insert(1, Mount(MCP_PATH, app=endpoint))
    return manager.run()
