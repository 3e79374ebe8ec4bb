"""`ng_status`: the servers of every live `ng_run` with URL, PID, uptime and health (the command's main,
`nemo_gym.cli.status`, adds the background runs and the run server's)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import psutil
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.serving.head import live_runs, run_token_headers

__all__ = ["StatusOptions", "collect_status", "status_main"]


class StatusOptions(BaseModel):
    """Parameters of `ng_status`."""

    model_config = ConfigDict(extra="forbid")
    json_output: bool = Field(False, alias="json", description="print JSON instead of a table")
    head_server_url: str | None = Field(None, description="head server of the run to show (default: every live run)")


def _uptime_s(pid: int | None) -> float | None:
    try:
        return time.time() - psutil.Process(pid).create_time() if pid else None
    except psutil.Error:
        return None


def _health(http: httpx.Client, url: str | None) -> str:
    if not url:
        return "unregistered"
    try:
        answer = http.get(f"{url}/health")
    except httpx.HTTPError as exc:
        return f"unreachable ({type(exc).__name__})"
    return "ok" if answer.status_code == 200 else f"unhealthy ({answer.status_code})"


def collect_status(head_server_url: str | None = None) -> list[dict[str, Any]]:
    """One dict per live run: `{run_id, head_url, pid, servers: [{name, replica, server_type, implementation, url,
    port, pid, uptime_s, health}]}` (one entry per replica). Addresses come from each run's head server (asked with the
    run's token from
    its 0600 token file); nothing secret is printed."""
    runs = live_runs()
    if head_server_url:
        runs = [r for r in runs if r["head_url"] == head_server_url.rstrip("/")] or [
            {"run_id": "?", "head_url": head_server_url.rstrip("/"), "pid": None, "servers": []}
        ]
    result = []
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        for run in runs:
            try:  # with the run's token, from its 0600 token file: the head server asks for it
                answer = http.get(f"{run['head_url']}/servers", headers=run_token_headers(run["head_url"]))
                registered = answer.raise_for_status().json()
            except (httpx.HTTPError, ValueError):
                registered = run.get("servers", [])
            servers = []
            for entry in registered:
                url = entry.get("url")
                servers.append(
                    {
                        "name": entry["name"],
                        "replica": entry.get("replica", 0),
                        "server_type": entry.get("server_type"),
                        "implementation": entry.get("implementation"),
                        "url": url,
                        "port": httpx.URL(url).port if url else None,
                        "pid": entry.get("pid"),
                        "uptime_s": _uptime_s(entry.get("pid")),
                        "health": _health(http, url),
                    }
                )
            result.append(
                {"run_id": run["run_id"], "head_url": run["head_url"], "pid": run.get("pid"), "servers": servers}
            )
    return result


def status_main(head_server_url: str | None = None, *, as_json: bool = False) -> int:
    """Print the servers' status; exit status 0 when every listed server is healthy, 1 otherwise."""
    runs = collect_status(head_server_url)
    if as_json:
        print(json.dumps(runs, indent=2))
    elif not runs:
        print("No running ng_run found.")
    for run in runs if not as_json else []:
        print(f"Run {run['run_id']}  head {run['head_url']}  ng_run pid {run['pid']}")
        print(f"  {'name':<36} {'type':<22} {'port':>6} {'pid':>8} {'uptime':>9}  health")
        several = {s["name"] for s in run["servers"] if s["replica"]}
        for s in run["servers"]:
            uptime = f"{s['uptime_s']:.0f} s" if s["uptime_s"] is not None else "-"
            name = f"{s['name']}[{s['replica']}]" if s["name"] in several else s["name"]
            print(
                f"  {name:<36} {s['server_type'] or '-':<22} {s['port'] or '-':>6} {s['pid'] or '-':>8} {uptime:>9} "
                f" {s['health']}"
            )
    healthy = all(s["health"] == "ok" for run in runs for s in run["servers"])
    return 0 if healthy else 1
