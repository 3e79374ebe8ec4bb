"""Base classes for gym servers: resources servers, agents and model servers.

A server is a class with a pydantic `Config`; the framework builds the FastAPI app, owns the routes and the
per-rollout sessions (keyed by the `X-Session-Id` header, or the `nemo_gym_session_id` cookie for clients
that only keep cookies). User code never registers a route or touches a cookie:

    class MyServer(ResourcesServer):
        @tool
        async def get_weather(self, city: str) -> dict:
            "Weather in a city."
            return {"city": city, "weather": "cold"}

        async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
            return VerifyResult(reward=float(bool(Trajectory.of(request.response).calls_named("get_weather"))))
"""

from __future__ import annotations

import inspect
import json
import uuid
from typing import Any, Callable, ClassVar, Literal

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.api_schema import AGGREGATE_BODY, add_components, json_body, model_schema, row_schema
from nemo_gym.auth import PeerPolicy, RunTokenAuth
from nemo_gym.client import SESSION_COOKIE, SESSION_HEADER, ServerClient
from nemo_gym.errors import ServerError, ServerHTTPError
from nemo_gym.limits import DEFAULT_MAX_BODY_MB, RequestLimits, read_json_object
from nemo_gym.openai_stream import chat_sse, responses_sse
from nemo_gym.reward_profile import nemo_gym_aggregate_metrics
from nemo_gym.session_cookie import SessionCookieEcho
from nemo_gym.tools import Session, arguments_model, function_tool_schema, tool, tool_methods

__all__ = [
    "ServerConfig",
    "ServerRef",
    "BaseServer",
    "ResourcesServer",
    "AgentServer",
    "ModelServer",
    "Session",
    "SeedRequest",
    "VerifyRequest",
    "VerifyResult",
    "tool",
    "forward_optional_route",
]


class ServerRef(BaseModel):
    """A reference to another server instance of the resolved config."""

    model_config = ConfigDict(extra="forbid")
    type: str = Field(description="server type: resources_servers, responses_api_agents or responses_api_models")
    name: str = Field(description="instance name in the resolved config")


class ServerConfig(BaseModel):
    """Fields every server instance accepts. Subclass it as `Config` to add the server's own fields."""

    model_config = ConfigDict(extra="forbid")
    entrypoint: str = Field("app.py", description="file of the implementation folder that defines the server class")
    implementation_dir: str | None = Field(None, description="the server's folder when it is not <type>/<implementation> of this repository (e.g. a project made by ng_init); relative to the YAML file that sets it")
    num_replicas: int = Field(1, ge=1, description="processes ng_run starts for this instance; clients balance calls over them, a rollout's calls stay on one")
    extra_requirements: list[str] = Field(default_factory=list, description="requirements files installed into this server's environment besides its folder's requirements.txt (e.g. a ReinforceNow project's own); relative to the server's folder")
    # placement on a Ray cluster (`ng_run +ray_address=...`; nemo_gym.ray_placement), per replica
    num_cpus: float = Field(1.0, ge=0, description="with +ray_address: CPUs Ray reserves for each replica")
    num_gpus: float = Field(0.0, ge=0, description="with +ray_address: GPUs Ray reserves for each replica")
    resources: dict[str, float] = Field(default_factory=dict, description="with +ray_address: Ray custom resources each replica needs, e.g. {node_b: 1}")
    max_restarts: int = Field(3, ge=0, description="with +ray_address: restarts of a replica whose process or node died before the run stops")
    host: str = Field("127.0.0.1", description="address to bind; 127.0.0.1 unless you mean to expose the server")
    port: int = Field(0, description="TCP port; 0 lets the OS pick a free one (no port race)")
    domain: str | None = Field(None, description="task domain, e.g. math, coding, knowledge, agent")
    description: str | None = Field(None, description="one line on what this server does")
    value: str | None = Field(None, description="what training on this environment improves (NeMo Gym's field, e.g. 'Improve benchmarks like MMLU')")
    license: str | None = Field(None, description="license of the environment's data")
    verified: bool | None = Field(None, description="whether the environment was checked by a person")
    datasets: list[dict[str, Any]] = Field(default_factory=list, description="datasets: name, type, jsonl_fpath, ...")
    max_body_mb: float = Field(DEFAULT_MAX_BODY_MB, gt=0, description="largest request body accepted, MiB; larger ones get 413 before they are read")


class SeedRequest(BaseModel):
    """The `/seed_session` body: the dataset row (every field kept). A server that reads task fields when it seeds
    declares them on a subclass, its `seed_request_type`: the row is validated (422) and `seed_session` gets it typed."""

    model_config = ConfigDict(extra="allow")


class VerifyRequest(BaseModel):
    """The `/verify` body: the dataset row (any extra task fields are kept) plus the rollout's `response`
    (an OpenAI Responses `Response` as a dict; `output` holds the whole trajectory: `nemo_gym.trajectory`
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


class BaseServer:
    """Common base: config, a client for other servers, `/health`, sessions.

    Subclasses add routes in `add_routes(app)`; `startup()`/`shutdown()` are awaited around serving.
    """

    Config: ClassVar[type[ServerConfig]] = ServerConfig
    server_type: ClassVar[str] = ""

    def __init__(self, config: ServerConfig | dict[str, Any] | None = None, *, name: str = "server", client: ServerClient | None = None):
        self.config = config if isinstance(config, ServerConfig) else self.Config.model_validate(config or {})
        self.name = name
        self.client = client or ServerClient()
        self.sessions: dict[str, Session] = {}

    # -- hooks -------------------------------------------------------------------------------------
    async def startup(self) -> None:
        """Awaited once before the server answers `/health` with ok."""

    async def shutdown(self) -> None:
        """Awaited once when the server stops."""

    def add_routes(self, app: FastAPI) -> None:
        """Register the server type's routes."""

    # -- framework ---------------------------------------------------------------------------------
    @staticmethod
    def request_session_id(request: Request) -> str | None:
        """The session id a request names: its `X-Session-Id` header, then its session cookie; None without either."""
        return request.headers.get(SESSION_HEADER) or request.cookies.get(SESSION_COOKIE)

    def session_for(self, request: Request) -> Session:
        """The session of this request (`request_session_id`; a new id when it names none)."""
        session_id = self.request_session_id(request) or uuid.uuid4().hex
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = Session(session_id)
        return session

    def end_session(self, session_id: str) -> None:
        """Forget a session (`POST /close_session`, `POST /verify?close_session=true`); an unknown id is ignored."""
        self.sessions.pop(session_id, None)

    def build_app(self, *, run_token: str | None = None) -> FastAPI:
        """The FastAPI app of this server. With `run_token` (`ng_run` passes its run's), every route but
        `/health` answers 401 to a caller without it, unless the run's peer policy allows the caller (`nemo_gym.auth`:
        NeMo Gym servers the run started; with `+allow_same_user=true`, this user's processes); without, nothing is
        checked."""
        self.ready = False

        async def lifespan(app: FastAPI):
            await self.startup()
            self.ready = True
            yield
            self.ready = False
            await self.shutdown()
            await self.client.aclose()

        app = FastAPI(title=f"nemo_gym {self.server_type} {self.name}", lifespan=lifespan)
        app.add_middleware(SessionCookieEcho)
        app.add_middleware(RequestLimits, max_body_bytes=int(self.config.max_body_mb * 2**20))
        # outermost: nothing runs for a caller without the token (or one the run's peer policy allows: nemo_gym.auth)
        app.add_middleware(RunTokenAuth, token=run_token, peers=PeerPolicy.from_env() if run_token else None)
        self.openapi_components: dict[str, Any] = {}  # sub-schemas of the declared request bodies
        add_components(app, self.openapi_components)

        @app.get("/health")
        async def health() -> JSONResponse:
            if not self.ready:
                return JSONResponse({"status": "starting"}, status_code=503)
            return JSONResponse({"status": "ok", "name": self.name, "server_type": self.server_type})

        @app.post("/close_session")
        async def close_session(request: Request) -> dict:
            self.end_session(self.request_session_id(request) or "")
            return {}

        @app.exception_handler(ServerError)
        async def server_error(request: Request, exc: ServerError) -> JSONResponse:
            # A failure of a server we called: answer 502 with a typed body so callers can classify it.
            status = 502
            failure_class, server = exc.failure_class, exc.server
            if isinstance(exc, ServerHTTPError):
                if 400 <= exc.status_code < 500:
                    status = 424
                inner = _typed_error(exc.body)  # a typed failure further down the chain keeps its class and server
                if inner:
                    failure_class, server = inner.get("type", failure_class), inner.get("server") or server
            body = {"error": {"type": failure_class, "server": server, "message": str(exc)[:4000]}}
            return JSONResponse(body, status_code=status)

        self.add_routes(app)
        return app


async def forward_optional_route(client: ServerClient, server: str, path: str) -> Any:
    """GET `path` of instance `server` for an agent that forwards one of its environment's optional routes (e.g.
    `/row_schema`): a 404 or 405 from downstream (a server without the route, such as NeMo Gym's) is answered 404,
    "not offered", so the caller can go on without it, rather than 424 as a failed call would be.

    Raises:
        ServerError: any other failure of the call (answered by the app's handler as 424/502).
    """
    try:
        return await client.get(server, path)
    except ServerHTTPError as exc:
        if exc.status_code not in (404, 405):
            raise
        return JSONResponse({"detail": f"server {server!r} does not offer {path}"}, status_code=404)


def _typed_error(body: str) -> dict[str, Any] | None:
    """The `error` object of a typed failure answer (`{"error": {"type", "server", "message"}}`), else None."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) and isinstance(error.get("type"), str) else None


class _VerifyQuery(BaseModel):
    """`/verify`'s query parameters (pydantic's booleans: true/false, 1/0, yes/no, on/off)."""

    close_session: bool = Field(False, description="true: the answer also ends the session (as POST /close_session)")


_VERIFY_QUERY_PARAMETERS = [{"name": name, "in": "query", "required": False, "schema": schema, "description": schema["description"]}
                            for name, schema in _VerifyQuery.model_json_schema()["properties"].items()]


def _validation_answer(exc: ValidationError) -> JSONResponse:
    return JSONResponse({"detail": json.loads(exc.json(include_url=False, include_input=False))}, status_code=422)


class ResourcesServer(BaseServer):
    """An environment: tools (methods marked `@tool`), `seed_session` and `verify`.

    Routes: `POST /<tool>`, `GET /tools`, `POST /seed_session`, `POST /verify` (`?close_session=true`: the answer
    also ends the session, as `POST /close_session` does), `POST /aggregate_metrics` (what `aggregate_metrics`
    returns, plus NeMo Gym 0.4.0's `group_level_metrics`, `agent_metrics` and `key_metrics`:
    `nemo_gym.reward_profile.nemo_gym_aggregate_metrics`).
    """

    server_type = "resources_servers"
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    verify_request_type: ClassVar[type[VerifyRequest]] = VerifyRequest  # a subclass declares required task fields
    seed_request_type: ClassVar[type[SeedRequest] | None] = None  # a subclass: seed_session gets the row as it

    async def seed_session(self, row: dict[str, Any] | SeedRequest, session: Session) -> dict[str, Any]:
        """Start the rollout's state from the dataset row: a dict, or the `seed_request_type` instance when the
        server sets one (a row it rejects got a 422 before this is called). Returns data for the agent (default `{}`)."""
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

    def row_schema(self) -> dict[str, Any]:
        """JSON Schema of a dataset row (`nemo_gym.api_schema.row_schema`). The collector checks every row against
        it before the first rollout, so a row missing a task field fails with `file:line`."""
        return row_schema(self.verify_request_type, self.seed_request_type)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [function_tool_schema(name, fn) for name, fn in tool_methods(self).items()]

    def add_routes(self, app: FastAPI) -> None:
        for name, fn in tool_methods(self).items():
            self._add_tool_route(app, name, fn)

        @app.get("/tools")
        async def tools() -> list[dict[str, Any]]:
            return self.tool_schemas()

        @app.get("/row_schema")
        async def row_schema() -> dict[str, Any]:
            return self.row_schema()

        @app.post("/seed_session", openapi_extra=json_body({"type": "object", "description": "a dataset row"}))
        async def seed_session(request: Request) -> Any:
            row = await _json_object(request)
            row = row if isinstance(row, JSONResponse) else self._typed_seed_row(row)
            if isinstance(row, JSONResponse):
                return row
            session = self.session_for(request)
            session.clear()
            answer = await self.seed_session(row, session)
            result = JSONResponse(answer or {})
            result.set_cookie(SESSION_COOKIE, session.session_id, httponly=True)
            return result

        # The query parameter is read here rather than declared to FastAPI, whose declared parameters bring its
        # own 422 schema into /openapi.json, while this route answers 422 as the others do (`ERROR_RESPONSES`).
        @app.post("/verify", openapi_extra={**json_body(model_schema(self.verify_request_type, self.openapi_components), required=True), "parameters": _VERIFY_QUERY_PARAMETERS})
        async def verify(request: Request) -> Any:
            """`close_session=true`: the session ends with this answer (an agent's last call of the rollout, so it
            makes no separate `/close_session` call); after a failed verify it stays, for `/close_session`."""
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            try:
                query = _VerifyQuery.model_validate(dict(request.query_params))
                verify_request = self.verify_request_type.model_validate(body)
            except ValidationError as exc:
                return _validation_answer(exc)
            session = self.session_for(request)
            result = await self.verify(verify_request, session)
            if query.close_session:
                self.end_session(session.session_id)
            # Keep verifier fields that are null (e.g. mcqa's `extracted_answer: null`, as NeMo Gym writes
            # them): dropping them would let a stale value of the same name in the body show through.
            exclude = {"reward_components"} if result.reward_components is None else None
            return {**body, **result.model_dump(exclude=exclude)}

        @app.post("/aggregate_metrics", openapi_extra=json_body(AGGREGATE_BODY, required=True))
        async def aggregate_metrics(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            responses = body.get("verify_responses")
            if not isinstance(responses, list) or not all(_is_verify_answer(r) for r in responses):
                return JSONResponse({"detail": "body must be {\"verify_responses\": [{\"reward\": <number>, ...}, ...]}"}, status_code=422)
            # ours, over NeMo Gym 0.4.0's AggregateMetrics (group_level_metrics, agent_metrics, key_metrics): a superset
            return {**nemo_gym_aggregate_metrics(responses), **await self.aggregate_metrics(responses)}

    def _typed_seed_row(self, row: dict[str, Any]) -> dict[str, Any] | SeedRequest | JSONResponse:
        """`row` as `seed_request_type` (as given when there is none), or the 422 answer saying why it is invalid."""
        try:
            return row if self.seed_request_type is None else self.seed_request_type.model_validate(row)
        except ValidationError as exc:
            return _validation_answer(exc)

    def _add_tool_route(self, app: FastAPI, name: str, fn: Callable) -> None:
        model, session_param = arguments_model(name, fn)

        async def call_tool(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            try:
                arguments = model.model_validate(body)
            except ValidationError as exc:
                return _validation_answer(exc)
            kwargs = {field: getattr(arguments, field) for field in model.model_fields}
            if session_param:
                kwargs[session_param] = self.session_for(request)
            if inspect.iscoroutinefunction(fn):
                return await fn(**kwargs)
            return await run_in_threadpool(fn, **kwargs)  # a plain def tool must not block the event loop

        schema = json_body(model_schema(model, self.openapi_components))
        app.add_api_route(f"/{name}", call_tool, methods=["POST"], name=name, description=inspect.getdoc(fn) or "", openapi_extra=schema)


def _is_verify_answer(item: Any) -> bool:
    """A verify answer: an object whose `reward`, when present, is a number."""
    if not isinstance(item, dict):
        return False
    reward = item.get("reward", 0.0)
    return isinstance(reward, (int, float)) and not isinstance(reward, bool)


_json_object = read_json_object  # the body of a framework route: a JSON object, or a 4xx answer


# The fields of agent and model bodies the framework checks (strictly, so a declared type means that type);
# every other field passes through untouched. Their JSON schemas are what /openapi.json declares.
class _ResponsesCreate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="ResponsesCreate")
    input: str | list[dict[str, Any]] = Field(None, description="a user message, or the input items")  # type: ignore[assignment]
    stream: bool | None = None


class _AgentResponsesCreate(_ResponsesCreate):
    model_config = ConfigDict(title="AgentResponsesCreate")
    stream: Literal[False] | None = Field(None, description="agents answer with the whole episode: they do not stream")


class _ChatCreate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="ChatCompletionCreate")
    messages: list[dict[str, Any]] = Field(None, description="the chat messages")  # type: ignore[assignment]
    stream: bool | None = None


class _Row(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="Row")
    responses_create_params: _AgentResponsesCreate


def _invalid(model: type[BaseModel], body: dict[str, Any]) -> JSONResponse | None:
    """A 422 answer when `body` breaks `model`, else None (the body itself is used, not the model)."""
    try:
        model.model_validate(body)
    except ValidationError as exc:
        return _validation_answer(exc)
    return None


class AgentServer(BaseServer):
    """An agent: `POST /run` (a dataset row → the verify answer) and `POST /v1/responses` (the loop only)."""

    server_type = "responses_api_agents"

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """One rollout of `row`; returns the resources server's verify answer."""
        raise NotImplementedError

    async def responses(self, body: dict[str, Any], *, session_id: str | None = None) -> dict[str, Any]:
        """Run the multi-step loop for a Responses create body; returns the `Response` dict."""
        raise NotImplementedError

    def add_routes(self, app: FastAPI) -> None:
        @app.post("/run", openapi_extra=json_body(model_schema(_Row, self.openapi_components), required=True))
        async def run(request: Request) -> Any:
            row = await _json_object(request)
            if isinstance(row, JSONResponse):
                return row
            return _invalid(_Row, row) or await self.run(row)

        @app.post("/v1/responses", openapi_extra=json_body(model_schema(_AgentResponsesCreate, self.openapi_components), required=True))
        async def responses(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            return _invalid(_AgentResponsesCreate, body) or await self.responses(body, session_id=request.headers.get(SESSION_HEADER))


class ModelServer(BaseServer):
    """A policy model behind the OpenAI API: `POST /v1/responses`, `POST /v1/chat/completions`, `GET /v1/models`.

    Subclasses implement `responses(body)` and `chat_completions(body)` (non-streaming); `stream: true`
    is served by the framework as server-sent events built from the full answer.
    """

    server_type = "responses_api_models"

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def models(self) -> list[str]:
        """Model names served."""
        return []

    def add_routes(self, app: FastAPI) -> None:
        @app.post("/v1/responses", openapi_extra=json_body(model_schema(_ResponsesCreate, self.openapi_components), required=True, streams=True))
        async def responses(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            if problem := _invalid(_ResponsesCreate, body):
                return problem
            stream = bool(body.pop("stream", False))
            answer = await self.responses(body)
            return responses_sse(answer) if stream else answer

        @app.post("/v1/chat/completions", openapi_extra=json_body(model_schema(_ChatCreate, self.openapi_components), required=True, streams=True))
        async def chat_completions(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            if problem := _invalid(_ChatCreate, body):
                return problem
            stream = bool(body.pop("stream", False))
            body.pop("stream_options", None)
            answer = await self.chat_completions(body)
            return chat_sse(answer) if stream else answer

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "nemo_gym"} for m in await self.models()]}
