"""`ng_serve`: a team's run server (`nemo_gym.team.server`), or an admin action on its database.

  ng_serve [+ray_address=HOST:PORT] [+host=127.0.0.1] [+port=8280] [+data_dir=...]   serve (until Ctrl-C)
  ng_serve +admin=create_org +org=ORG            ng_serve +admin=create_user +user=NAME +org=ORG
  ng_serve +admin=add_member +user=NAME +org=ORG ng_serve +admin=create_token +user=NAME [+expires_in_days=30]
  ng_serve +admin=revoke_token +token_id=ID      ng_serve +admin=list

Storage: `<data_dir>/` (default `$NEMO_GYM_HOME/serve`, 0700) holds the database, the local head's Ray token and the
organizations' uploads and models (see `nemo_gym.team.server`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.serving.entrypoint import bind_socket
from nemo_gym.serving.limits import UVICORN_LIMITS
from nemo_gym.team.backend import RayBackend
from nemo_gym.team.server import build_app, private_dir
from nemo_gym.team.store import Store

__all__ = ["ServeOptions", "serve_main", "admin_main"]

DEFAULT_PORT = 8280


class ServeOptions(BaseModel):
    """Parameters of `ng_serve` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=False)
    admin: Literal["create_org", "create_user", "add_member", "create_token", "revoke_token", "list"] | None = Field(
        None, description="an admin action on the server's database instead of serving (the server may be running)"
    )
    org: str | None = Field(None, description="admin: the organization")
    user: str | None = Field(None, description="admin: the user")
    expires_in_days: float | None = Field(None, gt=0, description="create_token: lifetime in days (default: no expiry)")
    token_id: str | None = Field(None, description="revoke_token: the token's id (from +admin=list)")
    data_dir: str | None = Field(None, description="database, Ray token and storage (default: $NEMO_GYM_HOME/serve)")
    host: str = Field(
        "127.0.0.1", description="address to bind; anything but loopback exposes the API (use a TLS proxy)"
    )
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="port to bind (0: a free one, printed at start)")
    ray_address: str | None = Field(
        None,
        description=(
            "an existing Ray cluster's GCS address HOST:PORT (default: start a local head, its job API on 127.0.0.1)"
        ),
    )
    dashboard_port: int = Field(
        0, ge=0, le=65535, description="local head: port of Ray's dashboard / job API on 127.0.0.1 (0: a free one)"
    )
    num_cpus: int | None = Field(None, ge=0, description="local head: CPUs offered to runs (default: all)")
    python: str = Field(
        sys.executable, description="the Python that runs a run's entrypoint on the nodes (nemo_gym installed there)"
    )
    entrypoint_num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves for each run")
    stop_wait_s: int = Field(600, gt=0, description="seconds a stopped run gets to save its model before Ray kills it")
    harvest_interval_s: float = Field(
        10.0,
        ge=0,
        description="how often ended training runs' final/ models are copied into storage (0: only on download)",
    )
    max_upload_mb: float = Field(
        500.0, gt=0, description="largest project upload, compressed and unpacked (Ray's working_dir limit is 500 MiB)"
    )


def data_dir_of(options: ServeOptions) -> Path:
    path = Path(options.data_dir).expanduser() if options.data_dir else nemo_gym_home() / "serve"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def admin_main(options: ServeOptions) -> int:
    """`ng_serve +admin=...`: change or show the database; a new token is printed once, here.

    Raises:
        ConfigError: a missing parameter, a bad name, an unknown user, organization or token id.
    """
    store = Store(data_dir_of(options) / "serve.db")

    def need(name: str) -> str:
        value = getattr(options, name)
        if not value:
            raise ConfigError(f"ng_serve +admin={options.admin} needs +{name}=...")
        return value

    if options.admin == "create_org":
        store.create_org(need("org"))
        print(f"organization {options.org} created")
    elif options.admin == "create_user":
        store.create_user(need("user"), [need("org")])
        print(
            f"user {options.user} created, member of {options.org}; give them a token: ng_serve +admin=create_token"
            f" +user={options.user}"
        )
    elif options.admin == "add_member":
        store.add_member(need("user"), need("org"))
        print(f"user {options.user} is a member of {options.org}")
    elif options.admin == "create_token":
        lifetime_s = options.expires_in_days * 86400.0 if options.expires_in_days else None
        token, facts = store.create_token(need("user"), lifetime_s)
        expiry = (
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(facts.expires_at)) if facts.expires_at else "never"
        )
        print(
            f"token {facts.id} for {facts.user_id} (expires: {expiry}); shown this once, it is stored hashed:",
            file=sys.stderr,
        )
        print(token)
    elif options.admin == "revoke_token":
        store.revoke_token(need("token_id"))
        print(f"token {options.token_id} revoked")
    else:
        import json

        print(json.dumps(store.describe(), indent=2))
    return 0


def serve_main(options: ServeOptions) -> int:
    """`ng_serve`: start (or connect to) Ray, then serve the API until Ctrl-C or SIGTERM. Returns the exit status.

    Raises:
        ConfigError: the port is taken, Ray cannot be started or reached.
    """
    if options.admin:
        return admin_main(options)
    import uvicorn

    data_dir = data_dir_of(options)
    store = Store(data_dir / "serve.db")
    sock = bind_socket(options.host, options.port, "ng_serve")
    backend = RayBackend(
        data_dir,
        ray_address=options.ray_address,
        dashboard_port=options.dashboard_port,
        num_cpus=options.num_cpus,
        python=options.python,
        entrypoint_num_cpus=options.entrypoint_num_cpus,
        stop_wait_s=options.stop_wait_s,
    )
    try:
        backend.start()
        app = build_app(
            store,
            backend,
            private_dir(data_dir / "orgs"),
            max_upload_bytes=int(options.max_upload_mb * 2**20),
            harvest_interval_s=options.harvest_interval_s,
        )
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        print(
            f"ng_serve: listening on {url} (Ray Jobs at {backend.dashboard_url}, token auth"
            f" {os.environ.get('RAY_AUTH_MODE', 'as the cluster has it')}; data in {data_dir})",
            flush=True,
        )
        if host not in ("127.0.0.1", "::1", "localhost"):
            print(
                f"ng_serve: WARNING: {host} is reachable from other machines and this server speaks plain HTTP: put a"
                " TLS proxy in front so tokens do not cross the network in clear",
                file=sys.stderr,
                flush=True,
            )
        config = uvicorn.Config(
            app, log_level=os.environ.get("NEMO_GYM_LOG_LEVEL", "warning"), timeout_keep_alive=60, **UVICORN_LIMITS
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        backend.shutdown()
    return 0
