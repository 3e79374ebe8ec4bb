"""Where a collected row goes: the agent of a NeMo Gym 0.7.0 `task_source` row (`resolve_task_sources`), NeMo Gym
0.7.0's environment servers in front of agents, as its collector sends rows to them
(`route_through_environment_servers`), and the server a row's `/run` goes to (`dispatch_target`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import AGENT_REF_KEY, ENVIRONMENT_SERVER_KEY, TASK_SOURCE_KEY
from nemo_gym.serving.client import ServerClient

__all__ = [
    "NEMO_GYM_FAILURE_CLASS",
    "dispatch_target",
    "nemo_gym_failure",
    "resolve_task_sources",
    "route_through_environment_servers",
]

NEMO_GYM_FAILURE_CLASS = "_ng_failure_class"  # NeMo Gym 0.7.0: an environment server's failed episode
AGENT_TYPE, RESOURCES_TYPE = "responses_api_agents", "resources_servers"


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


async def resolve_task_sources(client: ServerClient, tasks: list[dict[str, Any]], where: Callable[[int], str]) -> None:
    """Rows without an agent_ref that carry NeMo Gym 0.7.0's `task_source` (the config instance that declared their
    dataset, which 0.7.0's `ng_prepare_data` writes instead of agent_ref) get the agent it resolves to, as 0.7.0's
    collector resolves it (`resolve_dataset_agent`) from the running servers (one `GET /servers` of the head
    server, whose entries name the instances each server's config references): an agent instance is itself; a
    resources server, the one agent whose config names it. In place.

    Raises:
        DataError: (`where(i): ...`) a task_source that names no running instance, another kind of server, or a
            resources server no agent or several agents name (then `+agent_name` says which).
    """
    pending = [i for i, task in enumerate(tasks) if task[AGENT_REF_KEY] is None]
    if not pending:
        return
    entries = await client.list_servers()
    kinds = {entry["name"]: entry["server_type"] for entry in entries}
    users: dict[str, set[str]] = {}
    for entry in entries:
        if entry["server_type"] == AGENT_TYPE:
            for ref in (entry.get("references") or {}).values():
                if ref.get("type") == RESOURCES_TYPE:
                    users.setdefault(ref["name"], set()).add(entry["name"])
    for i in pending:
        source = tasks[i][TASK_SOURCE_KEY]
        kind = kinds.get(source)
        agents = sorted(users.get(source, ())) if kind == RESOURCES_TYPE else [source] if kind == AGENT_TYPE else []
        if len(agents) != 1:
            why = (
                f"no server instance of that name runs (running: {', '.join(sorted(kinds))})"
                if kind is None
                else f"it names a server of type {kind}: a dataset's rows go to an agent or a resources server"
                if kind not in (AGENT_TYPE, RESOURCES_TYPE)
                else f"the agents whose config names it: {', '.join(agents) or 'none'}"
            )
            raise DataError(f"{where(i)}: task_source {source!r} resolves to no single agent ({why}); pass +agent_name")
        tasks[i][AGENT_REF_KEY] = {"name": agents[0]}


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
