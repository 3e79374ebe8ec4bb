"""`RolloutPathPrefix`: the ASGI middleware that takes NeMo Gym 0.7.0's rollout path prefix off a request (installed
by `nemo_gym.serving.server.BaseServer.build_app`).

NeMo Gym 0.7.0's agents call their model server at `/ng-rollout/<rollout id>/v1/responses` (its
`rollout_correlation.RolloutContextMiddleware`: the id, e.g. `3-0` for task 3, repeat 0, ties a call to its rollout);
its model servers strip the prefix and answer the route that follows. Ours do the same, so a 0.7.0 agent (a session
agent behind a `single_agent_turn` environment server) runs on our model servers. The id is kept in the ASGI scope
(`scope["state"]["rollout_id"]`) for a route that wants it; 0.7.0's training token capture
(`/ng-rollout/<id>/training-token-capture/...`) is not served (404): our model servers return token ids and log-probs
in every answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["ROLLOUT_ID_PATTERN", "ROLLOUT_PATH_PREFIX", "RolloutPathPrefix", "rollout_path"]

ROLLOUT_PATH_PREFIX = "ng-rollout"
# the id: a path segment of characters that survive a round trip, no leading dot (NeMo Gym's ROLLOUT_ID_PATTERN)
_ID = "[A-Za-z0-9][A-Za-z0-9._-]*"
ROLLOUT_ID_PATTERN = re.compile(rf"^{_ID}$")
_PREFIX = re.compile(rf"^/{ROLLOUT_PATH_PREFIX}/(?P<rollout_id>{_ID})(?P<rest>/.*)$")


def rollout_path(rollout_id: str, path: str) -> str:
    """`path` (e.g. `/run`) under rollout `rollout_id`'s prefix: `/ng-rollout/<rollout_id>/run`."""
    return f"/{ROLLOUT_PATH_PREFIX}/{rollout_id}{path}"


class RolloutPathPrefix:
    """ASGI middleware: `/ng-rollout/<id>/<rest>` is served as `/<rest>`, `<id>` in `scope["state"]["rollout_id"]`."""

    def __init__(self, app: Callable):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        match = _PREFIX.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is not None:
            rest = match.group("rest")
            state = {**scope.get("state", {}), "rollout_id": match.group("rollout_id")}
            scope = {**scope, "path": rest, "raw_path": rest.encode(), "state": state}
        await self.app(scope, receive, send)
