"""Where an agent's tool calls go: `ToolRoutes` (`POST /<tool>` of a resources server, in the rollout's session) and
`McpToolRoutes` (`tools/call` over MCP, streamable HTTP: the MCP grant of a NeMo Gym 0.7.0 agent session,
`nemo_gym.env.agent_sessions`). Both answer `call(name, arguments, timeout_s)` inside `connected()`:

    async with routes.connected() as tools:
        result = await tools.call("get_weather", {"city": "Paris"}, timeout_s=60.0)

A call the tool refused comes back as `ServerHTTPError` (HTTP, a 4xx) or `ToolCallFailed` (MCP, an error result):
the agent hands its text to the model. A tool server that cannot be reached is `ServerUnavailableError`: the rollout
fails, it is never scored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from nemo_gym.common.errors import ServerUnavailableError
from nemo_gym.serving.client import ServerClient

__all__ = ["McpToolRoutes", "ToolCallFailed", "ToolRoutes"]


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
