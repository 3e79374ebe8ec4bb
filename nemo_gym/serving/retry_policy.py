"""When a client call is retried and how long it waits: the deadlines and retry policy of `ServerClient`
(`ClientTimeouts`: per-attempt deadlines, the number of retries, the exponential backoff between them) and a 429's
`Retry-After` (`retry_after_s`). Which failures are retried is `nemo_gym.common.errors.is_transient`.
"""

from __future__ import annotations

import datetime
import email.utils
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ClientTimeouts", "retry_after_s"]


@dataclass(frozen=True)
class ClientTimeouts:
    """Deadlines and retry policy. Durations in seconds."""

    connect_s: float = 5.0
    read_s: float = 600.0
    max_retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 60.0  # a 429 asking to wait longer ends the retries

    def worst_case_s(self, timeout_s: float | None = None) -> float:
        """Longest a call can last, seconds: every attempt at its total deadline (connect + read, or
        connect + `timeout_s`), plus the longest waits between them."""
        attempt = self.connect_s + (timeout_s or self.read_s)
        wait = max(self.backoff_max_s, self.retry_after_max_s)
        return (self.max_retries + 1) * attempt + self.max_retries * wait

    def backoff_delay_s(self, attempt: int) -> float:
        """The wait before retry number `attempt` (1-based) when the server gave no `Retry-After`: exponential from
        `backoff_s`, at most `backoff_max_s`."""
        return min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """An answer's `Retry-After` in seconds (delay-seconds or an HTTP date; RFC 9110 §10.2.3), else None.
    `headers`: the answer's headers, a case-insensitive mapping."""
    value = headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())
