"""NeMo Gym 0.7.0's agent sessions on our agents: the protocol by which an environment server (0.7.0's
`single_agent_turn`) runs one agent turn of an episode with the tools it grants.

    POST /v1/agent_sessions        {agent_session_id, episode_id, task_id, tool_accesses, sandbox_access}
                                   -> {agent_session_id}, with the session cookie (AGENT_SESSION_COOKIE)
    POST /v1/responses             with that cookie: the agent's loop, its tool calls through the granted access
                                   -> the episode's Response
    POST /v1/agent_sessions/close  {agent_session_id, episode_id}
                                   -> {agent_session_id, agent_observations, resources_cookies}

`AgentServer` serves these routes for an agent that implements `open_agent_session` (simple_agent does). The rules
are 0.7.0's (its `base_responses_api_agent.SimpleResponsesAPIAgent`), kept by `AgentSessions`:

- seeding an id again with the same body is answered as the first time (a retried request); with another body, 409;
- a closed id cannot be seeded again (409), nor can an id whose close came before its seed (a seed racing its close);
- a close is answered again with the same receipt for `retry_window_s` seconds after it (a retried close); a close
  naming another episode than the seed did is 409;
- a `/v1/responses` whose cookie names a session that is unknown, closing or closed is 409: it never runs outside
  the session it names.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from urllib.parse import quote, unquote

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "AGENT_SESSION_COOKIE",
    "AgentCloseSessionRequest",
    "AgentSeedSessionRequest",
    "AgentSession",
    "AgentSessionError",
    "AgentSessions",
    "DirectHTTPToolAccess",
    "MCPToolAccess",
]

# the cookie that binds a /v1/responses call to its session (0.7.0 keeps the id in a signed Starlette session cookie;
# its environment server only hands back the cookies the seed answer set, so the name is ours to choose)
AGENT_SESSION_COOKIE = "nemo_gym_agent_session"
# at most this many closed sessions' receipts are kept (the oldest go first, even inside their retry window)
MAX_CLOSED_SESSIONS = 100_000
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class EpisodeId(BaseModel):
    """One attempt of a rollout (0.7.0's `episode_types.EpisodeId`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rollout_id: str = Field(min_length=1, pattern=_NAME)
    attempt: int = Field(0, ge=0)


class TaskId(BaseModel):
    """One task of a taskset (0.7.0's `episode_types.TaskId`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class DirectHTTPToolAccess(BaseModel):
    """Tools as HTTP routes: each tool call is `POST <base_url>/<tool name>` with these cookies and headers (0.7.0's
    `tool_access.DirectHTTPToolAccess`; its environment server grants the resources server's session this way)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["direct_http"] = "direct_http"
    name: str = Field(min_length=1, pattern=_NAME)
    required: bool
    base_url: AnyHttpUrl
    cookies: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)


class MCPStreamableHTTPConnection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    transport: Literal["streamable_http"] = "streamable_http"
    url: AnyHttpUrl
    headers: dict[str, str] = Field(default_factory=dict)


class MCPToolAccess(BaseModel):
    """Tools over MCP at one streamable-HTTP endpoint (0.7.0's `tool_access.MCPToolAccess`)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["mcp"] = "mcp"
    name: str = Field(min_length=1, pattern=_NAME)
    required: bool
    connection: MCPStreamableHTTPConnection


ToolAccess = Annotated[DirectHTTPToolAccess | MCPToolAccess, Field(discriminator="kind")]


class AgentSeedSessionRequest(BaseModel):
    """The `/v1/agent_sessions` body (0.7.0's `AgentSeedSessionRequest`): the id the caller assigns, the episode, the
    task, the tools it grants (names unique) and a sandbox, if any."""

    model_config = ConfigDict(extra="forbid")
    agent_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    tool_accesses: list[ToolAccess] = Field(default_factory=list)
    sandbox_access: dict[str, Any] | None = None

    @field_validator("tool_accesses")
    @classmethod
    def _unique_names(cls, accesses: list[Any]) -> list[Any]:
        names = [access.name for access in accesses]
        if len(names) != len(set(names)):
            raise ValueError("tool access names must be unique within an agent session")
        return accesses


class AgentCloseSessionRequest(BaseModel):
    """The `/v1/agent_sessions/close` body (0.7.0's `AgentCloseSessionRequest`)."""

    model_config = ConfigDict(extra="forbid")
    agent_session_id: str
    episode_id: EpisodeId


class AgentSessionError(Exception):
    """A session request refused: `status` (409: the session's state forbids it; 422: a grant the agent cannot use)
    and the reason, answered as `{"detail": reason}`."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail

    def answer(self) -> JSONResponse:
        return JSONResponse({"detail": self.detail}, status_code=self.status)


@dataclass
class AgentSession:
    """A live session: its seed request and the agent's own state for it (what `open_agent_session` returned)."""

    request: AgentSeedSessionRequest
    state: Any
    activations: int = 0  # the /v1/responses calls made in it so far


@dataclass
class _Record:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: AgentSession | None = None
    closing: bool = False
    episode_id: EpisodeId | None = None
    receipt: dict[str, Any] | None = None  # the close answer, once closed
    expires_at: float = float("inf")  # when the receipt is dropped (time.monotonic seconds)


def session_cookie_id(request: Request) -> str | None:
    """The session id the request's cookie names, else None."""
    value = request.cookies.get(AGENT_SESSION_COOKIE)
    return unquote(value) if value else None


def with_session_cookie(answer: dict[str, Any], session_id: str) -> JSONResponse:
    """`answer` as JSON with the session cookie set (on every session answer, as 0.7.0's session middleware does: a
    caller that keeps the cookies of the last answer only keeps it)."""
    response = JSONResponse(answer)
    response.set_cookie(AGENT_SESSION_COOKIE, quote(session_id, safe=""), httponly=True, samesite="lax")
    return response


class AgentSessions:
    """The agent sessions of one agent server process (see the module docstring for the rules).

    Args:
        retry_window_s: how long a close receipt is kept for a retried close, seconds.
    """

    def __init__(self, retry_window_s: float = 300.0):
        self.retry_window_s = retry_window_s
        self._records: dict[str, _Record] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()  # ids whose receipt is kept, oldest first

    def _drop_expired(self) -> None:
        now = time.monotonic()
        while self._closed:
            oldest = next(iter(self._closed))
            record = self._records.get(oldest)
            if record is not None and record.expires_at > now and len(self._closed) <= MAX_CLOSED_SESSIONS:
                break
            self._closed.pop(oldest)
            self._records.pop(oldest, None)

    async def _locked(self, session_id: str) -> _Record:
        """The record of `session_id`, its lock held by the caller (who releases it)."""
        self._drop_expired()
        while True:
            record = self._records.setdefault(session_id, _Record())
            await record.lock.acquire()
            if self._records.get(session_id) is record:
                return record
            record.lock.release()  # replaced while we waited (a failed seed was forgotten): take the new one

    def _release(self, session_id: str, record: _Record) -> None:
        if record.session is None and record.receipt is None:
            self._records.pop(session_id, None)  # nothing to remember (a failed seed)
        record.lock.release()

    async def seed(
        self, body: AgentSeedSessionRequest, cookie_id: str | None, open_state: Callable[[Any], Awaitable[Any]]
    ) -> None:
        """Seed the session `body` names: `open_state(body)` makes the agent's state for it, once per id.

        Raises:
            AgentSessionError: 409 when the cookie names another session, the id is closed or closing, or it is
                seeded already with another body; whatever `open_state` raises (then nothing is kept).
        """
        session_id = body.agent_session_id
        if cookie_id is not None and cookie_id != session_id:
            raise AgentSessionError(409, "agent_session_id does not match the session cookie")
        record = await self._locked(session_id)
        try:
            if record.receipt is not None:
                raise AgentSessionError(409, f"agent session {session_id!r} is already closed")
            if record.closing:
                raise AgentSessionError(409, f"agent session {session_id!r} is closing")
            if record.session is None:
                record.session = AgentSession(body, await open_state(body))
                record.episode_id = body.episode_id
            elif record.session.request != body:
                raise AgentSessionError(
                    409, f"agent_session_id {session_id!r} is already bound to another seed request"
                )
        finally:
            self._release(session_id, record)

    def live(self, session_id: str) -> AgentSession:
        """The live session `session_id`.

        Raises:
            AgentSessionError: 409, the id names no live session (never seeded, closing or closed).
        """
        record = self._records.get(session_id)
        if record is None or record.session is None or record.closing:
            raise AgentSessionError(409, f"unknown or closing agent_session_id {session_id!r}")
        return record.session

    async def close(
        self,
        body: AgentCloseSessionRequest,
        cookie_id: str | None,
        close_state: Callable[[AgentSession], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Close the session `body` names; returns the receipt: `{agent_session_id, agent_observations,
        resources_cookies}` (what `close_state(session)` returns for the last two; both None for an id never seeded).
        A retried close within the retry window gets the same receipt.

        Raises:
            AgentSessionError: 409 when the cookie names another session or the episode is not the seed's; whatever
                `close_state` raises (the session stays, for another close).
        """
        session_id = body.agent_session_id
        if cookie_id is not None and cookie_id != session_id:
            raise AgentSessionError(409, "agent_session_id does not match the session cookie")
        record = await self._locked(session_id)
        try:
            if record.episode_id is not None and record.episode_id != body.episode_id:
                raise AgentSessionError(409, "episode_id does not match the seeded agent session")
            if record.receipt is not None:
                return dict(record.receipt)
            receipt: dict[str, Any] = {"agent_session_id": session_id, "agent_observations": None}
            if record.session is not None:
                record.closing = True
                receipt.update(await close_state(record.session))
            else:
                receipt["resources_cookies"] = None
            record.session, record.closing, record.episode_id = None, False, body.episode_id
            record.receipt, record.expires_at = receipt, time.monotonic() + self.retry_window_s
            self._closed[session_id] = None
            return dict(receipt)
        finally:
            self._release(session_id, record)
