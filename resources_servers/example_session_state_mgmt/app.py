"""example_session_state_mgmt: a counter kept per rollout on the server; the reward checks its final value.

Matches NeMo Gym's `example_session_state_mgmt` server (0.7.0): `seed_session` starts the counter at the
row's `initial_count`; tools `increment_counter` and `get_counter_value` change and read it; `verify`
gives 1.0 when the counter equals the row's `expected_count`, and 0.0 when the session never had a
counter. The state lives in the framework's `Session` (keyed by the `X-Session-Id` header or the session
cookie), not in a dict of our own. Departure: re-seeding a session restarts its counter (the framework
clears the session first), where NeMo Gym keeps a counter that already exists; seeding twice in a row
gives the same state either way.
"""

from __future__ import annotations

from typing import Any

from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving.server import Session

COUNT_KEY = "count"


class CounterSeed(SeedRequest):
    """A `/seed_session` body: the row, with the counter's start."""

    initial_count: int


class CounterRequest(VerifyRequest):
    """A `/verify` body: the row, with the counter's expected final value, plus the rollout's `response`."""

    expected_count: int


class ExampleSessionStateMgmtServer(ResourcesServer):
    """Stateful counter. Reward range: [0.0, 1.0], binary."""

    seed_request_type = CounterSeed
    verify_request_type = CounterRequest

    async def seed_session(self, row: CounterSeed, session: Session) -> dict[str, Any]:
        """Start the counter at the row's `initial_count` (422 without it)."""
        session[COUNT_KEY] = row.initial_count
        return {}

    @tool
    async def increment_counter(self, count: int, session: Session) -> dict[str, bool]:
        """Add `count` to the counter."""
        session[COUNT_KEY] = session.get(COUNT_KEY, 0) + count
        return {"success": True}

    @tool
    async def get_counter_value(self, session: Session) -> dict[str, int]:
        """Read the counter."""
        return {"count": session.setdefault(COUNT_KEY, 0)}

    async def verify(self, request: CounterRequest, session: Session) -> VerifyResult:
        """1.0 when the session's counter equals `expected_count` (422 without it), else 0.0."""
        return VerifyResult(reward=float(COUNT_KEY in session and session[COUNT_KEY] == request.expected_count))
