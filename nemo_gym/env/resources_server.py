"""The base of an environment: `ResourcesServer`, with its tools (methods marked `@tool`), `seed_session` and `verify`,
and the typed bodies of `/seed_session` and `/verify`.

    class MyServer(ResourcesServer):
        @tool
        async def get_weather(self, city: str) -> dict:
            "Weather in a city."
            return {"city": city, "weather": "cold"}

        async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
            return VerifyResult(reward=float(bool(Trajectory.of(request.response).calls_named("get_weather"))))

Routes (the framework's; a server never registers one): `POST /<tool>`, `GET /tools`, `GET /row_schema`,
`POST /seed_session` (a dataset row, or NeMo Gym 0.7.0's typed body from an environment server:
`EnvironmentSeedRequest`), `POST /verify` (`?close_session=true`: the answer also ends the session, as
`POST /close_session` does), `POST /aggregate_metrics`, and `BaseServer`'s `/health` and `/close_session` (with 0.7.0's
`{resources_session_id, episode_id}` body, that session). With `expose_tools_over_mcp: true` in its config, the tools
over MCP as well, at `/mcp`, in the rollout's session (`nemo_gym.env.mcp_exposure`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.env.mcp_exposure import (
    MCP_METADATA_KEY,
    SESSION_TOKEN_HEADER,
    ToolCallError,
    mount_mcp,
    session_metadata,
    unnamespaced,
)
from nemo_gym.env.metrics import nemo_gym_aggregate_metrics
from nemo_gym.env.tools import arguments_model, function_tool_schema, tool_methods
from nemo_gym.serving.api_schema import AGGREGATE_BODY, json_body, model_schema, row_schema
from nemo_gym.serving.client import SESSION_COOKIE
from nemo_gym.serving.server import BaseServer, RejectedRequest, Session, request_body, validated

__all__ = ["EnvironmentSeedRequest", "SeedRequest", "VerifyRequest", "VerifyResult", "ResourcesServer"]

# one tool as the routes call it: (arguments, the rollout's session) -> its result (`ResourcesServer._tool_call`)
ToolCall = Callable[[dict[str, Any], "Session | None"], Awaitable[Any]]


class SeedRequest(BaseModel):
    """The `/seed_session` body: the dataset row (every field kept). A server that reads task fields when it seeds
    declares them on a subclass, its `seed_request_type`: the row is validated (422) and `seed_session` gets it typed.
    """

    model_config = ConfigDict(extra="allow")


class EnvironmentSeedRequest(BaseModel):
    """NeMo Gym 0.7.0's `/seed_session` body from an environment server (its `ResourcesSeedSessionRequest`): the
    session id the caller assigns, the episode, the task id, and the task's fields (`task_data`: the dataset row
    without `responses_create_params`). Answered `{resources_session_id}` with the session cookie; seeding the same
    id again returns the existing session; an id already closed is refused (409)."""

    model_config = ConfigDict(extra="forbid")
    resources_session_id: str = Field(min_length=1)
    episode_id: Any
    task_id: Any
    task_data: dict[str, Any]

    @classmethod
    def of(cls, body: Any) -> EnvironmentSeedRequest | None:
        """The body as this request when it has exactly its four keys, else None (a dataset row)."""
        if not isinstance(body, dict) or set(body) != set(cls.model_fields) or not isinstance(body["task_data"], dict):
            return None
        return cls.model_validate(body)


class VerifyRequest(BaseModel):
    """The `/verify` body: the dataset row (any extra task fields are kept) plus the rollout's `response`
    (an OpenAI Responses `Response` as a dict; `output` holds the whole trajectory: `nemo_gym.env.trajectory`
    reads it). A server declares the task fields it reads on a subclass and names it `verify_request_type`:
    the framework validates every body with it (422 when invalid)."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any]
    response: dict[str, Any]


class VerifyResult(BaseModel):
    """What `verify` returns: `reward` plus any verifier fields (kept in the rollout row)."""

    model_config = ConfigDict(extra="allow")
    reward: float
    reward_components: dict[str, float] | None = None


class _VerifyQuery(BaseModel):
    """`/verify`'s query parameters (pydantic's booleans: true/false, 1/0, yes/no, on/off)."""

    close_session: bool = Field(False, description="true: the answer also ends the session (as POST /close_session)")


_VERIFY_QUERY_PARAMETERS = [
    {"name": name, "in": "query", "required": False, "schema": schema, "description": schema["description"]}
    for name, schema in _VerifyQuery.model_json_schema()["properties"].items()
]


class ResourcesServer(BaseServer):
    """An environment: tools (methods marked `@tool`), `seed_session` and `verify`.

    Routes: see the module docstring. `POST /aggregate_metrics` answers what `aggregate_metrics` returns, plus NeMo
    Gym 0.4.0's `group_level_metrics`, `agent_metrics` and `key_metrics`
    (`nemo_gym.env.metrics.nemo_gym_aggregate_metrics`).
    """

    server_type = "resources_servers"
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    verify_request_type: ClassVar[type[VerifyRequest]] = VerifyRequest  # a subclass declares required task fields
    seed_request_type: ClassVar[type[SeedRequest] | None] = None  # a subclass: seed_session gets the row as it

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._mcp_allowed: dict[str, frozenset[str]] = {}  # session id -> its tools over MCP, when narrowed

    async def seed_session(self, row: dict[str, Any] | SeedRequest, session: Session) -> dict[str, Any]:
        """Start the rollout's state from the dataset row: a dict, or the `seed_request_type` instance when the
        server sets one (a row it rejects got a 422 before this is called). Returns data for the agent (default `{}`).
        """
        return {}

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        """Score the rollout. Must be implemented; the reward lies in `reward_range`."""
        raise NotImplementedError

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """Metrics over many verify answers: mean/min/max reward and the count (override to add more)."""
        rewards = [float(r["reward"]) for r in verify_responses if isinstance(r, dict) and "reward" in r]
        if not rewards:
            return {"num_rollouts": 0}
        return {
            "num_rollouts": len(rewards),
            "mean_reward": sum(rewards) / len(rewards),
            "min_reward": min(rewards),
            "max_reward": max(rewards),
        }

    def mcp_allowed_tools_for_session(self, row: dict[str, Any]) -> list[str] | None:
        """The tools one rollout may use over MCP, or None (the default) for all of them; asked when its session is
        seeded, with the `/seed_session` body (an environment server's seed: its `task_data`). NeMo Gym 0.7.0's hook
        of the same name: override it to narrow a rollout's tools (e.g. to those its row names)."""
        return None

    def row_schema(self) -> dict[str, Any]:
        """JSON Schema of a dataset row (`nemo_gym.serving.api_schema.row_schema`). The collector checks every row
        against it before the first rollout, so a row missing a task field fails with `file:line`."""
        return row_schema(self.verify_request_type, self.seed_request_type)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [function_tool_schema(name, fn) for name, fn in tool_methods(self).items()]

    def add_routes(self, app: FastAPI) -> None:
        self.tool_calls: dict[str, ToolCall] = {}
        for name, fn in tool_methods(self).items():
            self.add_tool_route(app, name, fn)
        if self.config.expose_tools_over_mcp:
            self.serving_contexts.append(mount_mcp(app, self.name, self._mcp_tools, self._call_over_mcp))
        app.add_api_route("/tools", self.tool_schemas, methods=["GET"])
        app.add_api_route("/row_schema", self.row_schema, methods=["GET"])
        app.add_api_route(
            "/seed_session",
            self._seed_route,
            methods=["POST"],
            openapi_extra=json_body({"type": "object", "description": "a dataset row"}),
        )
        # The query parameter is read in the route rather than declared to FastAPI, whose declared parameters bring
        # its own 422 schema into /openapi.json, while this route answers 422 as the others do (`ERROR_RESPONSES`).
        verify_body = json_body(model_schema(self.verify_request_type, self.openapi_components), required=True)
        app.add_api_route(
            "/verify",
            self._verify_route,
            methods=["POST"],
            openapi_extra={**verify_body, "parameters": _VERIFY_QUERY_PARAMETERS},
        )
        app.add_api_route(
            "/aggregate_metrics",
            self._aggregate_route,
            methods=["POST"],
            openapi_extra=json_body(AGGREGATE_BODY, required=True),
        )

    def add_tool_route(self, app: FastAPI, name: str, fn: Callable) -> None:
        """`POST /<name>` calling `fn` with the body as its arguments (typed from its hints, 422 when they break them;
        a parameter annotated `Session` gets the rollout's session). `add_routes` adds one per `@tool` method; a
        server whose tools are not methods (e.g. read from a project, as rnow_project's) adds its own with it."""
        model, session_param = arguments_model(name, fn)
        schema = json_body(model_schema(model, self.openapi_components))
        self.tool_calls[name] = self._tool_call(fn, model, session_param)
        app.add_api_route(
            f"/{name}",
            self._tool_route(self.tool_calls[name]),
            methods=["POST"],
            name=name,
            description=inspect.getdoc(fn) or "",
            openapi_extra=schema,
        )

    def _tool_call(self, fn: Callable, model: type[BaseModel], session_param: str | None) -> ToolCall:
        """One tool as `call(arguments, session)`: the arguments validated by `model` as NeMo Gym's FastAPI routes
        validate them (`"3"` for an `int` is 3), except that a JSON boolean is no number (RejectedRequest, a 422, when
        they break it), the session passed to the parameter annotated `Session`."""

        async def call(body: dict[str, Any], session: Session | None) -> Any:
            arguments = validated(model, body, booleans_as_numbers=False)
            kwargs = {field: getattr(arguments, field) for field in model.model_fields}
            if session_param:
                kwargs[session_param] = session
            if inspect.iscoroutinefunction(fn):
                return await fn(**kwargs)
            return await run_in_threadpool(fn, **kwargs)  # a plain def tool must not block the event loop

        return call

    def _tool_route(self, call: ToolCall) -> Callable:
        """The route function of one tool: its body as the tool's arguments, the request's session."""

        async def call_tool(request: Request) -> Any:
            body = await request_body(request)
            return await call(body, self.session_for(request))

        return call_tool

    def _mcp_tools(self, token: str | None = None) -> dict[str, dict[str, Any]]:
        """The tools served over MCP: those `GET /tools` lists that have a route (`add_tool_route`); with a session
        token, those of them its session is allowed."""
        allowed = self._mcp_allowed.get(token) if token else None
        return {
            schema["name"]: schema
            for schema in self.tool_schemas()
            if schema.get("name") in self.tool_calls and (allowed is None or schema["name"] in allowed)
        }

    def _allow_mcp_tools(self, session_id: str, row: dict[str, Any]) -> None:
        allowed = self.mcp_allowed_tools_for_session(row)
        if allowed is None:
            self._mcp_allowed.pop(session_id, None)
        else:
            self._mcp_allowed[session_id] = frozenset(allowed)

    def end_session(self, session_id: str) -> None:
        super().end_session(session_id)
        self._mcp_allowed.pop(session_id, None)

    async def _call_over_mcp(self, name: str, arguments: dict[str, Any], token: str | None) -> Any:
        """A tool called over MCP, in the session its token names (`nemo_gym.env.mcp_exposure`).

        Raises:
            ToolCallError: an unknown tool, no token, a token naming no live session, or arguments that break the
                tool's schema.
        """
        if name not in self.tool_calls:
            raise ToolCallError(f"unknown tool {name!r}; tools: {', '.join(sorted(self.tool_calls))}")
        if not token:
            raise ToolCallError(f"no {SESSION_TOKEN_HEADER} header: seed the session first (POST /seed_session)")
        session = self.sessions.get(token)
        if session is None:
            raise ToolCallError(f"{SESSION_TOKEN_HEADER} names no live session (closed, or never seeded here)")
        allowed = self._mcp_allowed.get(token)  # `name` has a route: only the session's narrowing is left to check
        if allowed is not None and name not in allowed:
            served = sorted(allowed & set(self.tool_calls))
            raise ToolCallError(f"tool {name!r} is not allowed in this rollout; allowed: {served}")
        try:
            return await self.tool_calls[name](arguments, session)
        except RejectedRequest as exc:
            raise ToolCallError(f"arguments of {name!r} rejected: {bytes(exc.answer.body).decode()}") from None

    async def _seed_route(self, request: Request) -> JSONResponse:
        row = await request_body(request)
        environment_seed = EnvironmentSeedRequest.of(row)
        if environment_seed is not None:
            return await self._seed_for_environment_server(environment_seed)
        typed = row if self.seed_request_type is None else validated(self.seed_request_type, row)
        session = self.session_for(request)
        session.clear()
        answer = dict(await self.seed_session(typed, session) or {})
        if self.config.expose_tools_over_mcp:
            self._allow_mcp_tools(session.session_id, row)
            answer[MCP_METADATA_KEY] = session_metadata(self.name, session.session_id)
        result = JSONResponse(answer)
        result.set_cookie(SESSION_COOKIE, session.session_id, httponly=True)
        return result

    async def _seed_for_environment_server(self, seed: EnvironmentSeedRequest) -> JSONResponse:
        session_id = seed.resources_session_id
        if session_id in self.closed_session_ids:
            return JSONResponse({"detail": f"session {session_id!r} was closed"}, status_code=409)
        if session_id not in self.sessions:  # the same id again: the session it has
            row = seed.task_data
            typed = row if self.seed_request_type is None else validated(self.seed_request_type, row)
            session = self.sessions[session_id] = Session(session_id)
            await self.seed_session(typed, session)
            if self.config.expose_tools_over_mcp:
                self._allow_mcp_tools(session_id, row)
        answer: dict[str, Any] = {"resources_session_id": session_id}
        if self.config.expose_tools_over_mcp:
            answer["resources_tools"] = session_metadata(self.name, session_id)
        result = JSONResponse(answer)
        result.set_cookie(SESSION_COOKIE, session_id, httponly=True)
        return result

    async def _verify_route(self, request: Request) -> dict[str, Any]:
        """`close_session=true`: the session ends with this answer (an agent's last call of the rollout, so it makes
        no separate `/close_session` call); after a failed verify it stays, for `/close_session`."""
        body = await request_body(request)
        query = validated(_VerifyQuery, dict(request.query_params))
        scored = body  # for scoring only, the names an MCP client namespaced back to the tools' (the row keeps them)
        if self.config.expose_tools_over_mcp and isinstance(body.get("response"), dict):
            scored = {**body, "response": unnamespaced(body["response"], self.name)}
        verify_request = validated(self.verify_request_type, scored)
        session = self.session_for(request)
        result = await self.verify(verify_request, session)
        if query.close_session:
            self.end_session(session.session_id)
        # Keep verifier fields that are null (e.g. mcqa's `extracted_answer: null`, as NeMo Gym writes them):
        # dropping them would let a stale value of the same name in the body show through.
        exclude = {"reward_components"} if result.reward_components is None else None
        return {**body, **result.model_dump(exclude=exclude)}

    async def _aggregate_route(self, request: Request) -> Any:
        responses = (await request_body(request)).get("verify_responses")
        if not isinstance(responses, list) or not all(_is_verify_answer(r) for r in responses):
            return JSONResponse(
                {"detail": 'body must be {"verify_responses": [{"reward": <number>, ...}, ...]}'}, status_code=422
            )
        # ours, over NeMo Gym 0.4.0's AggregateMetrics (group_level_metrics, agent_metrics, key_metrics): a superset
        return {**nemo_gym_aggregate_metrics(responses), **await self.aggregate_metrics(responses)}


def _is_verify_answer(item: Any) -> bool:
    """A verify answer: an object whose `reward`, when present, is a number."""
    if not isinstance(item, dict):
        return False
    reward = item.get("reward", 0.0)
    return isinstance(reward, (int, float)) and not isinstance(reward, bool)
