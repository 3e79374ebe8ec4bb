"""Where an agent's tool calls go: `ToolRoutes` (`POST /<tool>` of a resources server, in the rollout's session) and
`McpToolRoutes` (`tools/call` over MCP, streamable HTTP: the MCP grant of a NeMo Gym 0.7.0 agent session,
`nemo_gym.env.agent_sessions`). Both answer `call(name, arguments, timeout_s)` inside `connected()`:

    async with routes.connected() as tools:
        result = await tools.call("get_weather", {"city": "Paris"}, timeout_s=60.0)

A call the tool refused comes back as `ServerHTTPError` (HTTP, a 4xx) or `ToolCallFailed` (MCP, an error result):
the agent hands its text to the model. A tool server that cannot be reached is `ServerUnavailableError`: the rollout
fails, it is never scored. `call_function_tool` is one function call of the model as the agents execute it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from nemo_gym.common.errors import ServerHTTPError, ServerUnavailableError
from nemo_gym.env.episode import StopReason
from nemo_gym.serving.client import ServerClient

__all__ = [
    "McpToolRoutes",
    "ToolCallFailed",
    "ToolRoutes",
    "call_function_tool",
    "tool_arguments",
    "tool_output_text",
]


class ToolCallFailed(Exception):
    """A tool call over MCP answered with an error result (`isError`); its text is the result's."""


@dataclass
class ToolRoutes:
    """`POST /<tool>` of `server` in the rollout's session (its id and cookie jar); with `base_url`, of that replica
    only, with `headers` too (an agent session's direct-HTTP grant)."""

    client: ServerClient
    server: str
    session_id: str | None
    cookies: httpx.Cookies
    base_url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[ToolRoutes]:
        yield self  # the client's pooled connections serve it

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The tool's JSON answer (errors as `ServerClient.post`'s)."""
        if self.base_url is None:
            return await self.client.post(
                self.server,
                f"/{name}",
                arguments,
                session_id=self.session_id,
                cookies=self.cookies,
                timeout_s=timeout_s,
            )
        return await self.client.request_json(
            "POST",
            f"{self.base_url.rstrip('/')}/{name}",
            json=arguments,
            headers=self.headers,
            cookies=self.cookies,
            server=self.server,
            timeout_s=timeout_s,
        )


@dataclass
class McpToolRoutes:
    """`tools/call` on the MCP endpoint `url` (streamable HTTP) of `server`, with `headers` on every request (the
    grant's session token, and the run token when the server takes it), through the `mcp` SDK's client; one
    connection per `connected()` block."""

    server: str
    url: str
    headers: dict[str, str]
    session: Any = None  # the SDK's Client, inside `connected()`

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[McpToolRoutes]:
        """These routes with a live MCP client.

        Raises:
            ServerUnavailableError: the MCP endpoint cannot be reached, or refuses the connection.
        """
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with AsyncExitStack() as stack:
            try:
                http = await stack.enter_async_context(httpx2.AsyncClient(headers=self.headers))
                client = await stack.enter_async_context(Client(streamable_http_client(self.url, http_client=http)))
            except Exception as exc:  # the SDK's and its transport's errors, in task groups: no answer to use
                raise ServerUnavailableError(f"MCP {self.url}: {exc}", server=self.server) from exc
            yield replace(self, session=client)

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> str:
        """The text of the tool's result (its text parts, one per line).

        Raises:
            ToolCallFailed: an error result (an unknown tool, arguments it rejects, a failed call).
            ServerUnavailableError: no answer within `timeout_s` seconds, or the connection failed.
        """
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        try:
            result = await asyncio.wait_for(self.session.call_tool(name, arguments), timeout_s)
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):  # no answer: an infrastructure failure
                message = f"MCP {self.url}: tools/call {name}: {exc.message}"
                raise ServerUnavailableError(message, server=self.server) from exc
            raise ToolCallFailed(exc.message) from None
        except Exception as exc:
            raise ServerUnavailableError(f"MCP {self.url}: tools/call {name}: {exc!r}", server=self.server) from exc
        text = "\n".join(part.text for part in result.content if getattr(part, "type", None) == "text")
        if result.is_error:
            raise ToolCallFailed(text)
        return text


def tool_arguments(raw: Any) -> dict[str, Any]:
    """A function call's `arguments` as a dict: the Responses API's JSON text (empty or absent: no arguments), or an
    object that an OpenAI-compatible endpoint sent already parsed.

    Raises:
        ValueError: text that is not JSON (or nested too deep to parse), or JSON or a value that is not an object.
    """
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        raise ValueError(f"arguments must be a JSON object, got {type(raw).__name__}")
    try:
        arguments = json.loads(raw)
    except RecursionError:  # JSON nested thousands deep (as nemo_gym.env.trajectory's parser guards)
        raise ValueError("arguments nested too deep") from None
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object")
    return arguments


def tool_output_text(result: Any) -> str:
    """A tool's JSON answer as the text the model sees: the bytes a FastAPI server sends for it (compact separators,
    non-ASCII kept), so the output is the answer's own text, as NeMo Gym's agents pass it on."""
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


async def call_function_tool(
    tools: ToolRoutes | McpToolRoutes, name: Any, raw_arguments: Any, tool_names: set[str], timeout_s: float
) -> tuple[str, StopReason | None]:
    """Execute one function call of the model (`name`, its `raw_arguments` as `tool_arguments` reads them) through
    `tools`, within `timeout_s` seconds; returns the text the model sees next and, when the call failed, why
    (`parse_error`: arguments that are no JSON object; `tool_error`: a tool not in `tool_names` when it is not empty,
    a call the tool refused). Those failures go back to the model as text.

    Raises:
        ServerError: the tool server answered 5xx, or could not be reached: the rollout fails.
    """
    try:
        arguments = tool_arguments(raw_arguments)
    except ValueError as exc:
        return f"Error: the arguments of {name} are not a valid JSON object: {exc}", StopReason.parse_error
    if tool_names and name not in tool_names:
        return (
            f"Error: there is no tool named {name!r}; available tools: {', '.join(sorted(tool_names))}",
            StopReason.tool_error,
        )
    try:
        result = await tools.call(name, arguments, timeout_s)
    except ServerHTTPError as exc:
        if exc.status_code >= 500:
            raise
        return f"Error: tool {name} rejected the call ({exc.status_code}): {exc.body[:1000]}", StopReason.tool_error
    except ToolCallFailed as exc:
        return f"Error: tool {name} failed: {str(exc)[:1000]}", StopReason.tool_error
    return (result if isinstance(result, str) else tool_output_text(result)), None
