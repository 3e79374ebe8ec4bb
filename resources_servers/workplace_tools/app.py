"""workplace_tools: a calendar and an inventory per rollout; the task is to reach a target state with the tools.

`seed_session` loads the row's `initial_state` into the session; eight tools read and change it (errors such
as an unknown id or a bad date come back as `{"error": ...}` for the model to see, not as an HTTP error);
`verify` compares the session's final state with the row's `expected_state`, ids ignored (see
`workplace.canonical`). A session that was never seeded (a rollout scored again offline) is rebuilt by
replaying the trajectory's function calls on `initial_state`. State and operations: `workplace.py`.
"""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import Session

from . import workplace

STATE = "state"


class WorkplaceStart(BaseModel):
    """The task field both bodies read, declared once."""

    initial_state: workplace.WorkplaceState = Field(description="the calendar and inventory the rollout starts from")


class WorkplaceSeed(WorkplaceStart, SeedRequest):
    """`/seed_session` body: the row (422 when its `initial_state` is missing or malformed)."""


class WorkplaceVerifyRequest(WorkplaceStart, VerifyRequest):
    """`/verify` body: the row plus the rollout's `response`."""

    expected_state: workplace.WorkplaceState = Field(
        description="the calendar and inventory the task asks for (ids ignored)"
    )


def apply(state: dict[str, Any] | None, operation: str, **arguments: Any) -> dict[str, Any]:
    """Run an operation of `workplace` on `state`; a rejected call becomes `{"error": message}`."""
    if state is None:
        return {"error": "no workplace in this session: it was not seeded with a row"}
    try:
        return workplace.OPERATIONS[operation](state, **arguments)
    except workplace.ToolError as exc:
        return {"error": str(exc)}


def arguments_model(operation: str) -> type[BaseModel]:
    """The arguments of an operation (all but `state`) as a pydantic model, as strict as a tool route's."""
    fn = workplace.OPERATIONS[operation]
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]
    fields = {p.name: (hints[p.name], ... if p.default is inspect.Parameter.empty else p.default) for p in params}
    return create_model(f"{operation}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


ARGUMENTS = {name: arguments_model(name) for name in workplace.OPERATIONS}


def replay(state: dict[str, Any], response: dict[str, Any]) -> int:
    """Apply the trajectory's function calls to `state` as the tool routes would (calls with unparsable or
    invalid arguments, or unknown names, change nothing). Returns the number of calls applied."""
    applied = 0
    for call in Trajectory.of(response).function_calls:
        if call.name not in workplace.OPERATIONS or call.arguments is None:
            continue
        try:
            arguments = ARGUMENTS[call.name].model_validate(call.arguments)
            workplace.OPERATIONS[call.name](state, **dict(arguments))
            applied += 1
        except (ValueError, TypeError, ValidationError, workplace.ToolError):
            continue
    return applied


class WorkplaceToolsServer(ResourcesServer):
    """Calendar + inventory. Reward range: [0.0, 1.0], binary: 1.0 when the final state is the expected one."""

    seed_request_type = WorkplaceSeed
    verify_request_type = WorkplaceVerifyRequest

    async def seed_session(self, row: WorkplaceSeed, session: Session) -> dict[str, Any]:
        """Load the row's `initial_state`.

        Raises:
            HTTPException: 422 when a record has a bad value or a repeated id (`workplace.load`); a missing or
                ill-typed `initial_state` got its 422 before this is called.
        """
        try:
            session[STATE] = workplace.load(row.initial_state)
        except workplace.ToolError as exc:
            raise HTTPException(422, f"initial_state: {exc}") from exc
        return {}

    @tool
    async def create_event(
        self, title: str, date: str, start: str, duration_minutes: int, session: Session
    ) -> dict[str, Any]:
        """Create a calendar event. date: YYYY-MM-DD; start: HH:MM (24 h); duration_minutes: 1-720. Returns the event with its new event_id."""  # noqa: E501
        return apply(
            session.get(STATE), "create_event", title=title, date=date, start=start, duration_minutes=duration_minutes
        )

    @tool
    async def list_events(self, session: Session, date: str | None = None) -> dict[str, Any]:
        """List calendar events (event_id, title, date, start, duration_minutes), all or only those on date (YYYY-MM-DD)."""  # noqa: E501
        return apply(session.get(STATE), "list_events", date=date)

    @tool
    async def update_event(
        self,
        event_id: str,
        session: Session,
        title: str | None = None,
        date: str | None = None,
        start: str | None = None,
        duration_minutes: int | None = None,
    ) -> dict[str, Any]:
        """Change an event's title, date (YYYY-MM-DD), start (HH:MM) or duration_minutes; fields left null stay. Returns the event."""  # noqa: E501
        return apply(
            session.get(STATE),
            "update_event",
            event_id=event_id,
            title=title,
            date=date,
            start=start,
            duration_minutes=duration_minutes,
        )

    @tool
    async def delete_event(self, event_id: str, session: Session) -> dict[str, Any]:
        """Delete a calendar event by its event_id."""
        return apply(session.get(STATE), "delete_event", event_id=event_id)

    @tool
    async def add_item(self, name: str, quantity: int, session: Session) -> dict[str, Any]:
        """Add a new product to the inventory with its quantity (0 or more). Returns the item with its new item_id."""
        return apply(session.get(STATE), "add_item", name=name, quantity=quantity)

    @tool
    async def list_items(self, session: Session) -> dict[str, Any]:
        """List the inventory: item_id, name and quantity of every product."""
        return apply(session.get(STATE), "list_items")

    @tool
    async def update_quantity(self, item_id: str, quantity: int, session: Session) -> dict[str, Any]:
        """Set the quantity in stock of an item (the new total, 0 or more). Returns the item."""
        return apply(session.get(STATE), "update_quantity", item_id=item_id, quantity=quantity)

    @tool
    async def remove_item(self, item_id: str, session: Session) -> dict[str, Any]:
        """Remove a product from the inventory by its item_id."""
        return apply(session.get(STATE), "remove_item", item_id=item_id)

    async def verify(self, request: WorkplaceVerifyRequest, session: Session) -> VerifyResult:
        """1.0 when the final events and items equal `expected_state` (ids ignored), else 0.0; components give
        the overlap of each part."""
        state = session.get(STATE)
        replayed = state is None
        if replayed:
            try:
                state = workplace.load(request.initial_state)
            except workplace.ToolError as exc:
                raise HTTPException(422, f"initial_state: {exc}") from exc
            replay(state, request.response)
        events, items = workplace.canonical(state)
        expected_events, expected_items = workplace.canonical(request.expected_state)
        exact = events == expected_events and items == expected_items
        components = {
            "calendar": workplace.overlap(expected_events, events),
            "inventory": workplace.overlap(expected_items, items),
        }
        return VerifyResult(
            reward=float(exact),
            reward_components=components,
            replayed=replayed,
            failure_reason=None if exact else "final_state_differs",
        )
