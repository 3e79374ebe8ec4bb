"""External servers by URL (`url:` in place of code): ng_run starts nothing for them, checks that they answer,
registers them with the head server, and every client reaches them by instance name; the run token goes to
them only when the config says so; one that does not answer stops the start, named.

The external server here is our own example_single_tool_call, served in this test process (real HTTP on
loopback), with a middleware that records the headers of every request it gets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI
from live_servers import serve
from ng_process import weather_agent

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.common.processes import free_port
from nemo_gym.env.testing import NgRun
from nemo_gym.serving.entrypoint import load_server_class

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"


def recording_weather_server() -> tuple[FastAPI, list[dict[str, str]]]:
    """Our example_single_tool_call app (no run token of its own) and the list its requests' headers go to."""
    cls = load_server_class(REPO / "resources_servers" / "example_single_tool_call" / "app.py")
    app = cls({}, name="outside_weather").build_app()
    seen: list[dict[str, str]] = []

    @app.middleware("http")
    async def record(request, call_next):
        seen.append({k.lower(): v for k, v in request.headers.items()})
        return await call_next(request)

    return app, seen


def config(tmp_path: Path, url: str | list[str], **fields: object) -> Path:
    composition = {
        "weather": {"resources_servers": {"example_single_tool_call": {"url": url, **fields}}},
        "weather_agent": weather_agent(),
        "policy_model": {
            "responses_api_models": {"scripted_model": {"entrypoint": "app.py", "default_reply": "It is cold."}}
        },
    }
    path = tmp_path / "external.yaml"
    path.write_text(yaml.safe_dump(composition))
    return path


def collect(tmp_path: Path, head_url: str) -> list[dict]:
    out = tmp_path / "rollouts.jsonl"
    command = [
        str(Path(sys.executable).parent / "ng_collect_rollouts"),
        "+agent_name=weather_agent",
        f"+input_jsonl_fpath={ROWS}",
        f"+output_jsonl_fpath={out}",
        "+limit=2",
        f"+head_server_url={head_url}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return read_jsonl(out)


@pytest.mark.long
@pytest.mark.parametrize("send_run_token", [False, True])
def test_an_external_server_is_reached_by_name_and_gets_no_token_unless_told(tmp_path, send_run_token):
    app, seen = recording_weather_server()
    with serve(app) as url, NgRun(f"+config_paths=[{config(tmp_path, url, send_run_token=send_run_token)}]") as run:
        head_url = run.wait_ready()
        assert "weather" in run.output() and "(url:)" in run.output()
        rows = collect(tmp_path, head_url)
        assert [r["reward"] for r in rows] == [1.0, 1.0]  # the scripted model calls get_weather, then answers
        token = run.headers["X-NG-Run-Token"]
        calls = [h for h in seen if h.get("content-type") == "application/json"]
        assert calls, "the agent never called the external server"
        carried = [
            h
            for h in calls
            if h.get("x-ng-run-token") == token or token in h.get("authorization", "") or token in h.get("cookie", "")
        ]
        assert len(carried) == (len(calls) if send_run_token else 0)
        assert all(token not in json.dumps(h) for h in seen) or send_run_token
        registered = {s["name"]: s for s in httpx.get(f"{head_url}/servers", headers=run.headers, timeout=10).json()}
        assert registered["weather"]["external"] is True and registered["weather"]["url"] == url


@pytest.mark.long
def test_ng_eval_reaches_an_external_server_by_name(tmp_path):
    app, seen = recording_weather_server()
    with serve(app) as url, NgRun(f"+config_paths=[{config(tmp_path, url)}]") as run:
        head_url = run.wait_ready()
        report = tmp_path / "eval.json"
        command = [
            str(Path(sys.executable).parent / "ng_eval"),
            "+agent_name=weather_agent",
            f"+input_jsonl_fpath={ROWS}",
            "+num_samples=2",
            "+k=[1,2]",
            "+max_samples=2",
            f"+output_json_fpath={report}",
            f"+head_server_url={head_url}",
            "+progress=false",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        overall = json.loads(report.read_text())["overall"]
        assert overall["pass@1"] == 1.0 and overall["num_tasks"] == 2
        assert any(h.get("content-type") == "application/json" for h in seen)


@pytest.mark.long
def test_replica_urls_are_replicas(tmp_path):
    """A list of URLs: one replica each; the collector's rollouts spread over them, each rollout on one replica."""
    (app_a, _), (app_b, _) = recording_weather_server(), recording_weather_server()
    with (
        serve(app_a) as url_a,
        serve(app_b) as url_b,
        NgRun(f"+config_paths=[{config(tmp_path, [url_a, url_b])}]") as run,
    ):
        head_url = run.wait_ready()
        servers = [
            s
            for s in httpx.get(f"{head_url}/servers", headers=run.headers, timeout=10).json()
            if s["name"] == "weather"
        ]
        assert sorted((s["replica"], s["url"]) for s in servers) == [(0, url_a), (1, url_b)]
        assert all(r["reward"] == 1.0 for r in collect(tmp_path, head_url))


@pytest.mark.long
def test_an_external_server_that_does_not_answer_stops_the_start_by_name(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    with NgRun(f"+config_paths=[{config(tmp_path, down)}]", "+external_wait_s=2") as run:
        run.process.wait(120)
        assert run.process.returncode == 1
        out = run.output()
        assert f"external server 'weather' at {down} did not answer /health or / with 200" in out
        assert "key 'weather.resources_servers.example_single_tool_call.url'" in out
        assert "servers ready" not in out


@pytest.mark.long
def test_an_external_health_path_is_used(tmp_path):
    """`health_path`: the route ng_run checks (here a route the server does not have: 404 is not an answer)."""
    app, _ = recording_weather_server()
    with (
        serve(app) as url,
        NgRun(f"+config_paths=[{config(tmp_path, url, health_path='/nope')}]", "+external_wait_s=2") as run,
    ):
        run.process.wait(120)
        assert "did not answer /nope with 200" in run.output() and "last: GET /nope answered 404" in run.output()


@pytest.mark.long
@pytest.mark.parametrize("bad", ["127.0.0.1:8000", ["http://ok:1", 3], []])
def test_a_bad_url_is_a_config_error_naming_the_key(tmp_path, bad):
    with NgRun(f"+config_paths=[{config(tmp_path, bad)}]") as run:
        run.process.wait(60)
        assert run.process.returncode != 0
        assert "weather.resources_servers.example_single_tool_call.url" in run.output()
