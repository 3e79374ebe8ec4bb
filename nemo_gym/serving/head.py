"""The head server: discovery of a run's servers by instance name. It never serves config values or secrets.

Routes: `GET /health`, `GET /servers` (one `{name, replica, server_type, implementation, url, pid, registered_at,
external, framework, send_run_token}` per replica), `GET /servers/{name}` (the instance's lowest-numbered replica,
plus `replicas: [{replica, url}]`), `POST /register` (used by servers at start-up; registering the same (name,
replica) again replaces its address: a restarted replica). ng_run itself registers the servers it does not start
(external ones, `url:` in the config) and the NeMo Gym servers it starts.

For NVIDIA NeMo Gym's clients (its `ng_collect_rollouts`, `ServerClient.load_from_global_config`), which discover
servers differently: `GET /global_config_dict_yaml` (a JSON string holding YAML: `head_server: {host, port}` and
`<name>: {<server_type>: {<implementation>: {host, port}}}` per instance, replica 0) and `GET /server_instances`
(one `{process_name, server_type, name, host, port, url}` per instance). Both hold addresses only: never another
config value, never a secret (`nemo_gym.serving.nemo_gym_discovery`).
Each `ng_run` writes `<NEMO_GYM_HOME>/runs/<run_id>/state.json`; outside clients find the head server with
`discover_head_url`, and the run's token (every route but `/health` needs it, see `nemo_gym.serving.auth`) with
`run_token_for_url`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError, field_validator

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.serving.api_schema import add_components, json_body, model_schema
from nemo_gym.serving.auth import TOKEN_HEADER, PeerPolicy, RunTokenAuth, current_run_token, read_token_file
from nemo_gym.serving.limits import RequestLimits, read_json_object
from nemo_gym.serving.nemo_gym_discovery import add_nemo_gym_discovery_routes

__all__ = [
    "runs_dir",
    "live_runs",
    "discover_head_url",
    "run_token_for_url",
    "run_token_headers",
    "build_head_app",
    "Registration",
    "ServerRegistry",
]

DEFAULT_HEAD_PORT = 11000


def runs_dir() -> Path:
    return nemo_gym_home() / "runs"


def live_runs() -> list[dict[str, Any]]:
    """State of every `ng_run` whose process is alive, newest first."""
    runs = []
    for state_file in runs_dir().glob("*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        pid = state.get("pid")
        if pid and psutil.pid_exists(pid):
            try:
                if abs(psutil.Process(pid).create_time() - state.get("process_create_time", 0)) < 1.0:
                    runs.append(state)
            except psutil.Error:
                continue
    return sorted(runs, key=lambda s: s.get("started_at", 0), reverse=True)


def discover_head_url(explicit: str | None = None) -> str:
    """The head server URL: `explicit` if given, else `$NEMO_GYM_HEAD_URL`, else the only live `ng_run`.

    Raises:
        ConfigError: no run is live, or several are (then pass +head_server_url=...).
    """
    if explicit:
        return explicit.rstrip("/")
    if os.environ.get("NEMO_GYM_HEAD_URL"):
        return os.environ["NEMO_GYM_HEAD_URL"].rstrip("/")
    runs = live_runs()
    if not runs:
        raise ConfigError(
            "no running ng_run found: start the servers with ng_run first, or pass"
            " +head_server_url=http://127.0.0.1:<port>"
        )
    if len(runs) > 1:
        listed = ", ".join(f"{r['head_url']} ({r['run_id']})" for r in runs)
        raise ConfigError(f"several ng_run processes are running ({listed}); choose one with +head_server_url=<url>")
    return runs[0]["head_url"]


def _origin(url: str) -> str:
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port}"


def run_token_for_url(url: str | None) -> str | None:
    """The run token to send to `url` (a head server or a server of a run): this process's own run token
    (a server started by `ng_run`), else the token file of the live run whose head server or one of whose
    servers has that address, else None (a run with `+allow_unauthenticated=true`, or no run)."""
    own = current_run_token()
    if own or not url:
        return own
    try:
        origin = _origin(url)
    except (httpx.InvalidURL, TypeError):
        return None
    for run in live_runs():
        urls = [run.get("head_url"), *(s.get("url") for s in run.get("servers", []))]
        if any(u and _origin(u) == origin for u in urls):
            return read_token_file(runs_dir() / run["run_id"])
    return None


def run_token_headers(url: str | None) -> dict[str, str]:
    """Headers carrying the run token for a request to `url` (`{}` when no token applies); for plain httpx calls
    to a run's servers (the ServerClient sends it by itself)."""
    token = run_token_for_url(url)
    return {TOKEN_HEADER: token} if token else {}


class Registration(BaseModel):
    name: str
    server_type: str
    implementation: str
    url: str
    pid: int
    replica: int = Field(
        0, ge=0, description="replica index of the instance (0-based; `num_replicas` processes share the name)"
    )
    external: bool = Field(False, description="a server ng_run did not start (`url:` in the config)")
    framework: str | None = Field(
        None, description="`nemo_gym`: a server written for NVIDIA NeMo Gym, run with a NeMo Gym release"
    )
    send_run_token: bool = Field(
        True,
        description=(
            "whether clients send the run's token to it (not to external and NeMo Gym servers, unless configured)"
        ),
    )
    references: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description=(
            "the server instances its config names, by field (`{resources_server: {type, name}}`): names only. The"
            " collector resolves NeMo Gym 0.7.0's `task_source` rows by them"
        ),
    )
    dataset_agent_pins: list[str] = Field(
        default_factory=list,
        description=(
            "the agents its config's datasets pin (NeMo Gym 0.7.0's dataset key `agent:`), distinct, in order: names"
            " only. The collector resolves `task_source` rows of its datasets to the pinned agent"
        ),
    )

    token_id_capture: dict[str, Any] | None = Field(
        None,
        description=(
            "an agent whose rollouts' model calls are recorded: the run's training token capture settings"
            " (nemo_gym.serving.token_capture.TokenIdCaptureSettings), read by the collector to rebuild them"
        ),
    )

    @field_validator("url")
    @classmethod
    def _absolute_http_url(cls, url: str) -> str:
        """An address clients can reach: `http(s)://host[:port][/path]`, which the discovery routes split into
        host and port (a URL httpx refuses would break `/global_config_dict_yaml` for every caller)."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("not an absolute http(s) URL")
        return url


class ServerRegistry(dict):
    """Instance name → registration of its lowest-numbered replica; `replicas[name]` maps every replica index
    to its registration. Setting `registry[name] = entry` registers `entry` as replica `entry.get("replica", 0)`
    of `name`, replacing that replica's earlier registration."""

    def __init__(self) -> None:
        super().__init__()
        self.replicas: dict[str, dict[int, dict[str, Any]]] = {}

    def __setitem__(self, name: str, entry: dict[str, Any]) -> None:
        replicas = self.replicas.setdefault(name, {})
        replicas[int(entry.get("replica", 0))] = entry
        super().__setitem__(name, replicas[min(replicas)])

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.replicas.pop(name, None)

    def replica(self, name: str, index: int) -> dict[str, Any] | None:
        """The registration of replica `index` of `name`, or None."""
        return self.replicas.get(name, {}).get(index)

    def entries(self, name: str) -> list[dict[str, Any]]:
        """Every replica's registration of `name`, by index, each with its `replica` field."""
        return [{**entry, "replica": index} for index, entry in sorted(self.replicas.get(name, {}).items())]


def _add_probe_routes(app: FastAPI) -> None:
    """NeMo Gym 0.7.0's probe routes of a head server: liveness (`/livez`, `/`), and readiness (`/readyz`,
    `/healthz`: 503 until ng_run sets `app.state.ready`, every server of the run healthy)."""

    @app.get("/livez", include_in_schema=False)
    @app.get("/", include_in_schema=False)
    async def live() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    @app.get("/healthz", include_in_schema=False)
    async def ready() -> JSONResponse:
        if not app.state.ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok"})


def build_head_app(run_token: str | None = None, peers: PeerPolicy | None = None) -> FastAPI:
    """The head server app; `app.state.servers` (a `ServerRegistry`) maps instance name → registration dict
    of its lowest-numbered replica, and keeps every replica.

    With `run_token`, every route but `/health` answers 401 without it, unless `peers` allows the caller (see
    `nemo_gym.serving.auth`).
    """
    app = FastAPI(title="nemo_gym head server")
    app.add_middleware(RequestLimits)  # registrations are tiny: the default cap is generous
    app.add_middleware(
        RunTokenAuth, token=run_token, peers=peers
    )  # outermost: nothing runs for a caller without the token
    app.state.servers = ServerRegistry()
    app.state.ready = False  # set by ng_run once every server of the run answers its health route

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "name": "head", "server_type": "head"}

    _add_probe_routes(app)

    components: dict[str, Any] = {}
    add_components(app, components)

    @app.post("/register", openapi_extra=json_body(model_schema(Registration, components), required=True))
    async def register(request: Request) -> Any:
        # Parsed by the framework's strict parser (no inf/NaN echoed back into a 422 that cannot be encoded).
        body = await read_json_object(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            registration = Registration.model_validate(body)
        except ValidationError as exc:
            return JSONResponse(
                {"detail": exc.errors(include_url=False, include_input=False, include_context=False)}, status_code=422
            )
        app.state.servers[registration.name] = {**registration.model_dump(), "registered_at": time.time()}
        return {}

    @app.get("/servers")
    async def servers() -> list[dict]:
        return [entry for name in app.state.servers for entry in app.state.servers.entries(name)]

    add_nemo_gym_discovery_routes(app)

    @app.get("/servers/{name}", responses={404: {"description": "no server of that name is registered"}})
    async def server(name: str) -> dict:
        if name not in app.state.servers:
            raise HTTPException(404, f"no server named {name!r}")
        replicas = app.state.servers.entries(name)
        return {**replicas[0], "replicas": [{"replica": r["replica"], "url": r["url"]} for r in replicas]}

    return app
