"""The base of an agent: `AgentServer`, the loop model -> tools -> verify behind `POST /run` (a dataset row -> the
resources server's verify answer: one rollout) and `POST /v1/responses` (the loop only). How an agent calls the
policy model and how an episode ends: `nemo_gym.env.episode`."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.serving.api_schema import json_body, model_schema
from nemo_gym.serving.client import SESSION_HEADER
from nemo_gym.serving.server import BaseServer, request_body, validated

__all__ = ["AgentServer"]


# The fields of an agent's bodies the framework checks (strictly, so a declared type means that type); every other
# field passes through untouched. Their JSON schemas are what /openapi.json declares.
class AgentResponsesCreate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="AgentResponsesCreate")
    input: str | list[dict[str, Any]] = Field(None, description="a user message, or the input items")  # type: ignore[assignment]
    stream: Literal[False] | None = Field(None, description="agents answer with the whole episode: they do not stream")


class Row(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="Row")
    responses_create_params: AgentResponsesCreate


class AgentServer(BaseServer):
    """An agent: `POST /run` (a dataset row -> the verify answer) and `POST /v1/responses` (the loop only)."""

    server_type = "responses_api_agents"

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """One rollout of `row`; returns the resources server's verify answer."""
        raise NotImplementedError

    async def responses(self, body: dict[str, Any], *, session_id: str | None = None) -> dict[str, Any]:
        """Run the multi-step loop for a Responses create body; returns the `Response` dict."""
        raise NotImplementedError

    def add_routes(self, app: FastAPI) -> None:
        app.add_api_route(
            "/run",
            self._run_route,
            methods=["POST"],
            openapi_extra=json_body(model_schema(Row, self.openapi_components), required=True),
        )
        schema = json_body(model_schema(AgentResponsesCreate, self.openapi_components), required=True)
        app.add_api_route("/v1/responses", self._responses_route, methods=["POST"], openapi_extra=schema)

    async def _run_route(self, request: Request) -> Any:
        row = await request_body(request)
        validated(Row, row)  # checked; the row itself goes on, every field kept
        return await self.run(row)

    async def _responses_route(self, request: Request) -> Any:
        body = await request_body(request)
        validated(AgentResponsesCreate, body)
        return await self.responses(body, session_id=request.headers.get(SESSION_HEADER))
