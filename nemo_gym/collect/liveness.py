"""Whether the servers of a collection are still there (`ServerLiveness`): the collector stops when they are gone.

`ng_run` stops every server when one dies. Without this check a collection against stopped servers goes on: each
rollout left spends its client's retries on refused connections and is written to the failures file as
`unavailable`, for minutes, although none of them failed for a reason of its own. So the collector
probes `GET /health` (`ServerClient.reachable`: one attempt; only a connection refused, reset or not made counts
as not answering, a slow answer does not):

- the head server, every `period_s` while rollouts run (`watch`): ng_run's head server lives in its process, so
  one that refuses means the run is over, whatever the rollouts in flight are still waiting for;
- the head server and the rollout's agent, after each rollout that failed with failure class `unavailable` (its
  agent refused or reset the connection after the client's retries, or answered that a server behind it did),
  before the failure is recorded (`check`). Rollouts failing at the same moment share one probe.

`decide` says what becomes of that rollout:

| head server | agent    | verdict  | the collector                                                          |
|-------------|----------|----------|------------------------------------------------------------------------|
| refuses     | any      | GONE     | stops                                                                  |
| answers*    | answers  | ANSWERS  | records the failure (the rollout's own: one refused call, a blip)      |
| answers*    | refuses  | WAIT     | probes again every `period_s` (a restarting agent comes back) ...      |
| answers*    | refuses  | GONE     | ... until the agent has refused for `servers_gone_s`: stops            |
(* or no head server: a client with fixed addresses)

GONE raises `ServersGoneError`, naming the head server (when it refuses) and every agent of the collection that
refuses. The rollout that asked is not recorded, nor are those cancelled in flight: they did not fail, they were
cut off, and the resume runs every pair without a row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from enum import StrEnum

from nemo_gym.common.errors import ServersGoneError, ServerUnavailableError
from nemo_gym.serving.client import ServerClient

__all__ = ["DEFAULT_SERVERS_GONE_S", "UNAVAILABLE", "ServerLiveness", "Verdict", "decide"]

DEFAULT_SERVERS_GONE_S = 10.0
UNAVAILABLE = ServerUnavailableError.failure_class  # the failure class that asks for a check


class Verdict(StrEnum):
    """What a probe after an `unavailable` failure says."""

    ANSWERS = "answers"  # the agent answers: the failure was the rollout's own; record it
    WAIT = "wait"  # the agent refuses, not yet for `servers_gone_s`: it may be restarting; probe again
    GONE = "gone"  # the head server refuses, or the agent has refused for `servers_gone_s`: stop


def decide(head_answers: bool | None, agent_answers: bool, agent_refused_s: float, servers_gone_s: float) -> Verdict:
    """The verdict of one probe (see the module docstring's table).

    Args:
        head_answers: whether the head server answered its probe; None without a head server.
        agent_answers: whether any replica of the agent answered its probe.
        agent_refused_s: seconds since the first probe the agent refused with no answer from it since (0 now).
        servers_gone_s: how long an agent may refuse before the collection stops, seconds.
    """
    if head_answers is False:
        return Verdict.GONE
    if agent_answers:
        return Verdict.ANSWERS
    return Verdict.GONE if agent_refused_s >= servers_gone_s else Verdict.WAIT


class ServerLiveness:
    """The probes of one collection (see the module docstring).

    Args:
        client: the collection's client (its `head_url`, the agents' addresses, `reachable`).
        agents: the agent instance names of the collection (each one that refuses is named when it stops).
        servers_gone_s: how long an agent may refuse every connection, the head server answering, before the
            collection stops, seconds (a restart of the agent that takes less does not stop it).
        period_s: seconds between the head server's probes (`watch`), and between probes while an agent refuses.
    """

    def __init__(
        self,
        client: ServerClient,
        agents: Iterable[str],
        *,
        servers_gone_s: float = DEFAULT_SERVERS_GONE_S,
        period_s: float = 1.0,
    ):
        self.client = client
        self.agents = sorted(set(agents))
        self.servers_gone_s = servers_gone_s
        self.period_s = period_s
        self.probe_timeout_s = client.timeouts.connect_s
        self._refused_since_s: dict[
            str, float
        ] = {}  # agent -> monotonic time of the first refused probe since an answer
        self._probes: dict[
            str, tuple[float, bool | None, bool]
        ] = {}  # agent -> (monotonic start, head answers, agent answers)
        self._lock = asyncio.Lock()

    def answered(self, agent: str) -> None:
        """A rollout got an answer from `agent` (a row, or a failure of another class)."""
        self._refused_since_s.pop(agent, None)

    async def watch(self) -> None:
        """Probe the head server every `period_s` until cancelled (returns at once without one).

        Raises:
            ServersGoneError: the head server refuses (its ng_run has ended).
        """
        if not self.client.head_url:
            return
        while True:
            await asyncio.sleep(self.period_s)
            if not await self._head_answers():
                raise await self._gone(head_answers=False)

    async def check(self, agent: str) -> None:
        """After a rollout through `agent` failed `unavailable`: returns once `agent` answers (record the failure),
        probing every `period_s` while it refuses (WAIT).

        Raises:
            ServersGoneError: GONE (see `decide`); the rollout is left for the resume.
        """
        while True:
            head_answers, agent_answers = await self._probe(agent)
            refused_s = time.monotonic() - self._refused_since_s[agent] if agent in self._refused_since_s else 0.0
            if (verdict := decide(head_answers, agent_answers, refused_s, self.servers_gone_s)) is Verdict.ANSWERS:
                return
            if verdict is Verdict.GONE:
                raise await self._gone(head_answers, {agent: agent_answers})
            await asyncio.sleep(self.period_s)

    async def _probe(self, agent: str) -> tuple[bool | None, bool]:
        """(head server answers, or None without one; `agent` answers), from a probe that started after this call
        did: rollouts failing together wait for one probe."""
        asked_s = time.monotonic()
        async with self._lock:
            started_s, head_answers, agent_answers = self._probes.get(agent, (float("-inf"), None, False))
            if started_s < asked_s:
                started_s = time.monotonic()
                head_answers, agent_answers = await self._head_answers(), await self._agent_answers(agent)
                self._probes[agent] = (started_s, head_answers, agent_answers)
        if agent_answers:
            self._refused_since_s.pop(agent, None)
        else:
            self._refused_since_s.setdefault(agent, started_s)
        return head_answers, agent_answers

    async def _head_answers(self) -> bool | None:
        """Whether the head server answers `/health`; None without one."""
        return (
            await self.client.reachable(f"{self.client.head_url}/health", self.probe_timeout_s)
            if self.client.head_url
            else None
        )

    async def _agent_answers(self, agent: str) -> bool:
        """Whether any replica of `agent` answers `/health` (at the addresses the client has)."""
        urls = (await self.client.replica_urls(agent)).values()
        return any(
            await asyncio.gather(*(self.client.reachable(f"{url}/health", self.probe_timeout_s) for url in urls))
        )

    async def _gone(self, head_answers: bool | None, probed: dict[str, bool] | None = None) -> ServersGoneError:
        """The error that stops the collection: names the head server if it refuses and every agent that refuses
        (`probed`: whether agents probed just now answered; the others are probed here)."""
        probed = probed or {}
        refusing = {
            name: list((await self.client.replica_urls(name)).values())
            for name in self.agents
            if not (probed[name] if name in probed else await self._agent_answers(name))
        }
        parts = (
            [f"the head server {self.client.head_url} refuses connections (its ng_run has ended)"]
            if head_answers is False
            else []
        )
        now_s = time.monotonic()
        for name, urls in refusing.items():
            since_s = self._refused_since_s.get(name)
            for_how_long = f" for {now_s - since_s:.1f} s" if since_s is not None and head_answers is not False else ""
            parts.append(f"agent {name!r} ({', '.join(urls)}) refuses connections{for_how_long}")
        head_url = self.client.head_url if head_answers is False else None
        return ServersGoneError(
            "the servers stopped answering: " + "; ".join(parts), head_url=head_url, agents=refusing
        )
