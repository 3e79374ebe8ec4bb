"""JSONL helpers shared by rollout collection and profiling (orjson, one JSON object a line), and the keys the
collector adds to every row it dispatches (`TASK_INDEX_KEY`, `ROLLOUT_INDEX_KEY`; `AGENT_REF_KEY` names the agent).

Errors in a file raise `nemo_gym.common.errors.DataError` with a `file:line: what is wrong` message (lines count
from 1, blank lines count too and are skipped). Appends are crash-safe in the sense the collector needs: each
row is written with one `write` call and flushed, so after a crash at most the last line is incomplete, and
`repair_truncated_tail` cuts it off.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.common.errors import DataError

__all__ = [
    "TASK_INDEX_KEY",
    "ROLLOUT_INDEX_KEY",
    "ROLLOUT_ID_KEY",
    "NG_TRAJECTORY_KEY",
    "NG_PERF_KEY",
    "AGENT_REF_KEY",
    "iter_lines",
    "iter_jsonl",
    "parse_line",
    "read_jsonl",
    "write_jsonl",
    "write_json",
    "replace_atomically",
    "dumps_line",
    "JsonlAppender",
    "repair_truncated_tail",
]

TASK_INDEX_KEY = "_ng_task_index"  # a row's index in the collection's input file (0-based), as NeMo Gym writes it
ROLLOUT_INDEX_KEY = "_ng_rollout_index"  # which of the task's repeats (0-based)
# a row's own rollout id (NeMo Gym 0.7.0), instead of `<task index>-<rollout index>` (nemo_gym.collect.routing)
ROLLOUT_ID_KEY = "_ng_rollout_id"
# a rollout's capture record (NeMo Gym 0.7.0's, nemo_gym.env.capture) and its counts (nemo_gym.collect.perf)
NG_TRAJECTORY_KEY = "ng_trajectory"
NG_PERF_KEY = "ng_perf"
# which attempt of the rollout (NeMo Gym 0.7.0): the failures recorded for it before; set from 1 on (a first is 0)
ATTEMPT_INDEX_KEY = "_ng_attempt_index"
AGENT_REF_KEY = "agent_ref"  # `{"name": <agent instance>}`: the agent that runs the row
# the environment server (NeMo Gym 0.7.0) a row was sent to, in front of its agent, as NeMo Gym's collector stamps it
ENVIRONMENT_SERVER_KEY = "_ng_environment_server"
TASK_SOURCE_KEY = "task_source"  # NeMo Gym 0.7.0's collated rows: the instance that declared the dataset (no agent_ref)


def _describe(value: Any) -> str:
    return "a list" if isinstance(value, list) else f"a {type(value).__name__}" if value is not None else "null"


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield `(line number, text)` for each line of the UTF-8 text file `path`, numbered from 1, split at newlines only.

    `str.splitlines` is not a JSONL splitter: it also breaks at U+2028, U+2029, U+0085 and U+001C-U+001E, which JSON
    leaves unescaped inside strings (a model's output can hold them), so a valid row would read as two broken lines.

    Raises:
        OSError: the file cannot be read.
    """
    with Path(path).open(encoding="utf-8", newline="\n") as f:
        for line_no, line in enumerate(f, 1):
            yield line_no, line.rstrip("\r\n")


def parse_line(line: bytes, path: str | Path, line_no: int) -> dict[str, Any]:
    """The JSON object on line `line_no` of `path`.

    Raises:
        DataError: the line is not valid JSON or not a JSON object (named `path:line_no`).
    """
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{path}:{line_no}: not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise DataError(f"{path}:{line_no}: expected a JSON object, got {_describe(row)}")
    return row


def iter_jsonl(path: str | Path, *, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line number, row)` for each non-blank line of `path`, at most `limit` rows.

    Raises:
        DataError: the file is missing, or a line is not valid JSON or not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if limit is not None and limit <= 0:
        return
    count = 0
    with path.open("rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield line_no, parse_line(line, path, line_no)
            count += 1
            if limit is not None and count >= limit:
                return


def read_jsonl(path: str | Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    """All rows of `path` (see `iter_jsonl` for the errors raised)."""
    return [row for _, row in iter_jsonl(path, limit=limit)]


def dumps_line(row: Any) -> bytes:
    """`row` as one JSONL line (bytes, ending in a newline). numpy values are accepted."""
    return orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def replace_atomically(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, fsync'd, then `os.replace`: a reader (or a
    run killed mid-write) sees the old content or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> None:
    """Write `rows` to `path` atomically (a temporary file, fsync, then rename): readers never see half a file."""
    replace_atomically(path, b"".join(dumps_line(row) for row in rows))


def write_json(path: str | Path, value: Any) -> None:
    """Write `value` as indented JSON to `path` atomically."""
    replace_atomically(path, orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")


class JsonlAppender:
    """Append rows to a JSONL file, one `write` + `flush` per row; `close()` fsyncs.

    Use as a context manager. The parent folder is created if needed.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self.rows_written = 0

    def append(self, row: Any) -> None:
        self._file.write(dumps_line(row))
        self._file.flush()
        self.rows_written += 1

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def repair_truncated_tail(path: str | Path) -> int:
    """Cut an incomplete last line (a crash in the middle of a write) off `path`; returns the bytes removed.

    A last line without a newline that still parses as a JSON object is complete: it is kept and a newline
    is added. A missing file is left alone (0).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Find the start of the last line by reading backwards in blocks.
        start, block = size, 1 << 16
        while start > 0:
            read_from = max(0, start - block)
            f.seek(read_from)
            chunk = f.read(start - read_from)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                start = read_from + newline + 1
                break
            start = read_from
        f.seek(start)
        tail = f.read()
        try:
            complete = isinstance(orjson.loads(tail), dict)
        except orjson.JSONDecodeError:
            complete = False
        if complete:
            f.write(b"\n")
            return 0
        f.truncate(start)
        return size - start
