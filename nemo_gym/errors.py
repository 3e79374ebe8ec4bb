"""One exception tree for nemo_gym.

Every error a user can meet derives from `NemoGymError`. Network failures are typed so the collector can
write them to the failures file with a failure class instead of scoring them as reward 0.
"""

from __future__ import annotations

import json

__all__ = [
    "TRANSIENT_FAILURE_CLASSES",
    "TRANSIENT_HTTP_STATUS",
    "typed_failure_class",
    "is_transient",
    "NemoGymError",
    "ConfigError",
    "DataError",
    "ServerError",
    "ServerUnavailableError",
    "ServerTimeoutError",
    "ServerHTTPError",
    "ServerBadAnswerError",
    "ServerStartError",
]


class NemoGymError(Exception):
    """Base class of every nemo_gym error."""


class ConfigError(NemoGymError):
    """A configuration problem; the message names the YAML file and key and says what to write."""


class DataError(NemoGymError):
    """A bad dataset row; the message starts with `file:line:`."""


class ServerError(NemoGymError):
    """A call to a server failed. `failure_class` is the short name written to the failures file."""

    failure_class = "server_error"

    def __init__(self, message: str, *, server: str | None = None, path: str | None = None):
        super().__init__(message)
        self.server = server
        self.path = path


class ServerUnavailableError(ServerError):
    """The server could not be reached (connection refused or reset) after the bounded retries."""

    failure_class = "unavailable"


class ServerTimeoutError(ServerError):
    """The server did not answer within the configured timeout (seconds)."""

    failure_class = "timeout"


class ServerHTTPError(ServerError):
    """The server answered with an HTTP error status. `status_code` and the answer `body` are kept."""

    failure_class = "http_error"

    def __init__(self, message: str, *, status_code: int, body: str = "", server: str | None = None, path: str | None = None):
        super().__init__(message, server=server, path=path)
        self.status_code = status_code
        self.body = body


class ServerBadAnswerError(ServerError):
    """The server answered with a success status but a body that is not JSON."""

    failure_class = "bad_answer"


class ServerStartError(NemoGymError):
    """A server process exited or never became healthy during `ng_run`; the message has its last log lines."""


# -- which failures are worth retrying (the one place that decides it) ---------------------------------------
TRANSIENT_FAILURE_CLASSES = frozenset({"unavailable", "timeout"})
"""Failure classes that may go away on their own: the server could not be reached, or did not answer in time."""
TRANSIENT_HTTP_STATUS = frozenset({429, 502, 503, 504})
"""Statuses that may go away on their own: too many requests (after its Retry-After), gateway errors, unavailable."""


def typed_failure_class(body: str) -> str | None:
    """The failure class of a typed error answer (`{"error": {"type": <class>, ...}}`, what nemo_gym servers
    answer for a failure further down the chain), else None."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error["type"] if isinstance(error, dict) and isinstance(error.get("type"), str) else None


def is_transient(exc: BaseException) -> bool:
    """Whether the same call may succeed when retried.

    Transient: a connection failure (`unavailable`) or a timeout; an HTTP 429; a 502/503/504 whose body has no
    typed failure class, or a transient one (a server further down was unreachable or slow). Deterministic,
    never retried: every other 4xx (validation errors, 422, 424) and 5xx, a success answer that is not JSON
    (`bad_answer`), and a 502/503/504 carrying a deterministic class (e.g. `judge_unparsable`, `bad_answer`,
    `sandbox_unavailable`, `http_error`: the server further down already spent its own retries).
    """
    if isinstance(exc, ServerHTTPError):
        if exc.status_code == 429:
            return True
        if exc.status_code not in TRANSIENT_HTTP_STATUS:
            return False
        inner = typed_failure_class(exc.body)
        return inner is None or inner in TRANSIENT_FAILURE_CLASSES
    return isinstance(exc, ServerError) and exc.failure_class in TRANSIENT_FAILURE_CLASSES
