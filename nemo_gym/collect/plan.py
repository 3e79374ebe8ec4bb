"""Which rollouts a collection runs (`RolloutPlan`): for each task, the agents its rollouts go to and how many each
runs, from `num_repeats` (an int, or NeMo Gym 0.7.0's dict keyed by agent or routing key) and NeMo Gym 0.7.0's
`fan_out` (`{<routing key>: [agent, ...]}`: a row run once per listed agent).

A row's routing key is its `agent_ref` name as written in the data, else its taskset, else its `task_source` (before
`agent_map` re-routes it: `nemo_gym.collect.tasks.routing_key`). The rules are 0.7.0's collector's
(`RolloutCollectionHelper._preprocess_raw_rows`):

- `fan_out[<key>]` lists the agents a matching row runs through, each `num_repeats` times; other rows run through
  their own agent. A materialized task (its taskset's environment server runs it) is never fanned out.
- `num_repeats` as a dict is keyed by the dispatched agent (a fan-out target, or the row's agent after `agent_map`)
  or by the routing key; the agent wins when both have an entry; `_default` is the fallback. A row no entry
  matches is refused before any rollout; an entry that matches no row is warned about (a typo?).
- A task's rollouts are numbered from 0 across its agents, in the order `fan_out` lists them (the first agent's k
  rollouts 0..k-1, the second's k..2k-1); all share the task's index. With `interleave_repeats`, rollouts start
  rollout index by rollout index (0.7.0 sorts its rows by rollout index, stably).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

from nemo_gym.collect.files import Pair
from nemo_gym.collect.tasks import taskset_of
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import AGENT_REF_KEY

__all__ = ["DEFAULT_KEY", "RolloutPlan", "TaskAgent", "check_fan_out", "plan_rollouts"]

DEFAULT_KEY = "_default"  # num_repeats' fallback entry (NeMo Gym 0.7.0's name)
RepeatSpec = int | Mapping[str, int]


@dataclass(frozen=True)
class TaskAgent:
    """The rollouts of one task through one agent: the task row as sent (its `agent_ref` that agent's; None while a
    `task_source` row awaits its agent), the rollout index of the first, and how many."""

    task_index: int
    row: dict[str, Any]
    first: int
    count: int


@dataclass
class RolloutPlan:
    """Every rollout of a collection: `entries` in task order (a task with fan-out has one per agent, in order).

    `num_repeats` is the int every task runs through its one agent, when that is the plan (then the plan is the
    plain `tasks × num_repeats` one, and its fingerprint and state are those of earlier releases); else None.
    """

    entries: list[TaskAgent]
    num_tasks: int
    num_repeats: int | None

    @classmethod
    def uniform(cls, tasks: Sequence[dict[str, Any]], num_repeats: int) -> RolloutPlan:
        """`num_repeats` rollouts of each task through its own agent."""
        return cls([TaskAgent(t, task, 0, num_repeats) for t, task in enumerate(tasks)], len(tasks), num_repeats)

    def rollouts_per_task(self) -> list[int]:
        """[num_tasks]: how many rollouts each task runs, over all its agents."""
        counts = [0] * self.num_tasks
        for entry in self.entries:
            counts[entry.task_index] += entry.count
        return counts

    @property
    def total(self) -> int:
        """How many rollouts in all."""
        return sum(entry.count for entry in self.entries)

    def pairs(self, interleave_repeats: bool = False) -> list[Pair]:
        """Every (task index, rollout index), in the order they start: task by task (aabbcc), or with
        `interleave_repeats` rollout index by rollout index (abcabc)."""
        ordered = [(e.task_index, r) for e in self.entries for r in range(e.first, e.first + e.count)]
        return sorted(ordered, key=lambda pair: pair[1]) if interleave_repeats else ordered

    @cached_property
    def _row_by_pair(self) -> dict[Pair, dict[str, Any]]:
        return {(e.task_index, r): e.row for e in self.entries for r in range(e.first, e.first + e.count)}

    def row_of(self) -> Callable[[Pair], dict[str, Any]]:
        """pair -> the task row it is sent with (its agent's); built once per plan (the sinks and the dispatch
        both look rows up)."""
        return self._row_by_pair.__getitem__

    def rows(self) -> list[dict[str, Any]]:
        """Each entry's row, in order (the rows whose agents are checked and routed before any rollout)."""
        return [entry.row for entry in self.entries]

    def fingerprint(self, *, add_seed: bool = False) -> str:
        """sha256 (hex) over the rows as sent (keys sorted), the rollouts each runs and `add_seed`: the same for the
        same plan in every run. A uniform plan hashes as earlier releases did (`num_repeats=<n>` and the task
        rows), so their outputs resume."""
        if self.num_repeats is not None:
            digest = hashlib.sha256(f"num_repeats={self.num_repeats}\n".encode())
        else:
            counts = [(e.task_index, e.first, e.count) for e in self.entries]
            digest = hashlib.sha256(b"rollouts=" + orjson.dumps(counts) + b"\n")
        if add_seed:
            digest.update(b"add_seed\n")
        for row in self.rows():
            digest.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
            digest.update(b"\n")
        return digest.hexdigest()

    def state_repeats(self) -> int | list[int]:
        """What `<out>_state.json` records as `num_repeats`: the int of a uniform plan, else the rollouts of each
        task ([num_tasks])."""
        return self.num_repeats if self.num_repeats is not None else self.rollouts_per_task()


def check_fan_out(fan_out: Mapping[str, Sequence[str]]) -> None:
    """NeMo Gym 0.7.0's checks of `fan_out`.

    Raises:
        ValueError: an entry lists no agent (it would drop every matching row) or an agent twice.
    """
    for key, agents in fan_out.items():
        if not agents:
            raise ValueError(f"fan_out[{key!r}] lists no agent: every matching row would be dropped")
        if twice := sorted({a for a in agents if list(agents).count(a) > 1}):
            raise ValueError(f"fan_out[{key!r}] lists {twice} more than once: use num_repeats for repetition")


def plan_rollouts(
    tasks: Sequence[dict[str, Any]],
    routing_keys: Sequence[str | None],
    num_repeats: RepeatSpec = 1,
    fan_out: Mapping[str, Sequence[str]] | None = None,
    where: Callable[[int], str] | None = None,
) -> RolloutPlan:
    """The rollouts of `tasks` (materialized: their `agent_ref` after `agent_map` and `agent_name`, None for a
    `task_source` row), by the rules of the module docstring. `routing_keys[t]`: task t's routing key as written in
    the data (`nemo_gym.collect.tasks.routing_key` of the raw row).

    Raises:
        DataError: (`where(t): ...`) with `num_repeats` a dict, a task no entry and no `_default` matches (the
            first, with every unmatched key named).
    """
    where = where or (lambda index: f"row {index}")
    fan_out = fan_out or {}
    if isinstance(num_repeats, int) and not any(key in fan_out for key in routing_keys if key is not None):
        return RolloutPlan.uniform(tasks, num_repeats)
    entries: list[TaskAgent] = []
    missing: dict[str, int] = {}
    seen: set[str] = set()
    for t, (task, key) in enumerate(zip(tasks, routing_keys, strict=True)):
        own = (task.get(AGENT_REF_KEY) or {}).get("name")
        fanned = key is not None and key in fan_out and taskset_of(task) is None
        targets = list(fan_out[key]) if fanned else [own]
        first = 0
        for target in targets:
            keys = [k for k in dict.fromkeys((target, key)) if k is not None]
            seen.update(keys)
            count = _repeats(num_repeats, keys)
            if count is None:
                missing.setdefault(" / ".join(keys) or "(no agent, no task_source)", t)
                continue
            row = task if target in (None, own) else {**task, AGENT_REF_KEY: {"name": target}}
            entries.append(TaskAgent(t, row, first, count))
            first += count
    if missing:
        key, t = next(iter(missing.items()))
        raise DataError(
            f"{where(t)}: num_repeats has no entry for {key} and no {DEFAULT_KEY!r} (unmatched: {', '.join(missing)};"
            f" its entries: {', '.join(sorted(num_repeats)) or 'none'})"
        )
    if not isinstance(num_repeats, int) and (unused := sorted(set(num_repeats) - seen - {DEFAULT_KEY})):
        print(f"num_repeats: no row routes by {', '.join(unused)} (a typo?)", file=sys.stderr)
    return RolloutPlan(entries, len(tasks), None)


def _repeats(num_repeats: RepeatSpec, keys: Sequence[str]) -> int | None:
    """The rollouts of a row whose agent and routing key are `keys` (the agent first); None when a dict has no
    entry for either and no `_default`."""
    if isinstance(num_repeats, int):
        return num_repeats
    return next((num_repeats[k] for k in keys if k in num_repeats), num_repeats.get(DEFAULT_KEY))
