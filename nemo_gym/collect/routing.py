"""Where a collected row goes: NeMo Gym 0.7.0's environment servers in front of agents, as its collector sends rows to
them (`route_through_environment_servers`), and the server a row's `/run` goes to (`dispatch_target`)."""

from __future__ import annotations

from typing import Any

from nemo_gym.jsonl import AGENT_REF_KEY, ENVIRONMENT_SERVER_KEY
from nemo_gym.serving.client import ServerClient

__all__ = [
    "NEMO_GYM_FAILURE_CLASS",
    "dispatch_target",
    "nemo_gym_failure",
    "route_through_environment_servers",
]

NEMO_GYM_FAILURE_CLASS = "_ng_failure_class"  # NeMo Gym 0.7.0: an environment server's failed episode


def dispatch_target(row: dict[str, Any]) -> str:
    """The server instance a row's `/run` goes to: its environment server (`_ng_environment_server`), else its
    agent."""
    return row.get(ENVIRONMENT_SERVER_KEY) or row[AGENT_REF_KEY]["name"]


async def route_through_environment_servers(client: ServerClient, tasks: list[dict[str, Any]]) -> None:
    """Rows whose `agent_ref` names an environment server (NeMo Gym 0.7.0) in front of one agent are sent to that
    server as NeMo Gym 0.7.0's collector sends them: `agent_ref` names the agent, `_ng_environment_server` the
    server (an environment server checks that the row names its agent). In place; one `GET /servers` of the head
    server, only when a row could name an environment server. An environment server with several agents, or
    none, keeps the rows that name it as they are."""
    names = {task[AGENT_REF_KEY]["name"] for task in tasks if ENVIRONMENT_SERVER_KEY not in task}
    if not names or not client.head_url:
        return
    fronted: dict[str, str] = {}
    for entry in await client.list_servers():
        refs = entry.get("agent_refs") or {}
        agents = {ref["name"] for ref in refs.values()}
        if entry.get("server_type") == "environment_servers" and entry["name"] in names and len(agents) == 1:
            fronted[entry["name"]] = agents.pop()
    for task in tasks:
        server = task[AGENT_REF_KEY]["name"]
        if server in fronted and ENVIRONMENT_SERVER_KEY not in task:
            task[AGENT_REF_KEY] = {**task[AGENT_REF_KEY], "name": fronted[server]}
            task[ENVIRONMENT_SERVER_KEY] = server


def nemo_gym_failure(answer: Any) -> tuple[str, str, bool] | None:
    """(failure class, message, transient) of an answer NeMo Gym 0.7.0 routes to the failures file, not the output,
    else None: one with its failure-routing key `_ng_failure_class`, e.g. an environment server's failed episode
    (`environment_server_failed`, no reward; its message in `_ng_failure_message`, the stage in `_ng_failure_stage`)
    or a verify whose judge failed (`judge_failed`, from `nemo_gym.judge.judge_failsafe`: reward 0.0 and
    `mask_sample: true` that measure nothing; the judge's error in `_ng_failure_judge_error`). Transient unless
    `_ng_failure_terminal`."""
    if not isinstance(answer, dict) or not isinstance(answer.get(NEMO_GYM_FAILURE_CLASS), str):
        return None
    message = answer.get("_ng_failure_message") or answer.get("_ng_failure_judge_error") or answer.get("failure_reason")
    stage = answer.get("_ng_failure_stage")
    where = f" ({stage} stage)" if stage else ""
    return (
        answer[NEMO_GYM_FAILURE_CLASS],
        f"NeMo Gym failure{where}: {message or 'no message'}",
        not answer.get("_ng_failure_terminal", False),
    )
