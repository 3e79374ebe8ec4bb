"""Where a collected row goes: the agent of a NeMo Gym 0.7.0 `task_source` row (`resolve_task_sources`), NeMo Gym
0.7.0's environment servers in front of agents, as its collector sends rows to them
(`route_through_environment_servers`), the environment server of a 0.7.0 materialized task (`route_tasksets`, sent as
an episode: `episode_request`, `episode_rollout`), and the server a row's `/run` goes to (`dispatch_target`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from nemo_gym.collect.tasks import taskset_of
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import (
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    ENVIRONMENT_SERVER_KEY,
    TASK_SOURCE_KEY,
)
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.rollout_prefix import capture_rollout_id, rollout_id_of

__all__ = [
    "NEMO_GYM_FAILURE_CLASS",
    "agent_resources_servers",
    "capture_rollout_id",
    "dispatch_target",
    "episode_request",
    "episode_rollout",
    "nemo_gym_failure",
    "resolve_task_sources",
    "rollout_id_of",
    "route_tasksets",
    "route_through_environment_servers",
]

NEMO_GYM_FAILURE_CLASS = "_ng_failure_class"  # NeMo Gym 0.7.0: an environment server's failed episode
AGENT_TYPE, RESOURCES_TYPE, ENVIRONMENT_TYPE = "responses_api_agents", "resources_servers", "environment_servers"
TASK_ID_KEY = "_ng_task_id"  # NeMo Gym 0.7.0: the task identity (`{taskset, task_id}`) on an episode's rollout


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


async def route_tasksets(
    client: ServerClient, tasks: list[dict[str, Any]], routes: dict[str, str], where: Callable[[int], str]
) -> None:
    """NeMo Gym 0.7.0's materialized tasks (`taskset_of`: what its `ng_prepare_data` writes for a dataset declared
    with `taskset:`) go, as its collector sends them, to the environment server `routes` (its
    `environment_server_routes`) names for their taskset (`_ng_environment_server`); `agent_ref` is the agent its
    results are attributed to (0.7.0's `environment_server_attributed_agent`: its `agent_server`, else its only
    agent; else the server itself). In place; one `GET /servers` of the head server, only when a row is one.

    Raises:
        DataError: (`where(i): ...`) a taskset without a route, or a route to no running environment server.
    """
    pending = [i for i, task in enumerate(tasks) if taskset_of(task) is not None]
    if not pending:
        return
    entries = {entry["name"]: entry for entry in await client.list_servers()}
    for i in pending:
        taskset = str(taskset_of(tasks[i]))
        server = routes.get(taskset)
        entry = entries.get(server) if server else None
        if entry is None or entry["server_type"] != ENVIRONMENT_TYPE:
            why = (
                f"+environment_server_routes has no route for it (routes: {', '.join(sorted(routes)) or 'none'})"
                if server is None
                else f"its route {server!r} names no running server"
                if entry is None
                else f"its route {server!r} names a server of type {entry['server_type']}, not an environment server"
            )
            raise DataError(
                f"{where(i)}: a NeMo Gym 0.7.0 materialized task of taskset {taskset!r}: {why}; pass"
                f" +environment_server_routes={{{taskset}: <environment server instance>}}"
            )
        refs = entry.get("agent_refs") or {}
        agents = [ref["name"] for ref in refs.values()]
        attributed = (
            refs["agent_server"]["name"] if "agent_server" in refs else agents[0] if len(agents) == 1 else server
        )
        tasks[i][ENVIRONMENT_SERVER_KEY] = server
        tasks[i][AGENT_REF_KEY] = {"name": attributed}


def episode_request(row: dict[str, Any]) -> dict[str, Any]:
    """The `/run` body of a materialized task's rollout, as NeMo Gym 0.7.0's collector sends it to an environment
    server (`BaseEpisodeRequest`): `{episode_id: {rollout_id, attempt}, task: {task_id, task_input}}`, the rollout
    id the row's `_ng_rollout_id`, else `<task index>-<rollout index>`, the attempt its `_ng_attempt_index` (0 for a
    first: `nemo_gym.collect.engine.attempt`)."""
    return {
        "episode_id": {"rollout_id": rollout_id_of(row), "attempt": row.get(ATTEMPT_INDEX_KEY, 0)},
        "task": {"task_id": row["task_id"], "task_input": row["task_input"]},
    }


def episode_rollout(answer: Any) -> dict[str, Any] | None:
    """The record of an environment server's episode answer (`BaseEpisodeResponse`: `{episode_id, task_id, result |
    failure}`), as NeMo Gym 0.7.0's collector stores it (`_episode_record`): the `result` as the server gave it,
    with `_ng_task_id`; a `failure` as 0.7.0's failure-routing keys (`nemo_gym_failure` reads them: class
    `environment_server_failed`, its `failure_reason`, stage, terminal, partial response). None for an answer of
    another shape (then it is read as it is)."""
    if not (isinstance(answer, dict) and isinstance(answer.get("episode_id"), dict)):
        return None
    if isinstance(failure := answer.get("failure"), dict):
        optional = {"_ng_failure_stage": "stage", "_ng_failure_partial_response": "partial_response"}
        return {
            TASK_ID_KEY: answer.get("task_id"),
            NEMO_GYM_FAILURE_CLASS: "environment_server_failed",
            "_ng_failure_terminal": bool(failure.get("terminal", False)),
            "_ng_failure_message": failure.get("failure_reason"),
            **{key: failure[field] for key, field in optional.items() if failure.get(field) is not None},
        }
    result = answer.get("result")
    return {**result, TASK_ID_KEY: answer.get("task_id")} if isinstance(result, dict) else None


def agent_resources_servers(entries: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(agent, resources server) for each resources server an agent's config references, from the head server's
    `GET /servers` entries (`references`)."""
    return [
        (entry["name"], ref["name"])
        for entry in entries
        if entry.get("server_type") == AGENT_TYPE
        for ref in (entry.get("references") or {}).values()
        if ref.get("type") == RESOURCES_TYPE
    ]


async def resolve_task_sources(client: ServerClient, tasks: list[dict[str, Any]], where: Callable[[int], str]) -> None:
    """Rows without an agent_ref that carry NeMo Gym 0.7.0's `task_source` (the config instance that declared their
    dataset, which 0.7.0's `ng_prepare_data` writes instead of agent_ref) get the agent it resolves to, as 0.7.0's
    collector resolves it (`resolve_dataset_agent`) from the running servers (one `GET /servers` of the head
    server, whose entries name the instances each server's config references and the agents its datasets pin,
    `dataset_agent_pins`): an agent instance is itself; a resources server, the agent its datasets pin (`agent:`,
    which must be one whose config names it), else the one agent whose config names it. In place.

    Raises:
        DataError: (`where(i): ...`) a task_source that names no running instance, another kind of server, an
            instance whose datasets pin several agents or one that is not theirs to run, or a resources server no
            agent or several agents name (then `+agent_name` or `+agent_map` says which).
    """
    pending = [i for i, task in enumerate(tasks) if task[AGENT_REF_KEY] is None]
    if not pending:
        return
    entries = {entry["name"]: entry for entry in await client.list_servers()}
    users: dict[str, set[str]] = {}
    for agent, resources_server in agent_resources_servers(entries.values()):
        users.setdefault(resources_server, set()).add(agent)
    resolved: dict[str, str] = {}
    for i in pending:
        source = tasks[i][TASK_SOURCE_KEY]
        if source not in resolved:
            resolved[source] = _declared_agent(source, entries, users, where(i))
        tasks[i][AGENT_REF_KEY] = {"name": resolved[source]}


def _declared_agent(source: str, entries: dict[str, dict[str, Any]], users: dict[str, set[str]], where: str) -> str:
    """The agent that runs the datasets `source` declares (NeMo Gym 0.7.0's `resolve_dataset_agent` with its
    datasets' one pin, if any; `resolve_task_sources` has the rule).

    Raises:
        DataError: (`where: task_source ...`) no single agent, with why and what to pass.
    """
    entry = entries.get(source)
    kind = entry["server_type"] if entry else None
    pins = list(entry.get("dataset_agent_pins") or ()) if entry else []
    agents = sorted(users.get(source, ())) if kind == RESOURCES_TYPE else [source] if kind == AGENT_TYPE else []
    pick = f"pass +agent_map={{{source}: <agent>}} or +agent_name"
    if kind is None:
        why = f"no server instance of that name runs (running: {', '.join(sorted(entries))})"
    elif kind not in (AGENT_TYPE, RESOURCES_TYPE):
        why = f"it names a server of type {kind}: a dataset's rows go to an agent or a resources server"
    elif len(pins) > 1:
        why = f"its datasets pin several agents ({', '.join(pins)}), which task_source alone cannot tell apart"
    elif pins and pins[0] not in agents:
        why = (
            f"its datasets pin agent {pins[0]!r}, but the agent {source} runs its rows itself; drop the dataset's"
            " `agent:` key or declare the dataset on the resources server"
            if kind == AGENT_TYPE
            else f"its datasets pin agent {pins[0]!r}, which is not an agent whose config names it (those: "
            f"{', '.join(agents) or 'none'}); pin one of them"
        )
        pick = "or " + pick
    elif pins or len(agents) == 1:
        return pins[0] if pins else agents[0]
    else:
        why = f"the agents whose config names it: {', '.join(agents) or 'none'}"
    raise DataError(f"{where}: task_source {source!r} resolves to no single agent ({why}); {pick}")


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
