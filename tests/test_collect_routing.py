"""Collection through NeMo Gym 0.7.0 environment servers (`nemo_gym.collect.routing`), against a real head server and
real HTTP on loopback: a row for an environment server in front of one agent is sent to it as NeMo Gym 0.7.0's
collector sends it (`agent_ref` the agent, `_ng_environment_server` the server); an answer with NeMo Gym's
failure-routing keys (an environment server's failed episode, a verify whose judge failed) is a failure of that class
with its message, never a reward."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from test_collect import FAST, Served, write_input

from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import build_head_app


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


@pytest.fixture(scope="module")
def head():
    app = build_head_app()
    served = {"head": Served(app), "env": Served(environment_server("agent", False))}
    served["env_failing"] = Served(environment_server("agent", True))
    served["env_judged"] = Served(environment_server("agent", False, judge_fails=True))
    for name in ("env", "env_failing", "env_judged"):
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
    yield served["head"].url
    for server in served.values():
        server.stop()


def collect(head: str, tmp_path: Path, agent_name: str | None, **row: Any):
    cfg = CollectConfig(
        agent_name=agent_name,
        input_jsonl_fpath=str(write_input(tmp_path / "in.jsonl", 3, **row)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        progress=False,
    )

    async def run():
        async with ServerClient(head, timeouts=FAST) as client:
            return await collect_rollouts(cfg, client)

    return asyncio.run(run()), tmp_path / "out.jsonl"


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
