"""`RolloutPathPrefix`: the ASGI middleware that takes NeMo Gym 0.7.0's rollout path prefix off a request (installed
by `nemo_gym.serving.server.BaseServer.build_app`).

NeMo Gym 0.7.0's agents call their model server at `/ng-rollout/<rollout id>/v1/responses` (its
`rollout_correlation.RolloutContextMiddleware`: the id, e.g. `3-0` for task 3, repeat 0, ties a call to its rollout);
its model servers strip the prefix and answer the route that follows. Ours do the same, so a 0.7.0 agent (a session
agent behind a `single_agent_turn` environment server) runs on our model servers. The id is kept in the ASGI scope
(`scope["state"]["rollout_id"]`) for a route that wants it. 0.7.0's training token capture prefix,
`/ng-rollout/<id>/training-token-capture/<route>`, is taken off too and sets `scope["state"]["token_capture"]`: a model
server then records the call (`nemo_gym.serving.token_capture`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import ATTEMPT_INDEX_KEY, ROLLOUT_ID_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

__all__ = [
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_PATH_PREFIX",
    "RolloutPathPrefix",
    "capture_path",
    "capture_rollout_id",
    "rollout_id_of",
    "rollout_path",
]

ROLLOUT_PATH_PREFIX = "ng-rollout"
# the id: a path segment of characters that survive a round trip, no leading dot (NeMo Gym's ROLLOUT_ID_PATTERN)
_ID = "[A-Za-z0-9][A-Za-z0-9._-]*"
ROLLOUT_ID_PATTERN = re.compile(rf"^{_ID}$")
_PREFIX = re.compile(
    rf"^/{ROLLOUT_PATH_PREFIX}/(?P<rollout_id>{_ID})(?P<capture>/training-token-capture)?(?P<rest>/.*)$"
)


def rollout_id_of(row: dict[str, Any]) -> str:
    """A dispatched row's rollout id, as NeMo Gym 0.7.0 names a rollout: its `_ng_rollout_id`, else `<task
    index>-<rollout index>`."""
    return row.get(ROLLOUT_ID_KEY) or f"{row[TASK_INDEX_KEY]}-{row[ROLLOUT_INDEX_KEY]}"


def capture_rollout_id(row: dict[str, Any]) -> str:
    """The id a rollout's capture record and its `/ng-rollout/<id>/run` path carry (0.7.0's
    `maybe_rollout_id_from_run_body`): `rollout_id_of(row)`, with `-a<n>` for a later attempt n.

    Raises:
        DataError: the row's `_ng_rollout_id` is not an id (letters, digits, `.`, `_`, `-`, not first).
    """
    explicit = row.get(ROLLOUT_ID_KEY)
    if explicit is not None and not (isinstance(explicit, str) and ROLLOUT_ID_PATTERN.match(explicit)):
        raise DataError(f"{ROLLOUT_ID_KEY} must be letters, digits, '.', '_' or '-' (not first), got {explicit!r}")
    attempt = row.get(ATTEMPT_INDEX_KEY) or 0
    return f"{rollout_id_of(row)}-a{attempt}" if attempt > 0 else rollout_id_of(row)


def rollout_path(rollout_id: str, path: str) -> str:
    """`path` (e.g. `/run`) under rollout `rollout_id`'s prefix: `/ng-rollout/<rollout_id>/run`."""
    return f"/{ROLLOUT_PATH_PREFIX}/{rollout_id}{path}"


def capture_path(rollout_id: str, path: str) -> str:
    """`path` (e.g. `/v1/responses`) under rollout `rollout_id`'s training token capture prefix:
    `/ng-rollout/<rollout_id>/training-token-capture/v1/responses`."""
    return rollout_path(rollout_id, f"/training-token-capture{path}")


class RolloutPathPrefix:
    """ASGI middleware: `/ng-rollout/<id>/<rest>` (and `/ng-rollout/<id>/training-token-capture/<rest>`) is served as
    `/<rest>`, `<id>` in `scope["state"]["rollout_id"]` (and `scope["state"]["token_capture"]` true)."""

    def __init__(self, app: Callable):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        match = _PREFIX.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is not None:
            rest = match.group("rest")
            state = {**scope.get("state", {}), "rollout_id": match.group("rollout_id")}
            if match.group("capture"):
                state["token_capture"] = True
            scope = {**scope, "path": rest, "raw_path": rest.encode(), "state": state}
        await self.app(scope, receive, send)
