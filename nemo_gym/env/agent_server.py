"""The base of an agent: `AgentServer`, the loop model -> tools -> verify behind `POST /run` (a dataset row -> the
resources server's verify answer: one rollout) and `POST /v1/responses` (the loop only), and NeMo Gym 0.7.0's agent
sessions (`POST /v1/agent_sessions`, `/v1/agent_sessions/close`: an environment server runs the loop with the tools it
grants; `nemo_gym.env.agent_sessions`). How an agent calls the policy model and how an episode ends:
`nemo_gym.env.episode`."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.common.jsonl import TASK_INDEX_KEY
from nemo_gym.env.agent_sessions import (
    AgentCloseSessionRequest,
    AgentSeedSessionRequest,
    AgentSession,
    AgentSessionError,
    AgentSessions,
    session_cookie_id,
    with_session_cookie,
)
from nemo_gym.serving.api_schema import json_body, model_schema
from nemo_gym.serving.client import SESSION_HEADER
from nemo_gym.serving.rollout_prefix import capture_path, capture_rollout_id
from nemo_gym.serving.server import BaseServer, ServerConfig, ServerRef, request_body, validated
from nemo_gym.serving.token_capture import TokenIdCaptureSettings, settings_from_env

__all__ = ["AgentServer", "ToolLoopConfig"]


# The fields of an agent's bodies the framework checks (strictly, so a declared type means that type); every other
# field passes through untouched. Their JSON schemas are what /openapi.json declares.
class AgentResponsesCreate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="AgentResponsesCreate")
    input: str | list[dict[str, Any]] = Field(None, description="a user message, or the input items")  # type: ignore[assignment]
    stream: Literal[False] | None = Field(None, description="agents answer with the whole episode: they do not stream")

    @field_validator("stream", mode="before")
    @classmethod
    def _a_boolean(cls, value: Any) -> Any:
        """false itself: a literal check alone takes 0 and 0.0, which equal False in Python."""
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"stream must be false or absent, got {type(value).__name__}")
        return value


class Row(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="Row")
    responses_create_params: AgentResponsesCreate


class ToolLoopConfig(ServerConfig):
    """The config of an agent whose loop is model call -> tool calls -> ... -> verify (simple_agent,
    openai_client_agent)."""

    resources_server: ServerRef = Field(description="the environment: {type: resources_servers, name: <instance>}")
    model_server: ServerRef = Field(description="the policy: {type: responses_api_models, name: <instance>}")
    max_steps: int = Field(10, ge=1, description="most model calls in one rollout")
    model_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for one model call")
    tool_timeout_s: float = Field(60.0, gt=0, description="seconds to wait for one tool call")
    token_id_capture: bool = Field(
        False,
        description=(
            "with ng_run +token_id_capture.enabled=true: the model calls of this agent's rollouts are recorded with"
            " their token ids, and the collector rebuilds a rollout that lacks them from the records (NeMo Gym"
            " 0.7.0's key)"
        ),
    )


class AgentServer(BaseServer):
    """An agent: `POST /run` (a dataset row -> the verify answer), `POST /v1/responses` (the loop only; with an agent
    session's cookie, in that session) and the agent-session routes (501 unless the agent implements
    `open_agent_session`, `responses_in_session` and `close_agent_session`)."""

    server_type = "responses_api_agents"
    # whether `run` takes `rollout_id` and writes the rollout's `ng_trajectory` capture record (nemo_gym.env.capture)
    captures_trajectory = False

    @cached_property
    def token_capture(self) -> TokenIdCaptureSettings | None:
        """The run's training token capture settings when this agent's rollouts take part (`token_id_capture: true`
        in its config, or the run's `token_id_capture.all_agents`), else None (`nemo_gym.serving.token_capture`)."""
        settings = settings_from_env()
        if settings is None or not (settings.all_agents or getattr(self.config, "token_id_capture", False)):
            return None
        return settings

    def registration_extras(self) -> dict[str, Any]:
        """The run's capture settings when this agent's rollouts are captured: the collector rebuilds them."""
        return {"token_id_capture": self.token_capture.model_dump(mode="json")} if self.token_capture else {}

    def model_path(self, row: dict[str, Any] | None, path: str = "/v1/responses") -> str:
        """The model server's `path` for a call of `row`'s rollout: under the training token capture prefix of its
        rollout id (`capture_rollout_id`) when this agent's rollouts are captured and `row` is a dispatched row;
        else `path` itself.

        Raises:
            DataError: the row's `_ng_rollout_id` is not a rollout id.
        """
        if self.token_capture is None or row is None or TASK_INDEX_KEY not in row:
            return path
        return capture_path(capture_rollout_id(row), path)

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """One rollout of `row`; returns the resources server's verify answer. An agent that `captures_trajectory`
        takes `rollout_id` too (keyword): given, the answer also holds the rollout's `ng_trajectory`."""
        raise NotImplementedError

    async def responses(self, body: dict[str, Any], *, session_id: str | None = None) -> dict[str, Any]:
        """Run the multi-step loop for a Responses create body; returns the `Response` dict."""
        raise NotImplementedError

    async def open_agent_session(self, request: AgentSeedSessionRequest) -> Any:
        """The agent's state for a new NeMo Gym 0.7.0 agent session (its tools as `request.tool_accesses` grants
        them). An agent that implements it (and `responses_in_session`, `close_agent_session`) serves the session
        routes; the others answer them 501.

        Raises:
            AgentSessionError: 422, a grant the agent cannot use (nothing is kept; the seed can be sent again).
        """
        raise NotImplementedError

    async def responses_in_session(self, body: dict[str, Any], session: AgentSession) -> dict[str, Any]:
        """Run the loop for a Responses create body in a live session; returns the `Response` dict."""
        raise NotImplementedError

    async def close_agent_session(self, session: AgentSession) -> dict[str, Any]:
        """Release a session's state; returns the receipt's `agent_observations` and `resources_cookies` (the
        cookies of the granted tool access after the tool calls, for the environment server's `/verify`)."""
        raise NotImplementedError

    @property
    def serves_agent_sessions(self) -> bool:
        return type(self).open_agent_session is not AgentServer.open_agent_session

    def add_routes(self, app: FastAPI) -> None:
        app.add_api_route(
            "/run",
            self._run_route,
            methods=["POST"],
            openapi_extra=json_body(model_schema(Row, self.openapi_components), required=True),
        )
        session_errors = {"409": "the agent session named forbids it (closed, closing, bound to another request)"}
        schema = json_body(
            model_schema(AgentResponsesCreate, self.openapi_components), required=True, errors=session_errors
        )
        app.add_api_route("/v1/responses", self._responses_route, methods=["POST"], openapi_extra=schema)
        # a closed session's receipt is kept this long for a retried close (0.7.0's config key, default and unit)
        self.agent_sessions = AgentSessions(float(getattr(self.config, "session_close_retry_window_seconds", 300.0)))
        app.add_exception_handler(AgentSessionError, _session_error_answer)
        session_errors["501"] = "this agent does not implement agent sessions"
        for path, model, route in (
            ("/v1/agent_sessions", AgentSeedSessionRequest, self._seed_route),
            ("/v1/agent_sessions/close", AgentCloseSessionRequest, self._close_route),
        ):
            schema = json_body(model_schema(model, self.openapi_components), required=True, errors=session_errors)
            app.add_api_route(path, route, methods=["POST"], openapi_extra=schema)

    async def _run_route(self, request: Request) -> Any:
        row = await request_body(request)
        validated(Row, row)  # checked; the row itself goes on, every field kept
        # `/ng-rollout/<id>/run` (NeMo Gym 0.7.0's rollout path prefix, nemo_gym.serving.rollout_prefix) asks for the
        # capture record of rollout <id>; an agent that writes none runs the rollout without one
        rollout_id = request.scope.get("state", {}).get("rollout_id")
        if rollout_id is not None and self.captures_trajectory:
            return await self.run(row, rollout_id=rollout_id)  # type: ignore[call-arg]
        return await self.run(row)

    async def _responses_route(self, request: Request) -> Any:
        body = await request_body(request)
        validated(AgentResponsesCreate, body)
        agent_session_id = session_cookie_id(request)
        if agent_session_id is None:
            return await self.responses(body, session_id=request.headers.get(SESSION_HEADER))
        session = self.agent_sessions.live(agent_session_id)  # a call in a session runs in it or not at all
        session.activations += 1
        return with_session_cookie(await self.responses_in_session(body, session), agent_session_id)

    def _no_sessions(self) -> JSONResponse:
        return JSONResponse(
            {"detail": f"agent {self.name!r} ({type(self).__name__}) does not implement agent sessions"},
            status_code=501,
        )

    async def _seed_route(self, request: Request) -> Any:
        if not self.serves_agent_sessions:
            return self._no_sessions()
        body = validated(AgentSeedSessionRequest, await request_body(request))
        await self.agent_sessions.seed(body, session_cookie_id(request), self.open_agent_session)
        return with_session_cookie({"agent_session_id": body.agent_session_id}, body.agent_session_id)

    async def _close_route(self, request: Request) -> Any:
        if not self.serves_agent_sessions:
            return self._no_sessions()
        body = validated(AgentCloseSessionRequest, await request_body(request))
        receipt = await self.agent_sessions.close(body, session_cookie_id(request), self.close_agent_session)
        # the cookie stays set, so that a stale /v1/responses of this session is refused, never run outside it
        return with_session_cookie(receipt, body.agent_session_id)


async def _session_error_answer(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AgentSessionError)
    return exc.answer()
