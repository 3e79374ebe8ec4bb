"""A byte-offset index of a rollouts JSONL file, built in one streaming pass.

The viewer never holds the file in memory: `RolloutIndex.build` reads it line by line (orjson per line), keeps
each row's byte offset and length plus a few small table fields, and drops the parsed row. A trajectory is read
back with `RolloutIndex.read(row_id)` (one seek and one read). Text search streams the candidate rows' bytes.

Per row the index keeps (numeric columns in `array`s, strings as category codes, ~85 bytes a row):

    row            position among the file's non-blank lines (0-based); the id used everywhere here
    line           line number in the file (1-based, blank lines counted)
    task_index     `_ng_task_index`, else the row position (a file written without the collector)
    repeat         `_ng_rollout_index`, else 0
    reward         `reward` (NaN when absent or not a number)
    output_chars   characters the policy generated: assistant text, reasoning text and function-call arguments
    output_tokens  `response.usage.output_tokens` (-1 when absent)
    tool_calls     `function_call` items of `response.output`
    turns          the model's turns in `response.output` (`nemo_gym.eval.comparison.tool_calls_and_turns`)
    environment    `agent_ref.name`, else `dataset`, else "(none)"
    stop_reason    `stop_reason`, else `response.incomplete_details.reason`, else `response.status`, else "(none)"

Not in the table, for comparing two files (`nemo_gym.viewer.compare`): the task key
(`nemo_gym.eval.comparison.task_key`:
`_ng_task_index`, else a digest of the prompt and agent) and the prompt digest, both as category codes.

Lines that are not a JSON object (e.g. the half-written last line of a running collection) are skipped and
counted in `skipped_lines`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from nemo_gym.common.errors import DataError
from nemo_gym.eval.comparison import TaskKey, prompt_digest, task_key, tool_calls_and_turns

__all__ = ["RolloutIndex", "RowFilter", "output_chars"]

NONE_LABEL = "(none)"
TABLE_COLUMNS = [
    "row",
    "task_index",
    "repeat",
    "reward",
    "output_chars",
    "output_tokens",
    "tool_calls",
    "turns",
    "environment",
    "stop_reason",
]
_SEARCH_BLOCK_BYTES = 1 << 20


def _text_of(content: Any) -> str:
    """The text of a message `content`: a string or a list of parts with `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def output_chars(response: Any) -> int:
    """Characters the policy generated in `response.output` (assistant text, reasoning, function-call arguments)."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return 0
    total = 0
    for item in response["output"]:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            total += len(_text_of(item.get("content")))
        elif kind == "reasoning":
            total += sum(len(_text_of([part])) for part in (item.get("summary") or []) + (item.get("content") or []))
        elif kind == "function_call":
            total += len(item.get("arguments") or "")
    return total


def _environment(row: dict[str, Any]) -> str:
    agent_ref = row.get("agent_ref")
    if isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str):
        return agent_ref["name"]
    return row["dataset"] if isinstance(row.get("dataset"), str) else NONE_LABEL


def _stop_reason(row: dict[str, Any]) -> str:
    if row.get("stop_reason") is not None:
        return str(row["stop_reason"])
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    details = response.get("incomplete_details")
    if isinstance(details, dict) and details.get("reason"):
        return str(details["reason"])
    return str(response["status"]) if response.get("status") else NONE_LABEL


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _reward(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


@dataclass(frozen=True)
class RowFilter:
    """Which rows to show. `None` bounds are open; a row without a reward passes only when both are `None`.

    `environments` empty means all; `text` is a case-insensitive substring of the row's JSON line.
    """

    reward_min: float | None = None
    reward_max: float | None = None
    environments: tuple[str, ...] = ()
    text: str = ""


@dataclass
class _Categories:
    """Strings stored as small integer codes."""

    labels: list[Any] = field(default_factory=list)
    codes: dict[Any, int] = field(default_factory=dict)

    def code(self, label: Any) -> int:
        if label not in self.codes:
            self.codes[label] = len(self.labels)
            self.labels.append(label)
        return self.codes[label]


def _view(values: array) -> np.ndarray:
    """`values` as a read-only numpy array, without a copy."""
    return np.frombuffer(values, dtype=values.typecode) if len(values) else np.zeros(0, dtype=values.typecode)


def _column(values: array, ids: np.ndarray) -> np.ndarray:
    return _view(values)[ids]


class RolloutIndex:
    """Offsets and table fields of every row of a rollouts JSONL file (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self.skipped_lines: list[int] = []
        self._offset = array("q")
        self._nbytes = array("q")
        self._line = array("q")
        self._task_index = array("q")
        self._repeat = array("q")
        self._reward = array("d")
        self._output_chars = array("q")
        self._output_tokens = array("q")
        self._tool_calls = array("q")
        self._turns = array("q")
        self._environment = array("i")
        self._stop_reason = array("i")
        self._task_key = array("i")
        self._prompt = array("i")
        self._environments = _Categories()
        self._stop_reasons = _Categories()
        self._task_keys = _Categories()
        self._prompts = _Categories()
        self._task_rows: tuple[np.ndarray, np.ndarray] | None = None  # (row ids sorted by task code, each code's start)

    @classmethod
    def build(cls, path: str | Path) -> RolloutIndex:
        """Index `path` in one streaming pass.

        Raises:
            DataError: `path` is not a file.
        """
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        index = cls(path)
        offset = 0
        with path.open("rb") as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    index._add(line, offset, line_no)
                offset += len(line)
        return index

    def _add(self, line: bytes, offset: int, line_no: int) -> None:
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            self.skipped_lines.append(line_no)
            return
        response = row.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        self._offset.append(offset)
        self._nbytes.append(len(line))
        self._line.append(line_no)
        self._task_index.append(_int_or(row.get("_ng_task_index"), len(self._task_index)))
        self._repeat.append(_int_or(row.get("_ng_rollout_index"), 0))
        self._reward.append(_reward(row.get("reward")))
        self._output_chars.append(output_chars(response))
        self._output_tokens.append(_int_or(usage.get("output_tokens") if isinstance(usage, dict) else None, -1))
        tool_calls, turns = tool_calls_and_turns(response)
        self._tool_calls.append(tool_calls)
        self._turns.append(turns)
        self._task_key.append(self._task_keys.code(task_key(row)))
        self._prompt.append(self._prompts.code(prompt_digest(row)))
        self._environment.append(self._environments.code(_environment(row)))
        self._stop_reason.append(self._stop_reasons.code(_stop_reason(row)))

    def __len__(self) -> int:
        return len(self._offset)

    @property
    def environments(self) -> list[str]:
        """The environment labels present, sorted."""
        return sorted(self._environments.labels)

    @property
    def rewards(self) -> np.ndarray:
        """Reward of every row, `(n_rows,)` float64, NaN where missing (a read-only view, no copy)."""
        return _view(self._reward)

    def column(self, name: str) -> np.ndarray:
        """A per-row column `(n_rows,)` as a read-only view: `tool_calls`, `turns`, `reward`, `task_key` or `prompt`
        (the last two as codes into `task_key_labels` / `prompt_labels`)."""
        return _view(getattr(self, f"_{name}"))

    @property
    def task_key_labels(self) -> list[TaskKey]:
        """The task keys, indexed by the codes of `column("task_key")`."""
        return self._task_keys.labels

    @property
    def prompt_labels(self) -> list[str]:
        """The prompt digests, indexed by the codes of `column("prompt")`."""
        return self._prompts.labels

    def environment_of(self, row_id: int) -> str:
        return self._environments.labels[self._environment[row_id]]

    def rows_of_task(self, key: TaskKey) -> np.ndarray:
        """The row ids of task `key` `(n_rollouts,)`, ordered by repeat then row (empty for an unknown key).

        The first call sorts the rows by task once (O(n log n)); later calls are a dictionary lookup and a slice.
        """
        code = self._task_keys.codes.get(key)
        if code is None:
            return np.zeros(0, dtype=np.int64)
        if self._task_rows is None:
            order = np.lexsort((np.arange(len(self)), _view(self._repeat), _view(self._task_key)))
            starts = np.searchsorted(_view(self._task_key)[order], np.arange(len(self._task_keys.labels) + 1))
            self._task_rows = order, starts
        order, starts = self._task_rows
        return order[starts[code] : starts[code + 1]]

    def read(self, row_id: int) -> dict[str, Any]:
        """The full row `row_id` (one seek and one read).

        Raises:
            IndexError: no such row.
        """
        if not 0 <= row_id < len(self):
            raise IndexError(f"row {row_id} is out of range (the file has {len(self)} rows)")
        with self.path.open("rb") as f:
            f.seek(self._offset[row_id])
            return orjson.loads(f.read(self._nbytes[row_id]))

    def line_number(self, row_id: int) -> int:
        return self._line[row_id]

    def filter(self, row_filter: RowFilter) -> np.ndarray:
        """Row ids that pass `row_filter`, ascending, `(n_matching,)` int64."""
        rewards = self.rewards
        keep = np.ones(len(self), dtype=bool)
        if row_filter.reward_min is not None or row_filter.reward_max is not None:
            low = -np.inf if row_filter.reward_min is None else row_filter.reward_min
            high = np.inf if row_filter.reward_max is None else row_filter.reward_max
            with np.errstate(invalid="ignore"):
                keep &= (rewards >= low) & (rewards <= high)
        if row_filter.environments:
            wanted = [self._environments.codes[e] for e in row_filter.environments if e in self._environments.codes]
            keep &= np.isin(_view(self._environment), wanted)
        row_ids = np.flatnonzero(keep)
        if row_filter.text:
            row_ids = np.array(self.search(row_ids, row_filter.text), dtype=np.int64)
        return row_ids

    def search(self, row_ids: Iterable[int], text: str) -> list[int]:
        """The rows among `row_ids` whose JSON line contains `text`, case-insensitively.

        The text is also looked for in its JSON-escaped form (a newline as `\\n`, a quote as `\\"`), so a search
        for text that spans lines or quotes finds it. Rows are read one at a time.
        """
        needles = {text.lower().encode(), orjson.dumps(text)[1:-1].lower()}
        found = []
        with self.path.open("rb", buffering=_SEARCH_BLOCK_BYTES) as f:
            for row_id in row_ids:
                f.seek(self._offset[row_id])
                line = f.read(self._nbytes[row_id]).lower()
                if any(needle in line for needle in needles):
                    found.append(int(row_id))
        return found

    def table(self, row_ids: Sequence[int] | np.ndarray) -> pd.DataFrame:
        """The table fields of `row_ids` (columns `TABLE_COLUMNS`; missing reward/tokens as NaN)."""
        ids = np.asarray(row_ids, dtype=np.int64)
        tokens = _column(self._output_tokens, ids)
        return pd.DataFrame(
            {
                "row": ids,
                "task_index": _column(self._task_index, ids),
                "repeat": _column(self._repeat, ids),
                "reward": _column(self._reward, ids),
                "output_chars": _column(self._output_chars, ids),
                "output_tokens": pd.Series(tokens, dtype="Int64").where(tokens >= 0, pd.NA),
                "tool_calls": _column(self._tool_calls, ids),
                "turns": _column(self._turns, ids),
                "environment": [self._environments.labels[c] for c in _column(self._environment, ids)],
                "stop_reason": [self._stop_reasons.labels[c] for c in _column(self._stop_reason, ids)],
            },
            columns=TABLE_COLUMNS,
        )
