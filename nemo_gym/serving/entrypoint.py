"""Entry point of one server process: `python -m nemo_gym.serving.entrypoint` (started by `ng_run`).

Reads its instance from the run's config (`$NEMO_GYM_RUN_DIR/instances.json`, `$NEMO_GYM_INSTANCE`), imports the
implementation's entrypoint, validates the instance's fields against the server class's `Config`, binds its
own socket (port 0 = a free port chosen by the OS, so there is no race between choosing and binding),
registers its address and replica index (`$NEMO_GYM_REPLICA`, default 0) with the head server and serves with
uvicorn. The run's token (`$NEMO_GYM_RUN_TOKEN`) is taken out of the environment first (so the processes the
server starts do not inherit it): every route but `/health` then requires it, and the server's client sends it.
Exit codes: 2 config error, 3 bind error. Logging: `$NEMO_GYM_LOG_LEVEL` (default warning); `$NEMO_GYM_ACCESS_LOG=1`
adds a line per request (method, path, status; the default level is then info), e.g. to see how calls spread
over replicas.

`python -m nemo_gym.serving.entrypoint --prefetch` (`ng_prefetch`) serves nothing: it reads one instance's spec (JSON)
from stdin, builds the server and runs its `prefetch` hook, printing what it prepared.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import sys
from pathlib import Path
from types import ModuleType

import uvicorn
import uvloop
from pydantic import ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import did_you_mean
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.serving.auth import take_run_token_from_env
from nemo_gym.serving.client import HEAD_URL_ENV, ServerClient
from nemo_gym.serving.limits import UVICORN_LIMITS
from nemo_gym.serving.module_loading import import_file
from nemo_gym.serving.nemo_gym_discovery import registration_links
from nemo_gym.serving.server import BaseServer

__all__ = ["REPLICA_ENV", "load_server_class", "build_server", "bind_socket", "main", "prefetch_main"]

REPLICA_ENV = "NEMO_GYM_REPLICA"  # this process's replica index among the instance's `num_replicas`
ACCESS_LOG_ENV = "NEMO_GYM_ACCESS_LOG"  # "1": log every request (no headers, so no token or session id)

_BASES = {"resources_servers", "responses_api_agents", "responses_api_models"}


def load_module(path: Path) -> ModuleType:
    """A server's entrypoint file imported by `nemo_gym.serving.module_loading.import_file`: a submodule of its folder's
    package (so its files import each other relatively), the same module object for every importer.

    Raises:
        ConfigError: `path` is not a Python file.
    """
    if Path(path).suffix != ".py" or not Path(path).is_file():
        raise ConfigError(f"cannot import {path}: not a Python file")
    return import_file(path)


def load_server_class(path: Path) -> type[BaseServer]:
    """The one `BaseServer` subclass defined in the file at `path`.

    Raises:
        ConfigError: none or several server classes are defined there.
    """
    module = load_module(path)
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseServer) and obj.__module__ == module.__name__
    ]
    if len(classes) != 1:
        names = ", ".join(c.__name__ for c in classes) or "none"
        raise ConfigError(
            f"{path}: expected exactly one server class (a subclass of ResourcesServer, AgentServer or ModelServer),"
            f" found {names}"
        )
    return classes[0]


def build_server(instance: ServerInstance, client: ServerClient | None = None) -> BaseServer:
    """Instantiate the server of `instance` with its validated config.

    Raises:
        ConfigError: a field the server does not accept (with a suggestion) or a bad value, naming the YAML key.
    """
    cls = load_server_class(instance.entrypoint_path)
    prefix = f"{instance.name}.{instance.server_type}.{instance.implementation}"
    try:
        config = cls.Config.model_validate(instance.fields)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"])
            if error["type"] == "extra_forbidden":
                hint = did_you_mean(str(error["loc"][-1]), cls.Config.model_fields)
                problems.append(
                    f"key '{prefix}.{key}' is not a field of {cls.__name__}{hint}; fields:"
                    f" {', '.join(cls.Config.model_fields)}"
                )
            else:
                problems.append(f"key '{prefix}.{key}': {error['msg']} (got {error.get('input')!r})")
        raise ConfigError(f"{instance.source}: " + "; ".join(problems)) from exc
    return cls(config, name=instance.name, client=client)


def bind_socket(host: str, port: int, server_name: str) -> socket.socket:
    """A listening TCP socket. Raises ConfigError naming the server when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"server {server_name!r} cannot bind {host}:{port}: {exc.strerror}. Another process uses that port: choose"
            f" another with +{server_name}.<type>.<impl>.port=<port>, or 0 for a free one."
        ) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def _serve(
    server: BaseServer,
    sock: socket.socket,
    instance: ServerInstance,
    head_url: str | None,
    run_token: str | None,
    replica: int,
) -> None:
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    access_log = (
        os.environ.get(ACCESS_LOG_ENV) == "1"
    )  # one line per request in the server's log (method, path, status)
    log_level = os.environ.get("NEMO_GYM_LOG_LEVEL", "info" if access_log else "warning")
    config = uvicorn.Config(
        server.build_app(run_token=run_token),
        log_level=log_level,
        access_log=access_log,
        timeout_keep_alive=60,
        **UVICORN_LIMITS,
    )
    web = uvicorn.Server(config)
    serving = asyncio.create_task(web.serve(sockets=[sock]))
    while not web.started and not serving.done():
        await asyncio.sleep(0.02)
    if serving.done():
        await serving
        return
    print(f"server {instance.name} (replica {replica}) listening on {url}", flush=True)
    if head_url:
        registration = {
            "name": instance.name,
            "server_type": instance.server_type,
            "implementation": instance.implementation,
            "url": url,
            "pid": os.getpid(),
            "replica": replica,
            **registration_links(instance.fields),
            **server.registration_extras(),
        }
        async with ServerClient(head_url, run_token=run_token) as head:
            await head.request_json("POST", f"{head_url}/register", json=registration, server="head")
    await serving


def prefetch_main() -> None:
    """`--prefetch`: the `prefetch` hook of the server whose instance spec is on stdin (exit 2: a config error)."""
    instance = ServerInstance(**json.loads(sys.stdin.read()))
    try:
        for line in build_server(instance).prefetch():
            print(line, flush=True)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def main() -> None:
    if sys.argv[1:] == ["--prefetch"]:
        prefetch_main()
        return
    run_token = take_run_token_from_env()
    run_dir = Path(os.environ["NEMO_GYM_RUN_DIR"])
    name = os.environ["NEMO_GYM_INSTANCE"]
    head_url = os.environ.get(HEAD_URL_ENV)
    spec = json.loads((run_dir / "instances.json").read_text())[name]
    instance = ServerInstance(**spec)
    try:
        server = build_server(instance, ServerClient(head_url, run_token=run_token))
        sock = bind_socket(str(server.config.host), int(server.config.port), name)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2 if "cannot bind" not in str(exc) else 3)
    # uvloop: libuv's event loop, less CPU per request than asyncio's own (uvicorn would pick it when it made the loop)
    uvloop.run(_serve(server, sock, instance, head_url, run_token, int(os.environ.get(REPLICA_ENV, "0"))))


if __name__ == "__main__":
    main()
