"""Task rows of a collection: read from JSONL (`read_tasks`, with NeMo Gym's `prompt_config` applied when given),
checked, and materialized as they are dispatched (`materialize_task`: `responses_create_params` overrides merged,
`agent_ref` resolved). Every row is checked before any rollout; a bad one is named by its location (`file:line`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from nemo_gym.collect.files import seed_problem
from nemo_gym.collect.prompt_templates import PromptConfig, prompted_row
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import AGENT_REF_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, TASK_SOURCE_KEY, iter_jsonl
from nemo_gym.serving.responses_params import unknown_keys

__all__ = [
    "check_seedable",
    "materialize_all",
    "materialize_task",
    "read_tasks",
    "read_tasks_with_lines",
    "rerouted",
    "routing_key",
    "TaskRows",
    "taskset_of",
]


def materialize_task(
    row: dict[str, Any],
    where: str,
    *,
    agent_name: str | None = None,
    responses_create_params: dict[str, Any] | None = None,
    stamp: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One task row as it is dispatched: `responses_create_params` overrides merged over the row's own, the `stamp`
    fields set (e.g. `skills_ref`: `nemo_gym.collect.skills`), `agent_ref`
    resolved (the row's own wins over `agent_name`; None when there is neither), `_ng_*` index keys dropped. A NeMo
    Gym 0.7.0 materialized task (`taskset_of`) is sent as it is (no agent: its taskset routes it, as in 0.7.0).

    Raises:
        DataError: (`where: ...`) no `responses_create_params` object, one with a key that is no Responses API
            create parameter (`nemo_gym.serving.responses_params`), a malformed `agent_ref`, or overrides or a stamp
            for a materialized task (0.7.0 refuses them too).
    """
    if taskset_of(row) is not None:  # its environment server is its route (`nemo_gym.collect.routing.route_tasksets`)
        # its request is its task_input's, which 0.7.0's collector does not change either
        for given, what in ((responses_create_params, "+responses_create_params overrides"), (stamp, "+skills")):
            if given:
                raise DataError(
                    f"{where}: {what} are not applied to a NeMo Gym 0.7.0 materialized task (its request is in"
                    " task_input); collect these rows without them"
                )
        return {k: v for k, v in row.items() if k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)} | {AGENT_REF_KEY: None}
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        got = "it is missing" if params is None else f"got {type(params).__name__}"
        raise DataError(f"{where}: needs a `responses_create_params` object ({got})")
    if problems := unknown_keys(params):
        raise DataError(f"{where}: responses_create_params: {'; '.join(problems)}")
    agent_ref = row.get(AGENT_REF_KEY)
    if agent_ref is None and agent_name:
        agent_ref = {"name": agent_name}
    elif agent_ref is not None and not (isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str)):
        raise DataError(f'{where}: agent_ref must be an object {{"name": "<agent instance>"}}, got {agent_ref!r}')
    task = {k: v for k, v in row.items() if k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)}
    task["responses_create_params"] = {**params, **(responses_create_params or {})}
    task.update(stamp or {})
    task[AGENT_REF_KEY] = agent_ref
    return task


def _agent_ref_name(row: dict[str, Any]) -> str | None:
    """The agent a row's `agent_ref` names as written, else None."""
    ref = row.get(AGENT_REF_KEY)
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


def routing_key(row: dict[str, Any]) -> str | None:
    """A row's routing key, as NeMo Gym 0.7.0's collector reads it before `agent_map` (`fan_out` and a `num_repeats`
    dict are keyed by it, `nemo_gym.collect.plan`): its `agent_ref` name as written, else its taskset (`taskset_of`),
    else its `task_source`, else None."""
    name, source = _agent_ref_name(row), row.get(TASK_SOURCE_KEY)
    key = name if name is not None else taskset_of(row)
    return key if key is not None else source if isinstance(source, str) else None


def taskset_of(row: dict[str, Any]) -> str | None:
    """The taskset of a NeMo Gym 0.7.0 materialized task row (`{task_id: {taskset, task_id}, task_input: {...}}`,
    what 0.7.0's `ng_prepare_data` writes for a dataset declared with `taskset:`), else None, as 0.7.0's collector
    reads it (`_materialized_taskset`: a non-empty string `task_id.taskset` beside a `task_input`)."""
    task_id = row.get("task_id")
    taskset = task_id.get("taskset") if isinstance(task_id, dict) and "task_input" in row else None
    return taskset if isinstance(taskset, str) and taskset else None


def materialize_all(
    located: Iterable[tuple[str, dict[str, Any]]],
    agent_name: str | None,
    overrides: dict[str, Any] | None,
    source: str,
    stamp: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`materialize_task` of each (location, row), in order; then a DataError naming every row without an agent
    (at most 10 shown), or one for no rows at all. A row without an agent_ref that has NeMo Gym 0.7.0's
    `task_source` (its collated datasets' rows) is kept: the collector resolves it against the running servers
    (`nemo_gym.collect.routing.resolve_task_sources`); so is a 0.7.0 materialized task, routed by its taskset
    (`nemo_gym.collect.routing.route_tasksets`)."""
    tasks: list[dict[str, Any]] = []
    without_agent: list[str] = []
    for where, row in located:
        tasks.append(
            materialize_task(row, where, agent_name=agent_name, responses_create_params=overrides, stamp=stamp)
        )
        routed = isinstance(tasks[-1].get(TASK_SOURCE_KEY), str) or taskset_of(tasks[-1]) is not None
        if tasks[-1][AGENT_REF_KEY] is None and not routed:
            without_agent.append(where)
    if without_agent:
        more = f" and {len(without_agent) - 10} more" if len(without_agent) > 10 else ""
        raise DataError(
            f"{', '.join(without_agent[:10])}{more}: row has no agent_ref (nor NeMo Gym's task_source); pass"
            " +agent_name=<agent instance> or add agent_ref to the rows"
        )
    if not tasks:
        raise DataError(f"{source}: no rows")
    return tasks


class TaskRows(NamedTuple):
    """The task rows of a JSONL file (`read_tasks`), the line number of each, and the routing key each had before
    `agent_map` re-routed it (`routing_key`)."""

    tasks: list[dict[str, Any]]
    line_numbers: list[int]
    routing_keys: list[str | None]


def read_tasks_with_lines(
    path: str,
    *,
    agent_name: str | None = None,
    limit: int | None = None,
    responses_create_params: dict[str, Any] | None = None,
    prompt: PromptConfig | None = None,
    agent_map: dict[str, str] | None = None,
    stamp: dict[str, Any] | None = None,
) -> TaskRows:
    """`read_tasks`, with the line number and the routing key of each task in `path`; `stamp`: fields set on each
    row (`materialize_task`)."""
    line_numbers: list[int] = []
    routing_keys: list[str | None] = []

    def located() -> Iterator[tuple[str, dict[str, Any]]]:
        for line_no, row in iter_jsonl(path, limit=limit):  # lazily: a bad line is reported after the rows before it
            line_numbers.append(line_no)
            routing_keys.append(routing_key(row))
            where = f"{path}:{line_no}"
            row = row if prompt is None else prompted_row(row, prompt, where)
            yield where, row if not agent_map else rerouted(row, agent_map)

    tasks = materialize_all(located(), agent_name, responses_create_params, path, stamp)
    return TaskRows(tasks, line_numbers, routing_keys)


def read_tasks(
    path: str,
    *,
    agent_name: str | None = None,
    limit: int | None = None,
    responses_create_params: dict[str, Any] | None = None,
    prompt: PromptConfig | None = None,
    agent_map: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The task rows of a JSONL file (its first `limit`), each checked and materialized (`materialize_task`); with
    `prompt` (NeMo Gym's `prompt_config`), each row's `responses_create_params.input` is built from the template
    first (`nemo_gym.collect.prompt_templates.apply_prompt`); with `agent_map`, rows are re-routed (`rerouted`).

    Raises:
        DataError: (`file:line: ...`) a line that is not a JSON object, a bad row (see `materialize_task`), rows
            with no agent (no `agent_ref` and no `agent_name`: all named), with `prompt` a row that already has an
            input or lacks a field the template names; or the file has no rows.
    """
    return read_tasks_with_lines(
        path,
        agent_name=agent_name,
        limit=limit,
        responses_create_params=responses_create_params,
        prompt=prompt,
        agent_map=agent_map,
    )[0]


def rerouted(row: dict[str, Any], agent_map: dict[str, str]) -> dict[str, Any]:
    """`row` re-routed by NeMo Gym 0.7.0's `agent_map` (`{<agent_ref name or task_source>: <agent>, _default:
    <agent>}`), by its rule: the entry of the row's agent_ref name, else of its task_source, else `_default` (rows
    without an agent_ref included) gives the row's agent_ref `{"name": <agent>}`; a row no entry matches is kept,
    and so is a materialized task (`taskset_of`: its taskset routes it, as in 0.7.0)."""
    if taskset_of(row) is not None:
        return row
    name = _agent_ref_name(row)
    target = next((agent_map[key] for key in (name, row.get(TASK_SOURCE_KEY)) if key in agent_map), None)
    target = target or agent_map.get("_default")
    return {**row, AGENT_REF_KEY: {"name": target}} if target else row


def check_seedable(tasks: Sequence[dict[str, Any]], where: Callable[[int], str]) -> None:
    """Before a collection with `num_repeats_add_seed`: every task row can take a seed (`files.seed_problem`).

    Raises:
        DataError: (`where(i): ...`) the first row whose `responses_create_params.metadata.extra_body` is not a JSON
            object in a string, or that is a NeMo Gym 0.7.0 materialized task (no request to seed).
    """
    for i, task in enumerate(tasks):
        if taskset_of(task) is not None:
            raise DataError(
                f"{where(i)}: a NeMo Gym 0.7.0 materialized task has no responses_create_params to seed (its"
                " environment server builds the request); drop num_repeats_add_seed"
            )
        if problem := seed_problem(task):
            raise DataError(f"{where(i)}: {problem} (num_repeats_add_seed writes the seed there)")
