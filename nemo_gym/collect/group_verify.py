"""`ng_group_verify`: score collected rollouts again with a resources server's group judge.

The rollouts of each task (same `_ng_task_index`) are POSTed together to `/verify_group` of the resources
server instance (e.g. llm_judge's RULER-style judge: one judge call per task, scores relative to the
group), a few groups at a time. Each output row is the rollout row with `reward` replaced by the group's
reward, the earlier reward kept as `pointwise_reward`, and the judge's `group_explanation`. A group that
fails (the server or its judge unreachable, an HTTP error, no valid scores) writes one record to
`<out stem>_failures.jsonl` (`_ng_task_index`, `_ng_rollout_indices`, `failure_class`, `message`) and
none of its rows to the output: a failure is never scored 0. Exit status 0: every group scored; 1: some failed.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.files import OutputPaths, write_rescored
from nemo_gym.common.errors import DataError, ServerError, ServerHTTPError, typed_error, typed_failure
from nemo_gym.common.jsonl import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import discover_head_url
from nemo_gym.serving.retry_policy import ClientTimeouts

__all__ = ["GroupVerifyOptions", "group_rollouts", "group_verify", "group_verify_main"]


class GroupVerifyOptions(BaseModel):
    """Parameters of `ng_group_verify`."""

    model_config = ConfigDict(extra="forbid")
    rollouts_jsonl_fpath: str = Field(description="rollouts written by ng_collect_rollouts (rows with _ng_task_index)")
    output_jsonl_fpath: str = Field(
        description="rows with the group reward; failed groups go to <stem>_failures.jsonl next to it"
    )
    resources_server: str = Field(
        description="instance name of the resources server whose POST /verify_group scores a group"
    )
    head_server_url: str | None = Field(
        None, description="head server of the run (default: $NEMO_GYM_HEAD_URL, else the only live ng_run)"
    )
    num_groups_in_parallel: int = Field(8, ge=1, description="groups sent at the same time")
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one /verify_group call, seconds")
    max_retries: int = Field(
        3, ge=0, description="retries of a /verify_group call after a connection error or 502/503/504"
    )


def failures_path(output: str | Path) -> Path:
    """The failures file beside `output` (`OutputPaths`)."""
    return OutputPaths.for_output(output).failures


def group_rollouts(path: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Rollout rows by `_ng_task_index`, in file order.

    Raises:
        DataError: a line is not a JSON object, or a row has no integer `_ng_task_index` (`file:line`).
    """
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line, row in iter_jsonl(path):
        task_index = row.get(TASK_INDEX_KEY)
        if not isinstance(task_index, int) or isinstance(task_index, bool):
            raise DataError(
                f"{path}:{line}: no integer {TASK_INDEX_KEY} (rows written by ng_collect_rollouts have one)"
            )
        groups[task_index].append(row)
    return dict(groups)


def _failure(task_index: int, rows: list[dict[str, Any]], exc: ServerError) -> dict[str, Any]:
    """A failures-file record; a typed error body `{"error": {"type", "message", "server"}}` gives the class."""
    failure = typed_failure(exc)
    record: dict[str, Any] = {"failure_class": failure.failure_class, "message": failure.message[:4000]}
    if failure.status_code is not None:
        record["status_code"] = failure.status_code
    if isinstance(exc, ServerHTTPError) and typed_error(exc.body) is not None:  # a typed answer: the server it names
        record["failed_server"] = failure.failed_server
    return {TASK_INDEX_KEY: task_index, "_ng_rollout_indices": [r.get(ROLLOUT_INDEX_KEY) for r in rows], **record}


def _scored_rows(rows: list[dict[str, Any]], answer: Any, server: str) -> list[dict[str, Any]]:
    """The rows with the group rewards; raises ServerError for an answer of the wrong shape."""
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if (
        not isinstance(rewards, list)
        or len(rewards) != len(rows)
        or not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards)
    ):
        raise ServerError(
            f"/verify_group answered no list of {len(rows)} numeric rewards: {str(answer)[:300]}",
            server=server,
            path="/verify_group",
        )
    explanations = answer.get("explanations") if isinstance(answer.get("explanations"), list) else [None] * len(rows)
    return [
        {**row, "pointwise_reward": row.get("reward"), "reward": float(reward), "group_explanation": explanation}
        for row, reward, explanation in zip(rows, rewards, explanations)
    ]


async def group_verify(options: GroupVerifyOptions, client: ServerClient) -> tuple[int, int]:
    """Score every group and write the output and failures files. Returns `(groups scored, groups failed)`.

    Raises:
        DataError: a bad rollouts file (see `group_rollouts`).
    """
    groups = group_rollouts(options.rollouts_jsonl_fpath)
    scored: dict[int, list[dict[str, Any]]] = {}
    failures: dict[int, dict[str, Any]] = {}
    limit = asyncio.Semaphore(options.num_groups_in_parallel)

    async def score(task_index: int, rows: list[dict[str, Any]]) -> None:
        async with limit:
            try:
                answer = await client.post(options.resources_server, "/verify_group", {"rows": rows})
                scored[task_index] = _scored_rows(rows, answer, options.resources_server)
            except ServerError as exc:
                failures[task_index] = _failure(task_index, rows, exc)

    await asyncio.gather(*(score(index, rows) for index, rows in groups.items()))
    rows = (row for index in sorted(scored) for row in scored[index])
    write_rescored(Path(options.output_jsonl_fpath), rows, [failures[index] for index in sorted(failures)])
    return len(scored), len(failures)


def group_verify_main(options: GroupVerifyOptions) -> int:
    """`ng_group_verify`: score, print a summary; returns the exit status (0 all scored, 1 some failed)."""
    head_url = discover_head_url(options.head_server_url)

    async def run() -> tuple[int, int]:
        timeouts = ClientTimeouts(read_s=options.request_timeout_s, max_retries=options.max_retries)
        async with ServerClient(head_url, timeouts=timeouts) as client:
            return await group_verify(options, client)

    done, failed = asyncio.run(run())
    print(f"ng_group_verify: {done} groups scored into {options.output_jsonl_fpath}")
    if failed:
        print(f"ng_group_verify: {failed} groups failed; they are in {failures_path(options.output_jsonl_fpath)}")
    return 1 if failed else 0
