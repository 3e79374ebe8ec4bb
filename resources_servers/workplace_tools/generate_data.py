"""Generate workplace_tools' bundled tasks, deterministically: `python
resources_servers/workplace_tools/generate_data.py`.

Each task: a random office week (4-6 calendar events, 4-6 inventory items) drawn with `random.Random(SEED + i)`,
and one or two requests written in plain words (schedule, move, shorten or cancel a meeting; add a product,
record a delivery or usage, correct a stock count, drop a product). The `expected_state` is computed by applying
the requests with the same operations the server runs (`workplace.py`), so every task is solvable with the
tools. Rows carry the tool schemas of the server (`tool_schemas()`, as `GET /tools` gives them).
Writes `data/tasks.jsonl` (60 tasks) and `data/example.jsonl` (the first 5).
"""

from __future__ import annotations

import copy
import datetime
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent
REPO = FOLDER.parents[1]
NUM_TASKS = 60
SEED = 7000
MONDAY = datetime.date(2025, 3, 10)
TITLES = [
    "Team sync",
    "Budget review",
    "Vendor call",
    "Design critique",
    "1:1 with Priya",
    "Hiring panel",
    "Sprint planning",
    "Customer demo",
    "Security training",
    "Offsite prep",
    "Quarterly report",
    "Lunch and learn",
    "Board prep",
    "Retro",
]
NEW_TITLES = [
    "Product roadmap",
    "Interview: backend role",
    "Fire drill briefing",
    "Partner workshop",
    "Tax filing check-in",
]
PRODUCTS = [
    "printer paper (ream)",
    "USB-C cable",
    "whiteboard marker",
    "stapler",
    "coffee beans (kg)",
    "notebook",
    "HDMI adapter",
    "desk lamp",
    "toner cartridge",
    "sticky notes (pack)",
    "AA battery",
    "ethernet cable",
]
NEW_PRODUCTS = ["laptop stand", "webcam", "ergonomic mouse", "monitor arm", "label maker"]
STARTS = ["09:00", "09:30", "10:00", "11:00", "13:00", "14:00", "14:30", "15:00", "16:00"]
DURATIONS = [15, 30, 45, 60, 90]
SYSTEM = (
    "You are an office assistant with tools for the team calendar and the supply inventory. Today is Monday "
    f"{MONDAY.isoformat()}. Look up ids with list_events and list_items before changing anything, make exactly the "
    "requested changes with the tools, then reply with a one-line summary."
)

sys.path.insert(0, str(REPO))
from nemo_gym.serving.entrypoint import load_server_class  # noqa: E402
from nemo_gym.serving.module_loading import script_package  # noqa: E402

if (
    not __package__
):  # run as a script (`python generate_data.py`): its relative imports resolve in this folder's package (PEP 366)
    __package__ = script_package(__file__)

from . import workplace  # noqa: E402  # the module object app.py uses


def day_name(date: str) -> str:
    return datetime.date.fromisoformat(date).strftime("%A %Y-%m-%d")


def random_week(rng: random.Random) -> dict[str, Any]:
    """An `initial_state`: events with distinct titles on the week's days, items with distinct names."""
    events = [
        {
            "event_id": f"E{101 + n}",
            "title": title,
            "date": (MONDAY + datetime.timedelta(days=rng.randrange(5))).isoformat(),
            "start": rng.choice(STARTS),
            "duration_minutes": rng.choice(DURATIONS),
        }
        for n, title in enumerate(rng.sample(TITLES, rng.randint(4, 6)))
    ]
    items = [
        {"item_id": f"I{101 + n}", "name": name, "quantity": rng.randint(2, 60)}
        for n, name in enumerate(rng.sample(PRODUCTS, rng.randint(4, 6)))
    ]
    return {"events": events, "items": items}


# Each request picks its target from the state, changes the state with the server's operations, and says in words what
# to do.
def schedule(rng: random.Random, state: dict[str, Any]) -> str:
    title, date = rng.choice(NEW_TITLES), (MONDAY + datetime.timedelta(days=rng.randrange(1, 5))).isoformat()
    start, duration = rng.choice(STARTS), rng.choice(DURATIONS)
    workplace.create_event(state, title, date, start, duration)
    return f"Schedule a {duration}-minute '{title}' on {day_name(date)} at {start}."


def move(rng: random.Random, state: dict[str, Any]) -> str:
    event = rng.choice(list(state["events"].values()))
    start = rng.choice([s for s in STARTS if s != event["start"]])
    workplace.update_event(state, event["event_id"], start=start)
    return f"Move '{event['title']}' on {day_name(event['date'])} to {start}, same day and length."


def shift_day(rng: random.Random, state: dict[str, Any]) -> str:
    event = rng.choice(list(state["events"].values()))
    date = (
        MONDAY
        + datetime.timedelta(
            days=rng.choice([d for d in range(5) if (MONDAY + datetime.timedelta(days=d)).isoformat() != event["date"]])
        )
    ).isoformat()
    old = event["date"]
    workplace.update_event(state, event["event_id"], date=date)
    return f"Push '{event['title']}' from {day_name(old)} to {day_name(date)}, same time."


def resize(rng: random.Random, state: dict[str, Any]) -> str:
    event = rng.choice(list(state["events"].values()))
    duration = rng.choice([d for d in DURATIONS if d != event["duration_minutes"]])
    workplace.update_event(state, event["event_id"], duration_minutes=duration)
    return f"'{event['title']}' on {day_name(event['date'])} should last {duration} minutes."


def cancel(rng: random.Random, state: dict[str, Any]) -> str:
    event = rng.choice(list(state["events"].values()))
    workplace.delete_event(state, event["event_id"])
    return f"Cancel '{event['title']}' on {day_name(event['date'])}."


def new_product(rng: random.Random, state: dict[str, Any]) -> str:
    name, quantity = rng.choice(NEW_PRODUCTS), rng.randint(1, 40)
    workplace.add_item(state, name, quantity)
    return f"We started stocking '{name}': add it to the inventory with {quantity} units."


def delivery(rng: random.Random, state: dict[str, Any]) -> str:
    item, received = rng.choice(list(state["items"].values())), rng.randint(2, 30)
    workplace.update_quantity(state, item["item_id"], item["quantity"] + received)
    return f"A delivery brought {received} more '{item['name']}'; update the stock."


def usage(rng: random.Random, state: dict[str, Any]) -> str:
    item = rng.choice([i for i in state["items"].values() if i["quantity"] >= 2])
    used = rng.randint(1, item["quantity"] - 1)
    workplace.update_quantity(state, item["item_id"], item["quantity"] - used)
    return f"The team used {used} '{item['name']}'; update the stock."


def recount(rng: random.Random, state: dict[str, Any]) -> str:
    item = rng.choice(list(state["items"].values()))
    counted = rng.choice([q for q in range(0, 80) if q != item["quantity"]])
    workplace.update_quantity(state, item["item_id"], counted)
    return f"A stock count found {counted} '{item['name']}'; correct the inventory."


def discontinue(rng: random.Random, state: dict[str, Any]) -> str:
    item = rng.choice(list(state["items"].values()))
    workplace.remove_item(state, item["item_id"])
    return f"We no longer stock '{item['name']}'; remove it from the inventory."


CALENDAR: list[Callable] = [schedule, move, shift_day, resize, cancel]
INVENTORY: list[Callable] = [new_product, delivery, usage, recount, discontinue]


def as_row_state(state: dict[str, Any]) -> dict[str, Any]:
    return {"events": list(state["events"].values()), "items": list(state["items"].values())}


def task_row(index: int, tools: list[dict[str, Any]]) -> dict[str, Any]:
    rng = random.Random(SEED + index)
    initial = random_week(rng)
    state = workplace.load(workplace.WorkplaceState.model_validate(copy.deepcopy(initial)))
    kinds = [rng.choice(CALENDAR + INVENTORY)] if index % 2 == 0 else [rng.choice(CALENDAR), rng.choice(INVENTORY)]
    requests = [kind(rng, state) for kind in kinds]
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": " ".join(requests)}],
            "tools": tools,
        },
        "initial_state": initial,
        "expected_state": as_row_state(state),
        "task_id": f"workplace-{index:03d}",
        "request_kinds": [kind.__name__ for kind in kinds],
    }


def task_rows() -> list[dict[str, Any]]:
    tools = load_server_class(FOLDER / "app.py")().tool_schemas()
    return [task_row(i, tools) for i in range(NUM_TASKS)]


def main() -> None:
    rows = task_rows()
    (FOLDER / "data" / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (FOLDER / "data" / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    print(f"wrote {len(rows)} tasks and 5 examples to {FOLDER / 'data'}")


if __name__ == "__main__":
    main()
