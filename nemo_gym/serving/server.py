"""The base of every gym server: its config, its FastAPI app, `/health`, per-rollout sessions and typed failures.

A server is a class with a pydantic `Config`; the framework builds the FastAPI app, owns the routes and the
per-rollout sessions (keyed by the `X-Session-Id` header, or the `nemo_gym_session_id` cookie for clients that only
keep cookies). User code never registers a route or touches a cookie. The three kinds of server build on
`BaseServer`: `nemo_gym.env.resources_server.ResourcesServer` (an environment), `nemo_gym.env.agent_server.AgentServer`
(the loop model -> tools -> verify) and `nemo_gym.model_servers.model_server.ModelServer` (a policy behind the OpenAI
API).
"""

from __future__ import annotations

import json
import uuid
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, ClassVar, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ServerError, ServerHTTPError, typed_failure
from nemo_gym.serving.api_schema import add_components
from nemo_gym.serving.auth import PeerPolicy, RunTokenAuth
from nemo_gym.serving.client import SESSION_COOKIE, SESSION_HEADER, ServerClient
from nemo_gym.serving.limits import DEFAULT_MAX_BODY_MB, RequestLimits, read_json_object
from nemo_gym.serving.rollout_prefix import RolloutPathPrefix
from nemo_gym.serving.session_cookie import SessionCookieEcho

ModelT = TypeVar("ModelT", bound=BaseModel)

__all__ = [
    "ServerConfig",
    "ServerRef",
    "Session",
    "BaseServer",
    "RejectedRequest",
    "request_body",
    "validated",
    "validation_answer",
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
    implementation_dir: str | None = Field(
        None,
        description=(
            "the server's folder when it is not <type>/<implementation> of this repository (e.g. a project made by"
            " ng_init); relative to the YAML file that sets it"
        ),
    )
    num_replicas: int = Field(
        1,
        ge=1,
        description=(
            "processes ng_run starts for this instance; clients balance calls over them, a rollout's calls stay on one"
        ),
    )
    extra_requirements: list[str] = Field(
        default_factory=list,
        description=(
            "requirements files installed into this server's environment besides its folder's requirements.txt (e.g. a"
            " ReinforceNow project's own); relative to the server's folder"
        ),
    )
    # placement on a Ray cluster (`ng_run +ray_address=...`; nemo_gym.orchestration.ray_placement), per replica
    num_cpus: float = Field(1.0, ge=0, description="with +ray_address: CPUs Ray reserves for each replica")
    num_gpus: float = Field(0.0, ge=0, description="with +ray_address: GPUs Ray reserves for each replica")
    resources: dict[str, float] = Field(
        default_factory=dict, description="with +ray_address: Ray custom resources each replica needs, e.g. {node_b: 1}"
    )
    max_restarts: int = Field(
        3, ge=0, description="with +ray_address: restarts of a replica whose process or node died before the run stops"
    )
    host: str = Field("127.0.0.1", description="address to bind; 127.0.0.1 unless you mean to expose the server")
    port: int = Field(0, description="TCP port; 0 lets the OS pick a free one (no port race)")
    domain: str | None = Field(None, description="task domain, e.g. math, coding, knowledge, agent")
    description: str | None = Field(None, description="one line on what this server does")
    value: str | None = Field(
        None,
        description=(
            "what training on this environment improves (NeMo Gym's field, e.g. 'Improve benchmarks like MMLU')"
        ),
    )
    license: str | None = Field(None, description="license of the environment's data")
    verified: bool | None = Field(None, description="whether the environment was checked by a person")
    datasets: list[dict[str, Any]] = Field(default_factory=list, description="datasets: name, type, jsonl_fpath, ...")
    max_body_mb: float = Field(
        DEFAULT_MAX_BODY_MB,
        gt=0,
        description="largest request body accepted, MiB; larger ones get 413 before they are read",
    )
    expose_tools_over_mcp: bool = Field(
        False,
        description=(
            "resources servers: serve the tools over MCP as well, at /mcp (NeMo Gym 0.7.0's flag;"
            " nemo_gym.env.mcp_exposure)"
        ),
    )


MAX_CLOSED_SESSION_IDS = 100_000


class Session(dict):
    """Per-rollout state of a server: a dict, created empty on first use of a session id."""

    def __init__(self, session_id: str, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.session_id = session_id


class BaseServer:
    """Common base: config, a client for other servers, `/health`, sessions.

    Subclasses add routes in `add_routes(app)`; `startup()`/`shutdown()` are awaited around serving.
    """

    Config: ClassVar[type[ServerConfig]] = ServerConfig
    server_type: ClassVar[str] = ""

    def __init__(
        self,
        config: ServerConfig | dict[str, Any] | None = None,
        *,
        name: str = "server",
        client: ServerClient | None = None,
    ):
        self.config = config if isinstance(config, ServerConfig) else self.Config.model_validate(config or {})
        self.name = name
        self.client = client or ServerClient()
        self.sessions: dict[str, Session] = {}
        # ids an environment server closed (NeMo Gym 0.7.0: a seed racing its close must not create the session
        # again), oldest first, at most MAX_CLOSED_SESSION_IDS
        self.closed_session_ids: dict[str, None] = {}

    # -- hooks -------------------------------------------------------------------------------------
    async def startup(self) -> None:
        """Awaited once before the server answers `/health` with ok."""

    async def shutdown(self) -> None:
        """Awaited once when the server stops."""

    def prefetch(self) -> list[str]:
        """Build or fetch what `startup` would, without serving (`ng_prefetch`), so a later start needs neither time
        nor a network for it; blocking. Runs in the server's own environment, outside any run (no head server, no
        run token). Returns one line per thing prepared (none by default).

        Raises:
            ConfigError: the config names something that cannot be prepared.
        """
        return []

    def registration_extras(self) -> dict[str, Any]:
        """More fields of this server's registration with the head server (`nemo_gym.serving.head.Registration`):
        none by default; an agent whose rollouts are captured adds the run's `token_id_capture` settings."""
        return {}

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

    def _add_session_and_health_routes(self, app: FastAPI) -> None:
        """`/health` (and NeMo Gym 0.7.0's probes: `/healthz`, `/readyz` as it, `/livez` and `/` for liveness) and
        `/close_session` (a cookie's or header's session, or the one NeMo Gym 0.7.0's body names)."""

        @app.get("/health")
        @app.get("/healthz", include_in_schema=False)  # NeMo Gym 0.7.0's probe routes: readiness
        @app.get("/readyz", include_in_schema=False)
        async def health() -> JSONResponse:
            if not self.ready:
                return JSONResponse({"status": "starting"}, status_code=503)
            return JSONResponse({"status": "ok", "name": self.name, "server_type": self.server_type})

        @app.get("/livez", include_in_schema=False)  # NeMo Gym 0.7.0's probe routes: liveness
        @app.get("/", include_in_schema=False)
        async def live() -> dict:
            return {"status": "ok"}

        @app.post("/close_session")
        async def close_session(request: Request) -> dict:
            # NeMo Gym 0.7.0's environment servers name the session in the body (ResourcesCloseSessionRequest)
            raw = await request.body()
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:  # no JSON: the request's own session (cookie or header), as before
                body = {}
            named = body.get("resources_session_id") if isinstance(body, dict) else None
            if isinstance(named, str) and named:
                self.end_session(named)
                self.closed_session_ids[named] = None  # a seed of it that comes later is refused (409)
                while len(self.closed_session_ids) > MAX_CLOSED_SESSION_IDS:
                    self.closed_session_ids.pop(next(iter(self.closed_session_ids)))
                return {"resources_session_id": named}
            self.end_session(self.request_session_id(request) or "")
            return {}

    def build_app(self, *, run_token: str | None = None) -> FastAPI:
        """The FastAPI app of this server. With `run_token` (`ng_run` passes its run's), every route but
        `/health` answers 401 to a caller without it, unless the run's peer policy allows the caller
        (`nemo_gym.serving.auth`:
        NeMo Gym servers the run started; with `+allow_same_user=true`, this user's processes); without, nothing is
        checked."""
        self.ready = False
        # contexts the app is served inside, entered before `startup` (e.g. the MCP session manager of a resources
        # server that exposes its tools over MCP); `add_routes` may append to them
        self.serving_contexts: list[AbstractAsyncContextManager] = []

        async def lifespan(app: FastAPI):
            async with AsyncExitStack() as contexts:
                for context in self.serving_contexts:
                    await contexts.enter_async_context(context)
                await self.startup()
                self.ready = True
                yield
                self.ready = False
                await self.shutdown()
                await self.client.aclose()

        app = FastAPI(title=f"nemo_gym {self.server_type} {self.name}", lifespan=lifespan)
        app.add_middleware(RolloutPathPrefix)  # innermost: NeMo Gym 0.7.0's /ng-rollout/<id>/ prefix taken off
        app.add_middleware(SessionCookieEcho)
        app.add_middleware(RequestLimits, max_body_bytes=int(self.config.max_body_mb * 2**20))
        # outermost: nothing runs for a caller without the token (or one the run's peer policy allows:
        # nemo_gym.serving.auth)
        app.add_middleware(RunTokenAuth, token=run_token, peers=PeerPolicy.from_env() if run_token else None)
        self.openapi_components: dict[str, Any] = {}  # sub-schemas of the declared request bodies
        add_components(app, self.openapi_components)

        self._add_session_and_health_routes(app)

        @app.exception_handler(RejectedRequest)
        async def rejected(request: Request, exc: RejectedRequest) -> JSONResponse:
            return exc.answer

        @app.exception_handler(ServerError)
        async def server_error(request: Request, exc: ServerError) -> JSONResponse:
            # A failure of a server we called: 424 after a 4xx, else 502, with a typed body so callers can classify it.
            failure = typed_failure(exc)
            return JSONResponse(failure.answer(), status_code=failure.relay_status)

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


class RejectedRequest(Exception):
    """A request answered with a 4xx before a route's own code runs: raised by `request_body` and `validated`,
    answered with `answer` by every server's app (`BaseServer.build_app`)."""

    def __init__(self, answer: JSONResponse):
        super().__init__(answer.status_code)
        self.answer = answer


async def request_body(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (`nemo_gym.serving.limits.read_json_object`: size, depth and values checked).

    Raises:
        RejectedRequest: not a JSON object, or over the limits (its 4xx answer).
    """
    body = await read_json_object(request)
    if isinstance(body, JSONResponse):
        raise RejectedRequest(body)
    return body


def validated(model: type[ModelT], data: Any, *, booleans_as_numbers: bool = True) -> ModelT:
    """`data` (JSON values) as an instance of `model`, in pydantic's lax mode (`"3"` for an `int` is 3, as FastAPI
    routes such as NeMo Gym's take it); without `booleans_as_numbers`, a JSON `true`/`false` where `model` wants a
    number is refused rather than taken as 1/0.

    Raises:
        RejectedRequest: `data` breaks the model (a 422 answer with pydantic's errors).
    """
    try:
        value = model.model_validate(data)
    except ValidationError as exc:
        raise RejectedRequest(validation_answer(exc)) from None
    if not booleans_as_numbers and (errors := _booleans_taken_as_numbers(model, data)):
        raise RejectedRequest(JSONResponse({"detail": errors}, status_code=422))
    return value


def _booleans_taken_as_numbers(model: type[BaseModel], data: Any) -> list[dict[str, Any]]:
    """pydantic's errors (as `validation_answer` gives them) for the booleans in `data` that `model` took as numbers:
    those its strict mode on the JSON refuses (strict mode refuses `"3"` too; only the booleans' errors are kept)."""
    if "true" not in (raw := json.dumps(data)) and "false" not in raw:  # no boolean anywhere (the common case)
        return []
    try:
        model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False))
        return [{k: v for k, v in e.items() if k != "input"} for e in errors if isinstance(e.get("input"), bool)]
    return []


def validation_answer(exc: ValidationError) -> JSONResponse:
    """The 422 answer of a body that breaks its model: pydantic's errors, without URLs or the input echoed back."""
    return JSONResponse({"detail": json.loads(exc.json(include_url=False, include_input=False))}, status_code=422)
