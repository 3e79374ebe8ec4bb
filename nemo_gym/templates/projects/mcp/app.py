"""Questions about a library catalogue whose tools live on an MCP server: the resources server starts the
project's MCP server (`mcp_server.py`, stdio) with the `mcp` client library, lists its tools as the policy's
tools and forwards every call to it. Reward on the final answer.

One connection, opened at start-up and closed at shutdown, serves everything: at start-up the server lists
the MCP tools and adds a forwarding route for each (the tools are known only then). Arguments are checked
against the tool's own input schema first (422 when they do not fit); a tool error comes back to the policy
as `{"error": ...}`, as the other templates' tool errors do, while an MCP server that does not answer fails the
call (503), so the rollout is recorded as an infrastructure failure, never scored.
"""

from __future__ import annotations

import asyncio
import re
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from jsonschema import Draft202012Validator
from mcp import Client, MCPError, StdioServerParameters, Tool
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import Field

from nemo_gym.env.answers import last_assistant_text, normalize_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.limits import read_json_object
from nemo_gym.serving.server import ServerConfig, Session

PROJECT = Path(__file__).resolve().parent
NUMBER = re.compile(r"\d+")
NO_ANSWER = {CONNECTION_CLOSED, REQUEST_TIMEOUT}  # MCP error codes that mean the server gave no answer


class McpConfig(ServerConfig):
    mcp_server_script: str = Field(
        "mcp_server.py", description="the MCP server to start (stdio), relative to the project folder"
    )
    call_timeout_s: float = Field(10.0, gt=0, description="longest one MCP tool call may take, seconds")
    startup_timeout_s: float = Field(
        60.0, gt=0, description="longest listing the MCP server's tools may take at start-up, seconds"
    )


class LibraryTask(VerifyRequest):
    """A dataset row as /verify receives it: the prompt, the model's `response` and the answer (a number or a name)."""

    expected_answer: str


def mcp_parameters(config: McpConfig) -> StdioServerParameters:
    """How to start the MCP server: this Python on the script, in the project folder."""
    return StdioServerParameters(
        command=sys.executable, args=[str(PROJECT / config.mcp_server_script)], cwd=str(PROJECT)
    )


def function_tool(tool: Tool) -> dict[str, Any]:
    """An MCP tool as a Responses API function tool."""
    parameters = {"type": "object", "properties": {}, **tool.input_schema}
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description or "",
        "parameters": parameters,
        "strict": False,
    }


class LibraryServer(ResourcesServer):
    """A library catalogue through MCP tools. Reward range: [0.0, 1.0], binary."""

    Config = McpConfig
    config: McpConfig
    verify_request_type = LibraryTask

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.mcp: Client | None = None
        self.mcp_tools: dict[str, Tool] = {}
        self.validators: dict[str, Draft202012Validator] = {}

    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)
        self.app = app  # the MCP tools' routes are added in startup(), once the MCP server has listed them

    async def startup(self) -> None:
        # entered here and left in shutdown(), in the same task (the app's lifespan), as the mcp client's task group
        # needs
        self.exit_stack = AsyncExitStack()
        self.mcp = await self.exit_stack.enter_async_context(Client(mcp_parameters(self.config)))
        tools = (await asyncio.wait_for(self.mcp.list_tools(), self.config.startup_timeout_s)).tools
        self.mcp_tools = {tool.name: tool for tool in tools}
        self.validators = {tool.name: Draft202012Validator(tool.input_schema) for tool in tools}
        for tool in tools:  # one forwarding route per MCP tool: the framework's @tool routes need Python signatures
            self.app.add_api_route(
                f"/{tool.name}",
                self._forwarder(tool.name),
                methods=["POST"],
                name=tool.name,
                description=tool.description or "",
            )

    async def shutdown(self) -> None:
        await self.exit_stack.aclose()  # stops the MCP server process

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The MCP server's tools as function tools (known once the server has started)."""
        return [function_tool(tool) for tool in self.mcp_tools.values()]

    def _forwarder(self, name: str) -> Any:
        async def forward(request: Request) -> Any:
            arguments = await read_json_object(request)
            if isinstance(arguments, JSONResponse):
                return arguments
            problems = [
                f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}"
                for e in self.validators[name].iter_errors(arguments)
            ]
            if problems:
                return JSONResponse({"detail": problems}, status_code=422)
            return await self.call_mcp_tool(name, arguments)

        return forward

    async def call_mcp_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """The tool's structured result (else its text); `{"error": ...}` when the tool failed or the MCP server
        answered with an error. Raises HTTPException(503) when the MCP server gives no answer (it died, or took
        longer than `call_timeout_s`), so the rollout fails as an infrastructure failure instead of being scored."""
        assert self.mcp is not None, "the server has not started"
        try:
            result = await self.mcp.call_tool(name, arguments, read_timeout_seconds=self.config.call_timeout_s)
        except MCPError as exc:
            if exc.code in NO_ANSWER:  # the MCP server died or hangs: an infrastructure failure, never a score
                raise HTTPException(503, f"the MCP server did not answer {name}: {exc.message}"[:500]) from exc
            return {"error": exc.message[:500]}  # it answered with an error (e.g. bad arguments): the policy's to read
        text = "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")
        if result.is_error:
            return {"error": text or "the tool failed"}
        if result.structured_content is not None:
            return result.structured_content
        return {"result": text}

    async def verify(self, request: LibraryTask, session: Session) -> VerifyResult:
        """1.0 when the final answer contains `expected_answer`: a number as one of its numbers, a name as a phrase
        (case, punctuation and articles ignored); else 0.0."""
        text = strip_thinking(last_assistant_text(request.response))
        expected = request.expected_answer.strip()
        if expected.isdigit():
            correct = expected in NUMBER.findall(text)
        else:
            correct = f" {normalize_text(expected)} " in f" {normalize_text(text)} "
        return VerifyResult(reward=float(correct))
