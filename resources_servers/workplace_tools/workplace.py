"""The workplace state (a calendar and an inventory) and the operations on it, with no server.

A state is a plain dict, so it lives in a `Session` and copies and compares as data:

    {"events": {event_id: {event_id, title, date, start, duration_minutes}},
     "items": {item_id: {item_id, name, quantity}},
     "next_event": int, "next_item": int}   # numbers of the next ids: E<n>, I<n>

Operations check their values and raise `ToolError` with a message for the model (unknown id, bad date, ...).
`canonical` drops the ids: two states are equal when they hold the same events (title case-folded, date,
start, duration) and the same items (name case-folded, quantity), whatever ids they got.
"""

from __future__ import annotations

import datetime
import re
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_DURATION_MINUTES = 720
MAX_QUANTITY = 1_000_000
MAX_TEXT = 100


class ToolError(ValueError):
    """A tool call the state rejects; its message goes back to the model."""


class EventRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: str | None = Field(None, description="id; assigned on load when absent")
    title: str
    date: str = Field(description="YYYY-MM-DD")
    start: str = Field(description="HH:MM, 24 h")
    duration_minutes: int


class ItemRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_id: str | None = Field(None, description="id; assigned on load when absent")
    name: str
    quantity: int


class WorkplaceState(BaseModel):
    """A state as written in a dataset row (`initial_state`, `expected_state`)."""

    model_config = ConfigDict(extra="forbid")
    events: list[EventRecord] = Field(default_factory=list)
    items: list[ItemRecord] = Field(default_factory=list)


# -- checks ------------------------------------------------------------------------------------------------
def check_text(value: str, what: str) -> str:
    value = value.strip()
    if not value or len(value) > MAX_TEXT:
        raise ToolError(f"{what} must be 1 to {MAX_TEXT} characters")
    return value


def check_date(value: str) -> str:
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:
        raise ToolError(f"date must be a calendar date YYYY-MM-DD, got {value[:40]!r}") from None


def check_start(value: str) -> str:
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", value.strip())
    if not match or int(match[1]) > 23 or int(match[2]) > 59:
        raise ToolError(f"start must be a time HH:MM (24 h), got {value[:40]!r}")
    return f"{int(match[1]):02d}:{match[2]}"


def check_duration(value: int) -> int:
    if not 1 <= value <= MAX_DURATION_MINUTES:
        raise ToolError(f"duration_minutes must be 1 to {MAX_DURATION_MINUTES}, got {value}")
    return value


def check_quantity(value: int) -> int:
    if not 0 <= value <= MAX_QUANTITY:
        raise ToolError(f"quantity must be 0 to {MAX_QUANTITY}, got {value}")
    return value


def _number(identifier: str) -> int:
    digits = re.sub(r"\D", "", identifier)
    return int(digits) if digits else 0


# -- state -------------------------------------------------------------------------------------------------
def load(state: WorkplaceState) -> dict[str, Any]:
    """The session state of a row's `initial_state` (ids kept, missing ones assigned in order).

    Raises:
        ToolError: a record with a bad value or a repeated id.
    """
    events: dict[str, dict[str, Any]] = {}
    items: dict[str, dict[str, Any]] = {}
    next_event = 1 + max([_number(e.event_id) for e in state.events if e.event_id] + [100])
    next_item = 1 + max([_number(i.item_id) for i in state.items if i.item_id] + [100])
    for event in state.events:
        if not event.event_id:
            event = event.model_copy(update={"event_id": f"E{next_event}"})
            next_event += 1
        if event.event_id in events:
            raise ToolError(f"repeated event_id {event.event_id}")
        events[event.event_id] = {
            "event_id": event.event_id,
            "title": check_text(event.title, "title"),
            "date": check_date(event.date),
            "start": check_start(event.start),
            "duration_minutes": check_duration(event.duration_minutes),
        }
    for item in state.items:
        if not item.item_id:
            item = item.model_copy(update={"item_id": f"I{next_item}"})
            next_item += 1
        if item.item_id in items:
            raise ToolError(f"repeated item_id {item.item_id}")
        items[item.item_id] = {
            "item_id": item.item_id,
            "name": check_text(item.name, "name"),
            "quantity": check_quantity(item.quantity),
        }
    return {"events": events, "items": items, "next_event": next_event, "next_item": next_item}


def canonical(state: dict[str, Any] | WorkplaceState) -> tuple[Counter, Counter]:
    """(events, items) as multisets of records without ids, titles and names case-folded."""
    if isinstance(state, WorkplaceState):
        events = [e.model_dump() for e in state.events]
        items = [i.model_dump() for i in state.items]
    else:
        events, items = list(state["events"].values()), list(state["items"].values())
    return (
        Counter((e["title"].strip().casefold(), e["date"], e["start"], e["duration_minutes"]) for e in events),
        Counter((i["name"].strip().casefold(), i["quantity"]) for i in items),
    )


def overlap(expected: Counter, actual: Counter) -> float:
    """Matched records / the larger count, in [0, 1]; 1.0 when both are empty."""
    larger = max(sum(expected.values()), sum(actual.values()))
    return sum((expected & actual).values()) / larger if larger else 1.0


# -- calendar ----------------------------------------------------------------------------------------------
def _event(state: dict[str, Any], event_id: str) -> dict[str, Any]:
    if event_id not in state["events"]:
        raise ToolError(f"no event with event_id {event_id[:40]!r}; list_events shows the ids")
    return state["events"][event_id]


def create_event(state: dict[str, Any], title: str, date: str, start: str, duration_minutes: int) -> dict[str, Any]:
    event = {
        "event_id": f"E{state['next_event']}",
        "title": check_text(title, "title"),
        "date": check_date(date),
        "start": check_start(start),
        "duration_minutes": check_duration(duration_minutes),
    }
    state["events"][event["event_id"]] = event
    state["next_event"] += 1
    return dict(event)


def list_events(state: dict[str, Any], date: str | None = None) -> dict[str, Any]:
    day = check_date(date) if date else None
    events = sorted(
        (e for e in state["events"].values() if day is None or e["date"] == day),
        key=lambda e: (e["date"], e["start"], e["event_id"]),
    )
    return {"events": [dict(e) for e in events]}


def update_event(
    state: dict[str, Any],
    event_id: str,
    title: str | None = None,
    date: str | None = None,
    start: str | None = None,
    duration_minutes: int | None = None,
) -> dict[str, Any]:
    event = _event(state, event_id)
    changes = {
        "title": None if title is None else check_text(title, "title"),
        "date": None if date is None else check_date(date),
        "start": None if start is None else check_start(start),
        "duration_minutes": None if duration_minutes is None else check_duration(duration_minutes),
    }
    event.update({key: value for key, value in changes.items() if value is not None})
    return dict(event)


def delete_event(state: dict[str, Any], event_id: str) -> dict[str, Any]:
    _event(state, event_id)
    return {"deleted": state["events"].pop(event_id)}


# -- inventory ---------------------------------------------------------------------------------------------
def _item(state: dict[str, Any], item_id: str) -> dict[str, Any]:
    if item_id not in state["items"]:
        raise ToolError(f"no item with item_id {item_id[:40]!r}; list_items shows the ids")
    return state["items"][item_id]


def add_item(state: dict[str, Any], name: str, quantity: int) -> dict[str, Any]:
    name = check_text(name, "name")
    for item in state["items"].values():
        if item["name"].casefold() == name.casefold():
            raise ToolError(f"{name!r} is already in the inventory as {item['item_id']}; use update_quantity")
    item = {"item_id": f"I{state['next_item']}", "name": name, "quantity": check_quantity(quantity)}
    state["items"][item["item_id"]] = item
    state["next_item"] += 1
    return dict(item)


def list_items(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "items": [dict(i) for i in sorted(state["items"].values(), key=lambda i: (_number(i["item_id"]), i["item_id"]))]
    }


def update_quantity(state: dict[str, Any], item_id: str, quantity: int) -> dict[str, Any]:
    item = _item(state, item_id)
    item["quantity"] = check_quantity(quantity)
    return dict(item)


def remove_item(state: dict[str, Any], item_id: str) -> dict[str, Any]:
    _item(state, item_id)
    return {"removed": state["items"].pop(item_id)}


OPERATIONS = {
    f.__name__: f
    for f in (create_event, list_events, update_event, delete_event, add_item, list_items, update_quantity, remove_item)
}
