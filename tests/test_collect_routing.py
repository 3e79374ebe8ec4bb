"""Collection through NeMo Gym 0.7.0 environment servers (`nemo_gym.collect.routing`), against a real head server and
real HTTP on loopback: a row for an environment server in front of one agent is sent to it as NeMo Gym 0.7.0's
collector sends it (`agent_ref` the agent, `_ng_environment_server` the server); an answer with NeMo Gym's
failure-routing keys (an environment server's failed episode, a verify whose judge failed) is a failure of that class
with its message, never a reward. NeMo Gym 0.7.0's `task_source` rows go to the agent 0.7.0 resolves, a dataset's
`agent:` pin included (against 0.7.0's own resolution: `test_task_source_rows_resolve_as_0_7_0_resolves_them`); its
materialized tasks go to their taskset's environment server (`environment_server_routes`) as episodes, as 0.7.0's
collector sends them (`test_episodes_are_what_0_7_0_sends_and_stores`)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI
from nemo_gym_peer07 import peer07_json
from pydantic import ValidationError
from test_collect import FAST, Served, write_input

from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.collect.routing import episode_request, episode_rollout, resolve_task_sources
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import parse_overrides
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import Registration, build_head_app
from nemo_gym.serving.nemo_gym_discovery import nemo_gym_head_servers


def environment_server(agent: str, fail: bool, judge_fails: bool = False) -> FastAPI:
    """A stand-in for 0.7.0's single_agent_turn_legacy `/run`: refuses a row naming another agent (as it does), and
    answers a reward, its failure-routing keys, or (`judge_fails`) what a verify wrapped in 0.7.0's judge_failsafe
    answers when its judge fails."""
    app = FastAPI()

    @app.post("/run")
    async def run(row: dict[str, Any]) -> dict[str, Any]:
        if row["agent_ref"]["name"] != agent:
            raise ValueError(f"Row agent_ref {row['agent_ref']['name']!r} does not match configured agent server")
        if fail:
            return {
                "_ng_failure_class": "environment_server_failed",
                "_ng_failure_terminal": True,
                "_ng_failure_message": "500, message='Internal Server Error'",
                "_ng_failure_stage": "agent",
                "agent_ref": {"name": agent},
            }
        if judge_fails and row["x"] == 1:  # nemo_gym.judge.judge_failsafe's answer (0.7.0)
            return {
                **row,
                "reward": 0.0,
                "mask_sample": True,
                "failure_kind": "judge_failed",
                "failure_reason": "JudgeError: criterion 1 unparseable after 2 attempts",
                "_ng_failure_class": "judge_failed",
                "_ng_failure_judge_error": "JudgeError: criterion 1 unparseable after 2 attempts",
            }
        return {"reward": float(row["x"]), "agent_ref": {"name": agent}}

    return app


def episode_server() -> FastAPI:
    """A stand-in for a 0.7.0 environment server's `/run` of an episode (`BaseEpisodeRequest` in,
    `BaseEpisodeResponse` out): reward `x` of the task input, a terminal failure for `x == 1` (its first two attempts
    only); the episode id it got in `seen_rollout_id` and `seen_attempt`. Refuses a body that is no episode request
    (a legacy row), as a typed server does. The failure is terminal when the task input says `terminal`."""
    app = FastAPI()

    @app.post("/run")
    async def run(body: dict[str, Any]) -> dict[str, Any]:
        if set(body) != {"episode_id", "task"} or set(body["task"]) != {"task_id", "task_input"}:
            raise ValueError(f"not an episode request: {sorted(body)}")
        episode, task = body["episode_id"], body["task"]
        if task["task_input"]["x"] == 1 and episode["attempt"] < 2:
            terminal = task["task_input"].get("terminal", False)
            failure = {"failure_reason": "the user simulator gave up", "terminal": terminal, "stage": "agent"}
            return {"episode_id": episode, "task_id": task["task_id"], "failure": failure}
        result = {"reward": float(task["task_input"]["x"]), "seen_rollout_id": episode["rollout_id"]}
        result["seen_attempt"] = episode["attempt"]
        return {"episode_id": episode, "task_id": task["task_id"], "result": result}

    return app


@pytest.fixture(scope="module")
def head():
    app = build_head_app()
    served = {"head": Served(app), "env": Served(environment_server("agent", False))}
    served["env_failing"] = Served(environment_server("agent", True))
    served["env_judged"] = Served(environment_server("agent", False, judge_fails=True))
    served["env_episodes"] = Served(episode_server())
    for name in ("env", "env_failing", "env_judged", "env_episodes"):
        app.state.servers[name] = {  # as ng_run registers a NeMo Gym environment server (launch.register)
            "name": name,
            "server_type": "environment_servers",
            "implementation": "single_agent_turn_legacy",
            "url": served[name].url,
            "pid": os.getpid(),
            "replica": 0,
            "agent_refs": {"agent_server": {"type": "responses_api_agents", "name": "agent"}},
        }
    app.state.servers["agent"] = {
        **app.state.servers["env"],
        "name": "agent",
        "server_type": "responses_api_agents",
        "references": {"resources_server": {"type": "resources_servers", "name": "rs"}},
    }
    # resources servers as their instances register (names only matter here): `rs` named by `agent` alone, `rs2` by
    # two agents
    for name, server_type in (("rs", "resources_servers"), ("rs2", "resources_servers")):
        app.state.servers[name] = {**app.state.servers["env"], "name": name, "server_type": server_type}
    for name in ("agent2", "agent3"):
        app.state.servers[name] = {
            **app.state.servers["agent"],
            "name": name,
            "references": {"resources_server": {"type": "resources_servers", "name": "rs2"}},
        }
    # a dataset's `agent:` pin (NeMo Gym 0.7.0): `rs_pinned` is named by `agent` and `agent4`, its datasets pin
    # `agent`; `rs_two_pins`' datasets pin two agents; `agent_pinned`'s datasets pin another agent than itself
    pinned = {"rs_pinned": ["agent"], "rs_two_pins": ["agent", "agent4"], "agent_pinned": ["agent"]}
    for name, pins in pinned.items():
        kind = "responses_api_agents" if name.startswith("agent") else "resources_servers"
        app.state.servers[name] = Registration(
            **{**app.state.servers["rs"], "name": name, "server_type": kind, "dataset_agent_pins": pins}
        ).model_dump()
    for name, named in (("agent", "rs_pinned"), ("agent4", "rs_pinned"), ("agent4", "rs_two_pins")):
        entry = app.state.servers.get(name) or {**app.state.servers["agent2"], "name": name, "references": {}}
        ref = {"type": "resources_servers", "name": named}
        app.state.servers[name] = {**entry, "references": {**entry["references"], f"{named}_server": ref}}
    yield served["head"].url
    for server in served.values():
        server.stop()


def run_collection(head: str, cfg: CollectConfig):
    """`collect_rollouts` of `cfg` against the head server at `head`; its summary."""

    async def run():
        async with ServerClient(head, timeouts=FAST) as client:
            return await collect_rollouts(cfg, client)

    return asyncio.run(run())


def collect(head: str, tmp_path: Path, agent_name: str | None, agent_map: dict[str, str] | None = None, **row: Any):
    cfg = CollectConfig(
        agent_name=agent_name,
        agent_map=agent_map,
        input_jsonl_fpath=str(write_input(tmp_path / "in.jsonl", 3, **row)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        progress=False,
    )

    return run_collection(head, cfg), tmp_path / "out.jsonl"


def test_rows_for_an_environment_server_name_its_agent(head, tmp_path):
    summary, out = collect(head, tmp_path, "env")
    rows = read_jsonl(out)
    assert summary.rollouts_missing == 0 and sorted(r["reward"] for r in rows) == [0.0, 1.0, 2.0]
    assert {(r["agent_ref"]["name"], r["_ng_environment_server"]) for r in rows} == {("agent", "env")}
    materialized = read_jsonl(tmp_path / "out_materialized_inputs.jsonl")
    assert {r["agent_ref"]["name"] for r in materialized} == {"agent"}


def test_a_failed_episode_is_a_failure_with_its_class_and_message(head, tmp_path):
    summary, out = collect(head, tmp_path, "env_failing")
    assert summary.failures_by_class == {"environment_server_failed": 3} and not read_jsonl(out)
    (failure, *_) = read_jsonl(tmp_path / "out_failures.jsonl")
    assert failure["failure_class"] == "environment_server_failed" and failure["transient"] is False
    assert failure["message"] == "NeMo Gym failure (agent stage): 500, message='Internal Server Error'"


def test_a_failed_judge_is_a_failure_not_a_reward_of_zero(head, tmp_path):
    """0.7.0's judge_failsafe answer (reward 0.0, mask_sample, `_ng_failure_class: judge_failed`) goes to the failures
    file with its class and the judge's error, as 0.7.0's collector routes it; the other rows are rollouts."""
    summary, out = collect(head, tmp_path, "env_judged")
    assert summary.failures_by_class == {"judge_failed": 1}
    assert sorted(r["reward"] for r in read_jsonl(out)) == [0.0, 2.0]  # rows 0 and 2; row 1's judge failed
    (failure,) = read_jsonl(tmp_path / "out_failures.jsonl")
    assert (failure["_ng_task_index"], failure["failure_class"], failure["transient"]) == (1, "judge_failed", True)
    assert failure["message"] == "NeMo Gym failure: JudgeError: criterion 1 unparseable after 2 attempts"


def test_a_collection_through_an_environment_server_resumes(head, tmp_path):
    """The rerun of the same command finds the same input: the state file's fingerprint is of the rows as read, not as
    routed (rows routed to the agent behind `env` once made every rerun refuse to resume)."""
    first, out = collect(head, tmp_path, "env")
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:1]))  # as if interrupted after one rollout
    again, _ = collect(head, tmp_path, "env")
    assert (first.rollouts_done, again.rollouts_resumed, again.rollouts_this_run, again.rollouts_done) == (3, 1, 2, 3)


@pytest.mark.parametrize("source", ["rs", "agent"])
def test_task_source_rows_go_to_the_agent_it_resolves_to(head, tmp_path, source):
    """NeMo Gym 0.7.0's collated rows name the instance that declared their dataset (`task_source`), not an agent: a
    resources server resolves to the one agent whose config names it, an agent to itself."""
    summary, out = collect(head, tmp_path, None, task_source=source)
    rows = read_jsonl(out)
    assert summary.rollouts_done == 3 and {(r["agent_ref"]["name"], r["task_source"]) for r in rows} == {
        ("agent", source)
    }


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("rs2", r"task_source 'rs2' resolves to no single agent \(the agents whose config names it: agent2, agent3\)"),
        ("nope", r"task_source 'nope' resolves to no single agent \(no server instance of that name runs"),
        (
            "env",
            r"task_source 'env' resolves to no single agent \(it names a server of type environment_servers",
        ),
    ],
)
def test_a_task_source_without_one_agent_is_refused_before_any_rollout(head, tmp_path, source, why):
    with pytest.raises(DataError, match=r"in\.jsonl:1: " + why):
        collect(head, tmp_path, None, task_source=source)
    assert not (tmp_path / "out.jsonl").exists()
    summary, _ = collect(head, tmp_path, "agent", task_source=source)  # +agent_name says which
    assert summary.rollouts_done == 3


def test_a_datasets_agent_pin_picks_the_agent(head, tmp_path):
    """`rs_pinned` is named by two agents; its datasets' `agent:` pin (0.7.0's `BenchmarkDatasetConfig.agent`)
    says which runs its rows, as 0.7.0's collector resolves it."""
    summary, out = collect(head, tmp_path, None, task_source="rs_pinned")
    assert summary.rollouts_done == 3 and {r["agent_ref"]["name"] for r in read_jsonl(out)} == {"agent"}


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("rs_two_pins", r"its datasets pin several agents \(agent, agent4\), which task_source alone cannot tell"),
        ("agent_pinned", r"its datasets pin agent 'agent', but the agent agent_pinned runs its rows itself"),
    ],
)
def test_a_pin_that_does_not_resolve_is_refused_before_any_rollout(head, tmp_path, source, why):
    """Pins 0.7.0 refuses are refused, naming the row, before any rollout; `+agent_map={<task_source>: <agent>}`
    (0.7.0's way out) says which agent, as does `+agent_name`."""
    with pytest.raises(DataError, match=r"in\.jsonl:1: task_source '\w+' resolves to no single agent \(" + why):
        collect(head, tmp_path, None, task_source=source)
    assert not (tmp_path / "out.jsonl").exists()
    summary, out = collect(head, tmp_path, None, agent_map={source: "agent"}, task_source=source)
    assert summary.rollouts_done == 3 and {r["agent_ref"]["name"] for r in read_jsonl(out)} == {"agent"}


TASKSET = "nemo_user_sim:example"  # 0.7.0's nemo_user_sim config routes this taskset (environment_server_routes)


def write_tasks(path: Path, n: int, terminal: bool = False) -> Path:
    """`n` NeMo Gym 0.7.0 materialized tasks, as its ng_prepare_data writes a dataset declared with `taskset:`
    (task `i` with `x = i`; task 1's failure terminal if asked)."""
    rows = [{"task_id": {"taskset": TASKSET, "task_id": str(i)}, "task_input": {"x": i}} for i in range(n)]
    if terminal:
        rows[1]["task_input"]["terminal"] = True
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def collect_tasks(head: str, tmp_path: Path, routes: dict[str, str] | None, terminal: bool = False, **params: Any):
    cfg = CollectConfig(
        input_jsonl_fpath=str(write_tasks(tmp_path / "in.jsonl", 3, terminal)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        environment_server_routes=routes,
        progress=False,
        **params,
    )

    return run_collection(head, cfg), tmp_path / "out.jsonl"


def test_materialized_tasks_go_to_their_tasksets_environment_server_as_episodes(head, tmp_path):
    """As 0.7.0's collector: each task goes to the environment server its taskset's route names, as an episode
    request (`{episode_id: {rollout_id, attempt}, task: {task_id, task_input}}`); the rollout is the episode's result
    with `_ng_task_id`, attributed to the server's agent; a failed episode is a failure with its class and reason."""
    summary, out = collect_tasks(head, tmp_path, {TASKSET: "env_episodes"}, num_repeats=2)
    rows = sorted(read_jsonl(out), key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in rows] == [
        (0, 0, 0.0),
        (0, 1, 0.0),
        (2, 0, 2.0),
        (2, 1, 2.0),
    ]
    assert rows[2]["_ng_task_id"] == {"taskset": TASKSET, "task_id": "2"} and rows[2]["seen_rollout_id"] == "2-0"
    assert {(r["agent_ref"]["name"], r["_ng_environment_server"]) for r in rows} == {("agent", "env_episodes")}
    assert "task_input" not in rows[0]  # the result as the server gave it, not merged over the row
    assert summary.failures_by_class == {"environment_server_failed": 2}
    failure = read_jsonl(tmp_path / "out_failures.jsonl")[0]
    assert (failure["_ng_task_index"], failure["transient"]) == (1, True) and "terminal" not in failure
    assert failure["message"] == "NeMo Gym failure (agent stage): the user simulator gave up"


def test_a_rerun_sends_a_failed_episode_as_its_next_attempt(head, tmp_path):
    """As 0.7.0's collector: a rerun sends a rollout that failed as its next attempt (`episode_id.attempt`, and
    `_ng_attempt_index` on the records: one past the failed attempt's), a first attempt unstamped; the rollouts that
    finished are not sent again."""
    attempts = []
    for _ in range(3):
        summary, out = collect_tasks(head, tmp_path, {TASKSET: "env_episodes"})
        failures = tmp_path / "out_failures.jsonl"
        attempts.append([r["_ng_attempt_index"] for r in read_jsonl(failures)] if failures.exists() else [])
    assert attempts == [[0], [1], []]  # task 1 failed twice, then its third attempt (2) gave a rollout
    rows = {r["_ng_task_index"]: r for r in read_jsonl(out)}
    assert (rows[1]["seen_attempt"], rows[1]["_ng_attempt_index"], rows[1]["seen_rollout_id"]) == (2, 2, "1-0")
    assert rows[0]["seen_attempt"] == 0 and "_ng_attempt_index" not in rows[0]
    assert summary.rollouts_resumed == 2


def test_a_rerun_does_not_retry_a_terminal_failure_nor_one_that_used_its_attempts(head, tmp_path, monkeypatch):
    """As 0.7.0's collector: a failure its server stamped terminal is not sent again (its record kept, the run's exit
    status 1, the summary saying why); nor is one that failed NEMO_GYM_MAX_ROLLOUT_ATTEMPTS times, until
    `+max_rollout_attempts` is raised."""
    terminal, capped = tmp_path / "terminal", tmp_path / "capped"
    for path in (terminal, capped):
        path.mkdir()
    collect_tasks(head, terminal, {TASKSET: "env_episodes"}, terminal=True)
    [first] = read_jsonl(terminal / "out_failures.jsonl")
    assert first["terminal"] is True and first["transient"] is False
    for retry_terminal_timeouts in (False, True):  # 0.7.0's flag retries timeouts only, not this failure class
        summary, _ = collect_tasks(
            head, terminal, {TASKSET: "env_episodes"}, terminal=True, retry_terminal_timeouts=retry_terminal_timeouts
        )
        assert (summary.rollouts_this_run, summary.not_retried, summary.exit_status) == (0, {"terminal": 1}, 1)
        assert read_jsonl(terminal / "out_failures.jsonl") == [first]
    assert "Not retried: 1 rollout whose failure was terminal" in summary.format()
    assert "Rerun the same command" not in summary.format()

    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "2")
    runs = [collect_tasks(head, capped, {TASKSET: "env_episodes"})[0] for _ in range(3)]
    assert [r.failures_by_class for r in runs] == [{"environment_server_failed": 1}] * 2 + [{}]
    assert runs[2].not_retried == {"max_attempts": 1} and runs[2].rollouts_this_run == 0
    assert "1 rollout that failed +max_rollout_attempts times (raise it" in runs[2].format()
    summary, out = collect_tasks(head, capped, {TASKSET: "env_episodes"}, max_rollout_attempts=3)
    assert (summary.rollouts_this_run, summary.exit_status, summary.not_retried) == (1, 0, {})
    assert {r["_ng_task_index"]: r.get("_ng_attempt_index") for r in read_jsonl(out)} == {0: None, 1: 2, 2: None}


def test_a_bad_max_attempts_setting_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "three")
    with pytest.raises(ConfigError, match=r"NEMO_GYM_MAX_ROLLOUT_ATTEMPTS='three': must be a positive integer"):
        CollectConfig(input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out.jsonl")
    with pytest.raises(ValidationError, match="max_rollout_attempts"):
        CollectConfig(input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out.jsonl", max_rollout_attempts=0)


def test_materialized_tasks_take_no_seed(head, tmp_path):
    """A materialized task has no request of ours to seed (its environment server builds it): refused by row."""
    with pytest.raises(DataError, match=r"in\.jsonl:1: a NeMo Gym 0\.7\.0 materialized task has no responses_create"):
        collect_tasks(head, tmp_path, {TASKSET: "env_episodes"}, num_repeats_add_seed=True)
    assert not (tmp_path / "out.jsonl").exists()


def test_materialized_tasks_take_no_overrides_and_are_not_fanned_out(head, tmp_path):
    """As 0.7.0's collector: `+responses_create_params` overrides are refused for a materialized task (its request is
    in task_input), by row; a `fan_out` entry naming its taskset sends it nowhere else (it runs once per repeat,
    through its environment server)."""
    with pytest.raises(DataError, match=r"in\.jsonl:1: \+responses_create_params overrides are not applied"):
        collect_tasks(head, tmp_path, {TASKSET: "env_episodes"}, responses_create_params={"temperature": 0.5})
    assert not (tmp_path / "out.jsonl").exists()
    summary, out = collect_tasks(head, tmp_path, {TASKSET: "env_episodes"}, fan_out={TASKSET: ["agent", "other"]})
    rows = read_jsonl(out)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(0, 0), (2, 0)]
    assert {r["_ng_environment_server"] for r in rows} == {"env_episodes"}
    assert summary.failures_by_class == {"environment_server_failed": 1}


def test_a_taskset_route_is_written_on_the_command_line_as_in_nemo_gym():
    """A taskset's colon escaped, as NeMo Gym's Hydra command line takes it."""
    ((key, routes),) = parse_overrides([r"+environment_server_routes={nemo_user_sim\:example: env_episodes}"])
    cfg = CollectConfig(input_jsonl_fpath="in.jsonl", output_jsonl_fpath="out.jsonl", **{key: routes})
    assert cfg.environment_server_routes == {TASKSET: "env_episodes"}


@pytest.mark.parametrize(
    ("routes", "why"),
    [
        (None, r"\+environment_server_routes has no route for it \(routes: none\)"),
        ({TASKSET: "nope"}, r"its route 'nope' names no running server"),
        ({TASKSET: "agent"}, r"its route 'agent' names a server of type responses_api_agents, not an environment"),
    ],
)
def test_a_taskset_without_an_environment_server_is_refused_before_any_rollout(head, tmp_path, routes, why):
    with pytest.raises(
        DataError, match=rf"in\.jsonl:1: a NeMo Gym 0\.7\.0 materialized task of taskset '{TASKSET}': {why}"
    ):
        collect_tasks(head, tmp_path, routes)
    assert not (tmp_path / "out.jsonl").exists()


def _agent(resources_server: str, *pins: str) -> dict[str, Any]:
    """A NeMo Gym 0.7.0 agent instance section (simple_agent's config shape), its datasets pinning `pins`."""
    fields = {
        "entrypoint": "app.py",
        "resources_server": {"type": "resources_servers", "name": resources_server},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    return {"responses_api_agents": {"simple_agent": {**fields, **_datasets(pins)}}}


def _resources(*pins: str) -> dict[str, Any]:
    """A NeMo Gym 0.7.0 resources server instance section, its datasets pinning `pins` (one dataset each)."""
    return {
        "resources_servers": {
            "example_single_tool_call": {"entrypoint": "app.py", "domain": "other", **_datasets(pins)}
        }
    }


def _datasets(pins: tuple[str, ...]) -> dict[str, Any]:
    datasets = [
        {"name": f"d{i}", "type": "example", "jsonl_fpath": f"d{i}.jsonl", "agent": pin, "license": "Apache 2.0"}
        for i, pin in enumerate(pins)
    ]
    return {"datasets": datasets} if datasets else {}


# a 0.7.0 run's config: task_source -> the agent 0.7.0 resolves it to, None where it refuses
PINNED_RUN = {
    "agent_a": _agent("rs_shared"),
    "agent_b": _agent("rs_shared"),
    "agent_c": _agent("rs_single", "agent_c"),  # pins itself
    "agent_d": _agent("rs_foreign_pin", "agent_a"),  # pins another agent
    "agent_e": _agent("rs_unpinned_shared"),
    "agent_f": _agent("rs_unpinned_shared"),
    "rs_shared": _resources("agent_b", "agent_b"),  # two datasets, one pin
    "rs_single": _resources(),
    "rs_foreign_pin": _resources("agent_a"),  # agent_a names rs_shared, not it
    "rs_unpinned_shared": _resources(),
    "rs_two_pins": _resources("agent_a", "agent_b"),
    "policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}},
}
PINNED_RUN_AGENTS = {
    "agent_a": "agent_a",
    "agent_c": "agent_c",
    "agent_d": None,
    "rs_shared": "agent_b",
    "rs_single": "agent_c",
    "rs_foreign_pin": None,
    "rs_unpinned_shared": None,
    "rs_two_pins": None,
    "policy_model": None,
    "nope": None,
}


def _served_config() -> dict[str, Any]:
    """PINNED_RUN as a running 0.7.0 head server answers it (every instance with its host and port)."""
    config = json.loads(json.dumps(PINNED_RUN))
    for port, section in enumerate(config.values(), 9000):
        fields = next(iter(next(iter(section.values())).values()))
        fields.update(host="127.0.0.1", port=port)
    return config


class _Head:
    """A client whose head server lists PINNED_RUN's servers as our client reads them from 0.7.0's head server."""

    async def list_servers(self) -> list[dict[str, Any]]:
        return nemo_gym_head_servers(yaml.safe_dump(_served_config()), "http://127.0.0.1:8000")


def _ours(source: str) -> str | None:
    tasks = [{"agent_ref": None, "task_source": source}]
    try:
        asyncio.run(resolve_task_sources(_Head(), tasks, lambda i: f"row {i}"))
    except DataError:
        return None
    return tasks[0]["agent_ref"]["name"]


def test_task_source_rows_of_a_0_7_0_run_go_where_the_pins_say():
    """Read from a 0.7.0 head server's config (`nemo_gym_head_servers`): each dataset's `agent:` pin travels with
    its instance, and each task_source resolves as 0.7.0's `resolve_dataset_agent` rules say (PINNED_RUN_AGENTS)."""
    assert {source: _ours(source) for source in PINNED_RUN_AGENTS} == PINNED_RUN_AGENTS


PEER_RESOLVE = """
import json, sys
from omegaconf import OmegaConf
from nemo_gym.rollout_collection import RolloutCollectionHelper
config = OmegaConf.create(json.loads(sys.argv[1]))
answers = {}
for source in json.loads(sys.argv[2]):
    rows = [{"task_source": source}]
    try:
        RolloutCollectionHelper.resolve_task_sources(rows, config)
        answers[source] = rows[0]["agent_ref"]["name"]
    except ValueError:
        answers[source] = None
print(json.dumps(answers))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(120)
def test_task_source_rows_resolve_as_0_7_0_resolves_them():
    """NeMo Gym 0.7.0's own collector resolution (`RolloutCollectionHelper.resolve_task_sources`, in its venv) on
    the same run's config gives the agents ours gives, and refuses the same task_sources (about 10 s)."""
    agents = json.dumps(sorted(PINNED_RUN_AGENTS))
    assert peer07_json(PEER_RESOLVE, json.dumps(_served_config()), agents, timeout=100) == PINNED_RUN_AGENTS


PEER_EPISODES = """
import json, sys
from nemo_gym.rollout_collection import _episode_record, _episode_request_body
case = json.loads(sys.argv[1])
print(json.dumps({
    "requests": [_episode_request_body(row) for row in case["rows"]],
    "records": [_episode_record(answer) for answer in case["answers"]],
}))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(120)
def test_episodes_are_what_0_7_0_sends_and_stores():
    """NeMo Gym 0.7.0's own episode request (`_episode_request_body`) and record (`_episode_record`, a result and a
    failure with stage and partial response) equal ours (`episode_request`, `episode_rollout`), in its venv."""
    task = {"task_id": {"taskset": TASKSET, "task_id": "7"}, "task_input": {"x": 7}}
    rows = [
        {**task, "_ng_task_index": 3, "_ng_rollout_index": 1},
        {**task, "_ng_task_index": 0, "_ng_rollout_index": 0},
    ]
    episode = {"rollout_id": "3-1", "attempt": 0}
    failure = {"failure_reason": "gave up", "terminal": True, "stage": "agent", "partial_response": {"output": []}}
    answers = [
        {"episode_id": episode, "task_id": task["task_id"], "result": {"reward": 1.0, "turns": 3}},
        {"episode_id": episode, "task_id": task["task_id"], "failure": failure},
        {"episode_id": episode, "task_id": task["task_id"], "failure": {"failure_reason": "x", "terminal": False}},
    ]
    theirs = peer07_json(PEER_EPISODES, json.dumps({"rows": rows, "answers": answers}), timeout=100)
    assert theirs == {"requests": [episode_request(r) for r in rows], "records": [episode_rollout(a) for a in answers]}
