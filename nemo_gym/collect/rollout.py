"""One rollout of the collector (`run_rollout`): a dispatched row POSTed to its agent's `/run`, its answer read as a
rollout or a failure record (`nemo_gym.collect.engine` runs many; the module docstring there says how)."""

from __future__ import annotations

import time
from typing import Any

from nemo_gym.collect.aggregate_metrics import is_reward
from nemo_gym.collect.attempts import TERMINAL
from nemo_gym.collect.files import now
from nemo_gym.collect.perf import ng_perf
from nemo_gym.collect.routing import (
    capture_rollout_id,
    dispatch_target,
    episode_request,
    episode_rollout,
    nemo_gym_failure,
)
from nemo_gym.collect.tasks import taskset_of
from nemo_gym.common.errors import DataError, ServerError, is_transient, typed_failure
from nemo_gym.common.jsonl import (
    AGENT_REF_KEY,
    ATTEMPT_INDEX_KEY,
    ENVIRONMENT_SERVER_KEY,
    NG_PERF_KEY,
    NG_TRAJECTORY_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
)
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.rollout_prefix import rollout_path

__all__ = ["BAD_ROLLOUT_ID", "BAD_VERIFY_ANSWER", "run_rollout"]

BAD_VERIFY_ANSWER = "bad_verify_answer"
BAD_ROLLOUT_ID = "bad_rollout_id"  # a row's `_ng_rollout_id` that is no id (observability_enabled only)


def _failure_record(row: dict[str, Any], failure_class: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        TASK_INDEX_KEY: row[TASK_INDEX_KEY],
        ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY],
        ATTEMPT_INDEX_KEY: row.get(ATTEMPT_INDEX_KEY, 0),
        AGENT_REF_KEY: row[AGENT_REF_KEY],
        "failure_class": failure_class,
        "message": message[:4000],
        **extra,
        "timestamp": now(),
    }


def _server_failure(row: dict[str, Any], exc: ServerError) -> dict[str, Any]:
    """A failure record for a ServerError; an agent's typed body `{"error": {"type", "message"}}` gives the class."""
    failure = typed_failure(exc)
    extra: dict[str, Any] = {"transient": is_transient(exc)}
    if failure.status_code is not None:
        extra["status_code"] = failure.status_code
    if failure.failed_server:
        extra["failed_server"] = failure.failed_server
    if failure.response is not None:  # the trajectory a failed /verify got (simple_agent): to debug the verifier
        extra["response"] = failure.response
    if failure.trajectory is not None:  # the capture record of the failed rollout (observability_enabled)
        extra[NG_TRAJECTORY_KEY] = failure.trajectory
    return _failure_record(row, failure.failure_class, failure.message, **extra)


async def run_rollout(
    client: ServerClient, row: dict[str, Any], *, observe: bool = False
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """One rollout: POST a dispatched row (with `agent_ref`, `_ng_task_index`, `_ng_rollout_index`) to its agent's
    `/run`. Returns `(output row, None)`, or `(None, failure record)` when it failed (a `ServerError`, or an answer
    without a numeric finite reward): a failure is a value with its class and message, never a reward of 0. A NeMo
    Gym 0.7.0 materialized task goes to its environment server as an episode (`episode_request`); its rollout is
    the episode's result as 0.7.0 stores it (`episode_rollout`), not merged over the row.

    `observe` (NeMo Gym 0.7.0's `observability_enabled`): the row goes to `/ng-rollout/<rollout id>/run`
    (`capture_rollout_id`), where an agent that captures answers the rollout's `ng_trajectory`, and the rollout
    gets its `ng_perf` (`nemo_gym.collect.perf`). Episodes of environment servers are not captured."""
    episode = taskset_of(row) is not None
    path = "/run"
    if observe and not episode:
        try:
            path = rollout_path(capture_rollout_id(row), path)
        except DataError as exc:
            return None, _failure_record(row, BAD_ROLLOUT_ID, str(exc), **{TERMINAL: True})
    started = time.monotonic()
    try:
        answer = await client.post(dispatch_target(row), path, episode_request(row) if episode else row)
    except ServerError as exc:
        return None, _server_failure(row, exc)
    except ValueError as exc:  # a 2xx answer that is not JSON
        return None, _failure_record(row, BAD_VERIFY_ANSWER, f"answer is not JSON: {exc}")
    if episode and (record := episode_rollout(answer)) is not None:
        answer = {**record, ENVIRONMENT_SERVER_KEY: row[ENVIRONMENT_SERVER_KEY]}
        row = {
            k: v for k, v in row.items() if k in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY, AGENT_REF_KEY)
        }
    if (episode_failure := nemo_gym_failure(answer)) is not None:
        failure_class, message, transient = episode_failure
        terminal = {} if transient else {TERMINAL: True}  # 0.7.0's `_ng_failure_terminal`: a rerun does not retry it
        return None, _failure_record(row, failure_class, message, transient=transient, **terminal)
    if not isinstance(answer, dict) or not is_reward(answer.get("reward")):
        got = repr(answer.get("reward")) if isinstance(answer, dict) else f"a {type(answer).__name__}"
        return None, _failure_record(
            row, BAD_VERIFY_ANSWER, f"verify answer has no numeric finite `reward` (got {got})"
        )
    keys = {
        TASK_INDEX_KEY: row[TASK_INDEX_KEY],
        ROLLOUT_INDEX_KEY: row[ROLLOUT_INDEX_KEY],
        AGENT_REF_KEY: row[AGENT_REF_KEY],
    }
    rollout = {**row, **answer, **keys}
    if observe and (perf := ng_perf(answer.get(NG_TRAJECTORY_KEY), (time.monotonic() - started) * 1000)) is not None:
        rollout[NG_PERF_KEY] = perf
    return rollout, None
