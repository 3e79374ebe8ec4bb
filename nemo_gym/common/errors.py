"""One exception tree for nemo_gym.

Every error a user can meet derives from `NemoGymError`. Network failures are typed so the collector can
write them to the failures file with a failure class instead of scoring them as reward 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TRANSIENT_FAILURE_CLASSES",
    "TRANSIENT_HTTP_STATUS",
    "typed_error",
    "typed_failure_class",
    "TypedFailure",
    "typed_failure",
    "is_transient",
    "NemoGymError",
    "ConfigError",
    "DataError",
    "ServerError",
    "ServerUnavailableError",
    "ServersGoneError",
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


class ServersGoneError(ServerUnavailableError):
    """The servers stopped answering: the head server, or an agent for longer than a restart takes, refuses every
    connection (their `ng_run` ended). Raised by the collector (`nemo_gym.collect.liveness`), which stops.

    `head_url`: the head server's base URL when it refuses, else None; `agents`: `{instance name: its replicas'
    base URLs}` of each agent that refuses.
    """

    failure_class = "servers_gone"

    def __init__(self, message: str, *, head_url: str | None, agents: dict[str, list[str]]):
        super().__init__(message, server=", ".join([*(["head"] if head_url else []), *agents]) or None)
        self.head_url = head_url
        self.agents = agents


class ServerTimeoutError(ServerError):
    """The server did not answer within the configured timeout (seconds)."""

    failure_class = "timeout"


class ServerHTTPError(ServerError):
    """The server answered with an HTTP error status. `status_code` and the answer `body` are kept."""

    failure_class = "http_error"

    def __init__(
        self, message: str, *, status_code: int, body: str = "", server: str | None = None, path: str | None = None
    ):
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


def typed_error(body: str | bytes) -> dict[str, Any] | None:
    """The `error` object of a typed failure answer (`{"error": {"type": <class>, "server", "message", ...}}`, what
    every nemo_gym server answers for a failure further down the chain), else None."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) and isinstance(error.get("type"), str) else None


def typed_failure_class(body: str | bytes) -> str | None:
    """The failure class of a typed error answer (`typed_error`), else None."""
    error = typed_error(body)
    return error["type"] if error else None


@dataclass(frozen=True)
class TypedFailure:
    """What a failed call says of itself: the failure class and message of the typed error answer it got
    (`typed_error`: a failure further down the chain keeps its own), else of the exception; `failed_server` is the
    server the typed answer names (the one that failed further down), `called_server` the one that was called,
    `status_code` the HTTP status of the call when it answered, `response` a failed `/verify`'s trajectory and
    `trajectory` the rollout's `ng_trajectory` capture record (the bundled agents send them)."""

    failure_class: str
    message: str
    called_server: str | None = None
    failed_server: str | None = None
    status_code: int | None = None
    response: dict[str, Any] | None = None
    trajectory: dict[str, Any] | None = None

    @property
    def server(self) -> str | None:
        """The server that failed: the one the typed answer names, else the one called."""
        return self.failed_server or self.called_server

    @property
    def relay_status(self) -> int:
        """The status a server answers when it passes this failure on: 424 after a 4xx, else 502."""
        return 424 if self.status_code is not None and 400 <= self.status_code < 500 else 502

    def answer(self, **extra: Any) -> dict[str, Any]:
        """The typed failure answer that passes it on: `{"error": {"type", "server", "message", **extra}}`."""
        return {"error": {"type": self.failure_class, "server": self.server, "message": self.message[:4000], **extra}}


def typed_failure(exc: ServerError) -> TypedFailure:
    """`exc` as a `TypedFailure`: the typed error answer's class, server and message when its body holds one."""
    if not isinstance(exc, ServerHTTPError):
        return TypedFailure(exc.failure_class, str(exc), called_server=exc.server)
    error = typed_error(exc.body) or {}
    response, trajectory = error.get("response"), error.get("ng_trajectory")
    return TypedFailure(
        failure_class=error.get("type", exc.failure_class),
        message=str(error.get("message") or exc),
        called_server=exc.server,
        failed_server=error.get("server") or None,
        status_code=exc.status_code,
        response=response if isinstance(response, dict) else None,
        trajectory=trajectory if isinstance(trajectory, dict) else None,
    )


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
