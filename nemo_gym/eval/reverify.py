"""`ng_reverify` (NeMo Gym 0.7.0's `gym eval reverify`): score collected rollouts again with the resources servers
running now, e.g. after a verifier was fixed, without generating anything.

Each rollout goes to `POST /verify` of its agent's resources server (the instance the agent's config names, as
the head server lists it; `+resources_server=` for all of them) in a session of its own: the session is seeded with
the task row and the rollout's function calls are replayed in it first, in order, so a server whose reward reads
state its tools built (a to-do list, a database) scores the same trajectory in the same state; a call the
server refuses is left as it was (the rollout saw the same answer). The verify body is the rollout's task row with
its `response`, as 0.7.0 builds it: the row the collector sent, from the materialized inputs next to the rollouts
(`<stem>_materialized_inputs.jsonl`, which ours and 0.7.0's collectors write; `+materialized_inputs_jsonl_fpath=`
names another), joined by `(_ng_task_index, _ng_rollout_index)` (0.7.0's rollout rows keep only the verify answer,
which can drop task fields); without that file, the rollout row itself (ours holds the task fields).

Each output row is the rollout row with the new `reward` and the verify answer's other fields, the old reward kept as
`previous_reward`; a rollout that cannot be verified (an HTTP error, an answer without a numeric reward) is a record
of `<out stem>_failures.jsonl` (`_ng_task_index`, `_ng_rollout_index`, `failure_class`, `message`), never scored 0.
Exit status 0: every rollout scored; 1: some failed.

`+input_format=atif` reads ATIF trajectories instead (another harness's, or `ng_export_atif`'s), through the
manifest that joins them to the materialized inputs (`+atif_manifest_jsonl_fpath=`, with
`+materialized_inputs_jsonl_fpath=`): each trajectory becomes the rollout's response (`nemo_gym.eval.atif_reverify`).

Departure from 0.7.0, which posts `/verify` with no session and so refuses servers that do not declare themselves
stateless (`REVERIFY_MODE`) unless forced: the replay in a seeded session lets a stateful server score again.
A Gymnasium-style server (reset/step) replays the episode from the trajectory itself (`nemo_gym.env.gymnasium`).
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.collect.aggregate_metrics import is_reward
from nemo_gym.collect.files import OutputPaths, write_rescored
from nemo_gym.collect.routing import agent_resources_servers
from nemo_gym.common.errors import ConfigError, DataError, ServerError, typed_failure
from nemo_gym.common.jsonl import AGENT_REF_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl
from nemo_gym.eval.atif_reverify import atif_rows
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import discover_head_url
from nemo_gym.serving.retry_policy import ClientTimeouts

__all__ = ["ReverifyOptions", "reverify", "reverify_main", "task_rows", "verify_body"]

PREVIOUS_REWARD_KEY = "previous_reward"
_NOT_TASK_FIELDS = ("response", "reward", PREVIOUS_REWARD_KEY)


class ReverifyOptions(BaseModel):
    """Parameters of `ng_reverify`."""

    model_config = ConfigDict(extra="forbid")
    rollouts_jsonl_fpath: str | None = Field(None, description="rollouts written by ng_collect_rollouts (gym input)")
    input_format: Literal["gym", "atif"] = Field(
        "gym", description="gym: a rollouts file; atif: ATIF trajectories joined by +atif_manifest_jsonl_fpath"
    )
    atif_manifest_jsonl_fpath: str | None = Field(
        None,
        description="(atif) the manifest joining trajectories to tasks: {trajectory_path, _ng_task_index,"
        " _ng_rollout_index, expected_sha256} per line, as ng_export_atif writes it",
    )
    output_jsonl_fpath: str = Field(
        description="rows with the new reward (the old one as previous_reward); failures go to <stem>_failures.jsonl"
    )
    materialized_inputs_jsonl_fpath: str | None = Field(
        None,
        description=(
            "the rows the collector sent, joined with the rollouts by their indices (default: <rollouts"
            " stem>_materialized_inputs.jsonl when it exists, else the rollout rows themselves)"
        ),
    )
    resources_server: str | None = Field(
        None, description="resources server instance to verify every rollout with (default: each rollout's agent's)"
    )
    replay_tool_calls: bool = Field(
        True, description="replay each rollout's function calls in its session before /verify (stateful servers)"
    )
    num_samples_in_parallel: int = Field(16, ge=1, description="rollouts verified at once")
    limit: int | None = Field(None, ge=1, description="only the first `limit` rollouts")
    overwrite: bool = Field(False, description="replace an existing output file (else it is refused)")
    head_server_url: str | None = Field(None, description="head server URL; default $NEMO_GYM_HEAD_URL or the only run")
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one call, seconds")

    @model_validator(mode="after")
    def _one_input(self) -> ReverifyOptions:
        if self.input_format == "gym" and (self.rollouts_jsonl_fpath is None or self.atif_manifest_jsonl_fpath):
            raise ValueError("input_format=gym reads +rollouts_jsonl_fpath (and no +atif_manifest_jsonl_fpath)")
        if self.input_format == "atif" and not (
            self.atif_manifest_jsonl_fpath and self.materialized_inputs_jsonl_fpath and not self.rollouts_jsonl_fpath
        ):
            raise ValueError(
                "input_format=atif reads +atif_manifest_jsonl_fpath and +materialized_inputs_jsonl_fpath"
                " (and no +rollouts_jsonl_fpath)"
            )
        return self


def task_rows(options: ReverifyOptions) -> dict[tuple[Any, Any], dict[str, Any]] | None:
    """(task index, rollout index) -> the row the collector sent, from the materialized inputs (module docstring);
    None without them. A NeMo Gym 0.7.0 materialized task's `task_input` (and its `task_data`) is flattened into the
    row, as 0.7.0's `_build_verify_payload` does."""
    path = (
        options.materialized_inputs_jsonl_fpath
        or OutputPaths.for_output(str(options.rollouts_jsonl_fpath)).materialized_inputs
    )
    if options.materialized_inputs_jsonl_fpath is None and not Path(path).is_file():
        return None
    rows = {}
    for _, row in iter_jsonl(path):
        if isinstance(task_input := row.get("task_input"), dict):
            fields = {k: v for k, v in task_input.items() if k != "task_data"}
            task_data = task_input.get("task_data") if isinstance(task_input.get("task_data"), dict) else {}
            row = {**{k: v for k, v in row.items() if k not in ("task_id", "task_input")}, **task_data, **fields}
        rows[(row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY))] = row
    return rows


def verify_body(task: dict[str, Any], rollout: dict[str, Any]) -> dict[str, Any]:
    """The `/verify` body of a rollout: its task row with its `response`, and the verifier inputs the rollout made
    (`deliverables_dir`, `reference_ids`), as NeMo Gym 0.7.0's `_build_verify_payload`."""
    made = {key: rollout[key] for key in ("deliverables_dir", "reference_ids") if key in rollout}
    return {**task, "response": rollout["response"], **made}


async def _verify_one(client: ServerClient, server: str, task: dict[str, Any], rollout: dict[str, Any], replay: bool):
    """The verify answer of one rollout (its task row and the rollout row), in a seeded session of its own (module
    docstring). Raises ServerError."""
    session = f"reverify-{uuid.uuid4().hex}"
    await client.post(server, "/seed_session", task, session_id=session)
    for item in rollout["response"].get("output") or [] if replay else []:
        if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(item.get("name"), str):
            try:
                await client.post(server, f"/{item['name']}", _arguments(item), session_id=session)
            except ServerError:
                pass  # the rollout got this error too; the state is what it was then
    return await client.post(server, "/verify?close_session=true", verify_body(task, rollout), session_id=session)


def _arguments(call: dict[str, Any]) -> Any:
    """A function call's arguments as the agent sent them to the tool: parsed JSON, `{}` when they are none."""
    try:
        return json.loads(call.get("arguments") or "{}")
    except ValueError:
        return {}  # the agent did not call the tool then (bad JSON goes back to the model): the server refuses it too


async def reverify(
    rows: list[tuple[int, dict[str, Any]]], client: ServerClient, options: ReverifyOptions, where: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `(line, row)` rollouts scored again and the failure records, in input order (module docstring). `where`
    names the file in errors.

    Raises:
        DataError: a row without `response`, indices or an agent (before any call).
    """
    agents = {} if options.resources_server else dict(agent_resources_servers(await client.list_servers()))
    inputs, tasks = task_rows(options), {}
    for line, row in rows:
        agent = (row.get(AGENT_REF_KEY) or {}).get("name") if isinstance(row.get(AGENT_REF_KEY), dict) else None
        if not isinstance(row.get("response"), dict) or TASK_INDEX_KEY not in row or ROLLOUT_INDEX_KEY not in row:
            raise DataError(
                f"{where}:{line}: not a rollout row (it needs response, {TASK_INDEX_KEY}, {ROLLOUT_INDEX_KEY})"
            )
        pair = (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY])
        if inputs is not None and pair not in inputs:
            raise DataError(f"{where}:{line}: rollout {pair} has no row in the materialized inputs")
        tasks[pair] = (
            inputs[pair] if inputs is not None else {k: v for k, v in row.items() if k not in _NOT_TASK_FIELDS}
        )
        if not options.resources_server and agents.get(agent) is None:
            raise DataError(
                f"{where}:{line}: agent {agent!r} names no running resources server (running agents: "
                f"{', '.join(sorted(agents)) or 'none'}); +resources_server=<instance> names one for every row"
            )
    limit = asyncio.Semaphore(options.num_samples_in_parallel)

    async def one(row: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        server = options.resources_server or agents[row[AGENT_REF_KEY]["name"]]
        keys = {TASK_INDEX_KEY: row[TASK_INDEX_KEY], ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY]}
        async with limit:
            try:
                task = tasks[(row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY])]
                answer = await _verify_one(client, server, task, row, options.replay_tool_calls)
            except ServerError as exc:
                failure = typed_failure(exc)
                return None, {**keys, "failure_class": failure.failure_class, "message": failure.message[:4000]}
        if not isinstance(answer, dict) or not is_reward(answer.get("reward")):
            return None, {**keys, "failure_class": "bad_verify_answer", "message": "no numeric finite reward"}
        answer = {k: v for k, v in answer.items() if k not in ("response", "responses_create_params")}
        return {**row, **answer, PREVIOUS_REWARD_KEY: row.get("reward")}, None

    results = await asyncio.gather(*(one(row) for _, row in rows))
    return [r for r, _ in results if r is not None], [f for _, f in results if f is not None]


def reverify_main(options: ReverifyOptions) -> int:
    """`ng_reverify`: score again, write the rows and the failures, print a summary. Returns 0 or 1.

    Raises:
        ConfigError: the output exists (without `overwrite`). DataError: a bad input line or row (nothing written).
        ServerError: no head server.
    """
    output = Path(options.output_jsonl_fpath)
    if output.exists() and not options.overwrite:
        raise ConfigError(f"+output_jsonl_fpath: {output} exists; +overwrite=true replaces it")
    if options.atif_manifest_jsonl_fpath:
        where = options.atif_manifest_jsonl_fpath
        rows = atif_rows(Path(where), task_rows(options) or {}, options.limit)
    else:
        where = str(options.rollouts_jsonl_fpath)
        rows = list(iter_jsonl(where, limit=options.limit))
    if not rows:
        raise DataError(f"{where}: no rollouts")
    head_url = discover_head_url(options.head_server_url)

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with ServerClient(head_url, timeouts=ClientTimeouts(read_s=options.request_timeout_s)) as client:
            return await reverify(rows, client, options, where)

    scored, failures = asyncio.run(run())
    failures_file = write_rescored(output, scored, failures)
    print(_summary(scored, len(rows), output))
    if failures:
        print(f"Failed: {len(failures)} rollouts; they are in {failures_file}, not in the output")
    return 1 if failures else 0


def _summary(scored: list[dict[str, Any]], total: int, output: Path) -> str:
    """How many rollouts were scored, how many got another reward (and how many had none before: ATIF input), the
    mean reward now and before."""
    before = [row[PREVIOUS_REWARD_KEY] for row in scored if is_reward(row[PREVIOUS_REWARD_KEY])]
    changed = sum(
        1
        for row in scored
        if is_reward(row[PREVIOUS_REWARD_KEY]) and not math.isclose(row["reward"], row[PREVIOUS_REWARD_KEY])
    )
    unknown = len(scored) - len(before)
    lines = [f"Reverified: {len(scored)}/{total} rollouts in {output}; {changed} with another reward"]
    if unknown:
        lines[0] += f", {unknown} without a reward before"
    if scored:
        mean_before = f"{sum(before) / len(before):.4f}" if before else "n/a"
        lines.append(f"Mean reward: {sum(r['reward'] for r in scored) / len(scored):.4f} (before: {mean_before})")
    return "\n".join(lines)
