"""Text-to-SQL on a small shop database: the reward executes the model's query and compares result sets.

Each row holds a question and its gold query. The model answers with one SQLite query in a ```sql block; the
query runs read-only against `data/shop.sqlite`: opened with `mode=ro`, an authorizer that allows only reading
(no ATTACH, PRAGMA or writes), a time limit (a progress handler), a cap on rows and on value sizes. Reward 1.0
when its rows equal the gold query's rows (as a multiset; in order when the gold query has ORDER BY), else 0.0
with a `failure_reason`. The database is built from the SQL dump `data/shop.sql` at start-up when it is missing
or older than the dump (deterministic: the same dump gives the same database; edit the dump to change it).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import sqlite3
import tempfile
import time
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import Field

from nemo_gym.env.answers import last_assistant_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session

DATA = Path(__file__).resolve().parent / "data"
FENCE = re.compile(r"```[ \t]*(?:sql|sqlite)?[ \t]*\n?(.*?)```", re.IGNORECASE | re.DOTALL)
BARE_QUERY = re.compile(r"^\s*(?:select|with)\b", re.IGNORECASE)
READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
MAX_VALUE_BYTES = 1_000_000  # longest string or blob a query may build (no zeroblob(1e9))
FailureReason = Literal["no_sql", "sql_error", "timeout", "too_many_rows", "wrong_result"]


class SqlConfig(ServerConfig):
    time_limit_s: float = Field(2.0, gt=0, description="longest a query may run, seconds (then failure_reason timeout)")
    max_rows: int = Field(1000, ge=1, description="most rows a query may return (more: failure_reason too_many_rows)")


class SqlTask(VerifyRequest):
    """A dataset row as /verify receives it: the prompt, the model's `response`, the gold query."""

    gold_sql: str


def ensure_database(dump: Path = DATA / "shop.sql", database: Path = DATA / "shop.sqlite") -> Path:
    """`database`, (re)built from the statements of `dump` when it is missing or older, atomically (another
    process never sees a half-built file)."""
    if database.is_file() and database.stat().st_mtime >= dump.stat().st_mtime:
        return database
    fd, tmp = tempfile.mkstemp(prefix=f".{database.name}.", dir=database.parent)
    os.close(fd)
    try:
        connection = sqlite3.connect(tmp)
        with connection:
            connection.executescript(dump.read_text())
        connection.close()
        os.replace(tmp, database)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return database


class QueryError(Exception):
    """The query could not be run to the end; `reason` says why."""

    def __init__(self, reason: FailureReason, message: str):
        super().__init__(message)
        self.reason = reason


def extract_sql(text: str) -> str | None:
    """The last fenced code block of `text`, else the text itself when it starts with SELECT/WITH, else None."""
    blocks = [block.strip() for block in FENCE.findall(text) if block.strip()]
    if blocks:
        return blocks[-1]
    return text.strip() if BARE_QUERY.match(text) else None


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in READ_ACTIONS else sqlite3.SQLITE_DENY


def run_query(database: Path, sql: str, *, time_limit_s: float, max_rows: int) -> list[tuple[Any, ...]]:
    """The rows of `sql` on `database`, opened read-only.

    Raises:
        QueryError: a syntax or runtime error or a denied action (sql_error), past `time_limit_s` (timeout),
            more than `max_rows` rows (too_many_rows).
    """
    connection = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
    deadline = time.monotonic() + time_limit_s
    connection.set_authorizer(_authorize)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)  # non-zero aborts the query
    try:
        rows = connection.execute(sql).fetchmany(max_rows + 1)
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc) and time.monotonic() > deadline:
            raise QueryError("timeout", f"query ran longer than {time_limit_s:g} s") from None
        raise QueryError("sql_error", str(exc)) from None
    except (
        sqlite3.Error,
        ValueError,
        OverflowError,
    ) as exc:  # ValueError: e.g. a NUL character; Warning: several statements
        raise QueryError("sql_error", str(exc)) from None
    finally:
        connection.close()
    if len(rows) > max_rows:
        raise QueryError("too_many_rows", f"more than {max_rows} rows")
    return rows


def _normalized(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Floats rounded to 6 places (SUM/AVG differ in the last bits), so equal results compare equal."""
    return tuple(round(v, 6) if isinstance(v, float) and math.isfinite(v) else v for v in row)


def same_result(rows: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], *, ordered: bool) -> bool:
    """Equal rows (values, not column names): in order when `ordered`, else as multisets."""
    mine, theirs = [_normalized(r) for r in rows], [_normalized(r) for r in gold]
    return mine == theirs if ordered else Counter(mine) == Counter(theirs)


class SqlServer(ResourcesServer):
    """Text-to-SQL on the shop database. Reward range: [0.0, 1.0], binary."""

    Config = SqlConfig
    config: SqlConfig
    verify_request_type = SqlTask

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.database = ensure_database()
        self.gold_rows = lru_cache(maxsize=1024)(self._gold_rows)

    def _gold_rows(self, gold_sql: str) -> list[tuple[Any, ...]]:
        return run_query(
            self.database, gold_sql, time_limit_s=10 * self.config.time_limit_s, max_rows=10 * self.config.max_rows
        )

    async def verify(self, request: SqlTask, session: Session) -> VerifyResult:
        """Run the model's query and the gold query; 1.0 when their results match (see the module docstring)."""
        try:
            gold = await asyncio.to_thread(self.gold_rows, request.gold_sql)
        except QueryError as exc:  # the row is broken, not the model's answer: no reward at all
            raise HTTPException(422, f"the row's gold_sql fails ({exc.reason}): {exc}") from None
        sql = extract_sql(strip_thinking(last_assistant_text(request.response)))
        if sql is None:
            return VerifyResult(
                reward=0.0, extracted_sql=None, failure_reason="no_sql", error="no ```sql block and no SELECT"
            )
        try:
            rows = await asyncio.to_thread(
                run_query, self.database, sql, time_limit_s=self.config.time_limit_s, max_rows=self.config.max_rows
            )
        except QueryError as exc:
            return VerifyResult(reward=0.0, extracted_sql=sql, failure_reason=exc.reason, error=str(exc))
        ordered = re.search(r"\border\s+by\b", request.gold_sql, re.IGNORECASE) is not None
        correct = same_result(rows, gold, ordered=ordered)
        return VerifyResult(
            reward=float(correct), extracted_sql=sql, failure_reason=None if correct else "wrong_result", error=None
        )
