"""The run commands when they talk to the run server (`ng_serve`), over `nemo_gym.team.client`:

  ng_runs list|logs|stop|delete|download   with the server when logged in (or +remote=true); +local=true: this machine
  ng_train +remote=true ...                submit the current folder (the project) as a training run
  ng_status                                its section: the login, the active organization and its active runs
  ng_models                                the organization's stored models (`list_server_models`)

Which runs `ng_runs` shows: the server's when logged in, unless `+local=true`; `+remote=true` insists on the server
(an error when not logged in). `ng_train` trains locally unless `+remote=true`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import parse_overrides
from nemo_gym.team.client import TERMINAL, ServerLogin, TeamClient, TeamServerError, current_login, require_login

__all__ = ["wants_remote", "remote_runs_main", "submit_remote", "list_server_models", "print_team_status"]


def wants_remote(remote: bool | None, local: bool) -> bool:
    """Whether `ng_runs` talks to the run server: +remote=true yes, +local=true no, else when logged in.

    Raises:
        ConfigError: both flags, or +remote=true while not logged in.
    """
    if remote and local:
        raise ConfigError("+remote=true and +local=true contradict each other; give one")
    if local or remote is False:
        return False
    if remote:
        require_login()
        return True
    return current_login() is not None


def _print_runs(runs: list[dict[str, Any]], indent: str = "") -> None:
    print(f"{indent}{'id':<32} {'user':<12} {'status':<9} {'started':<20} model")
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.get("started_at") or run["created"]))
        model = (
            "stored"
            if run.get("model_stored")
            else ("saving" if run.get("save_model") and run["status"] not in TERMINAL else "-")
        )
        print(f"{indent}{run['id']:<32} {run['user']:<12} {run['status']:<9} {started:<20} {model}")


def remote_runs_main(options: Any) -> int:
    """`ng_runs <verb>` against the run server (options: nemo_gym.runs.command.RunsOptions).

    Raises:
        ConfigError: a verb without its run id or +output. TeamServerError: the server refused or failed.
    """
    login = require_login()
    client = TeamClient(login)
    if options.verb == "list":
        runs = client.runs()
        if options.json_output:
            import json

            print(json.dumps(runs, indent=2))
        elif not runs:
            print(f"No runs in organization {login.org} on {login.url} (submit one: ng_train +remote=true ...).")
        else:
            print(f"Runs of organization {login.org} on {login.url}:")
            _print_runs(runs)
        return 0
    if not options.id:
        raise ConfigError(
            f"ng_runs {options.verb} needs a run id: ng_runs {options.verb} <id> (ng_runs list shows them)"
        )
    if options.verb == "logs":
        for chunk in client.logs(options.id, options.follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        if options.follow:
            print(f"ng_runs: run {options.id} {client.run(options.id)['status']}", file=sys.stderr)
        return 0
    if options.verb == "stop":
        return _remote_stop(client, options)
    if options.verb == "delete":
        client.delete(options.id, options.force)
        print(f"ng_runs: deleted run {options.id} on {login.url}")
        return 0
    if not options.output:
        raise ConfigError(f"ng_runs download needs +output=DIR: ng_runs download {options.id} +output=DIR")
    path = client.download_model(options.id, Path(options.output))
    print(f"ng_runs: model of run {options.id} in {path}")
    return 0


def _remote_stop(client: TeamClient, options: Any) -> int:
    run = client.stop(options.id, options.save_model)
    if run["status"] in TERMINAL and not run["stop_requested"]:  # it had ended before: nothing was stopped
        print(f"ng_runs: run {options.id} is not running ({run['status']})")
        return 0
    print(
        f"ng_runs: stop sent to run {options.id}{' (saving its model first)' if options.save_model else ''}; waiting up"
        f" to {options.timeout_s:g} s",
        file=sys.stderr,
    )
    deadline = time.monotonic() + options.timeout_s
    while run["status"] not in TERMINAL:
        if time.monotonic() > deadline:
            print(
                f"ng_runs: run {options.id} is still stopping (ng_runs list shows when it has ended)", file=sys.stderr
            )
            return 1
        time.sleep(1.0)
        run = client.run(options.id)
    hint = f"; download its model: ng_runs download {options.id} +output=DIR" if options.save_model else ""
    print(f"ng_runs: run {options.id} {run['status']}{hint}")
    return 0


def submit_remote(kind: str, argv: list[str], project_dir: Path | None = None) -> int:
    """`ng_train +remote=true ...`: submit the current folder with these arguments; prints the run id.

    Config paths in `argv` must lie inside the folder (the run starts in its uploaded copy).

    Raises:
        ConfigError: not logged in, or a config path outside the folder. TeamServerError: the server refused.
    """
    login = require_login()
    project_dir = (project_dir or Path.cwd()).resolve()
    for path in _config_paths(argv):
        resolved = (project_dir / path).resolve()
        if not resolved.is_relative_to(project_dir) or not resolved.is_file():
            raise ConfigError(
                f"+config_paths entry {path!r} must be a file inside the project folder {project_dir} (it is uploaded"
                " as the run's working directory)"
            )
    run = TeamClient(login).submit(kind, argv, project_dir)
    print(run["id"])
    print(
        f"ng_{'train' if kind == 'train' else 'collect_rollouts'}: run {run['id']} submitted to {login.url}"
        f" (organization {login.org}); status {run['status']}",
        file=sys.stderr,
    )
    print(
        f"  follow: ng_runs logs {run['id']} +follow=true    stop: ng_runs stop {run['id']} [+save_model=true]",
        file=sys.stderr,
    )
    return 0


def _config_paths(argv: list[str]) -> list[str]:
    paths: list[str] = []
    for key, value in parse_overrides(argv):
        if key == "config_paths":
            paths += [str(v) for v in (value if isinstance(value, list) else [value])]
    return paths


def list_server_models(login: ServerLogin | None = None) -> list[dict[str, Any]]:
    """The models stored on the run server for the active organization (each a run's final/ folder): `[{name,
    run_id, size_bytes (the tar), modified (unix s), server, org, note}]`; [] when not logged in.

    Raises:
        TeamServerError: the server is unreachable or refused the token.
    """
    login = login or current_login()
    if login is None or not login.org:
        return []
    return [
        {
            "name": m["run_id"],
            "run_id": m["run_id"],
            "size_bytes": m["size_bytes"],
            "modified": m["stored_at"],
            "server": login.url,
            "org": login.org,
            "note": f"ng_runs download {m['run_id']} +output=DIR",
        }
        for m in TeamClient(login, timeout_s=10.0).models()
    ]


def print_team_status() -> None:
    """The `ng_status` section: who is logged in where, the active organization and its active runs."""
    login = current_login()
    if login is None:
        return
    print(f"Run server {login.url}: logged in as {login.user}, organization {login.org or '-'}")
    try:
        runs = TeamClient(login, timeout_s=10.0).runs() if login.org else []
    except TeamServerError as exc:
        print(f"  {exc}")
        return
    active = [r for r in runs if r["status"] not in TERMINAL]
    print(f"  runs: {len(active)} active, {len(runs) - len(active)} ended (ng_runs list shows all)")
    if active:
        _print_runs(active, indent="  ")
