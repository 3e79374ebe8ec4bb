"""The replicas of one server instance, and which one a call goes to.

An instance with `num_replicas: N` runs N processes (replica 0..N-1), each registered with the head server under
the same name. `ServerClient` keeps one `ReplicaPool` per name and asks it, for each attempt of a call:

- a call with a sticky key (the rollout's session id, or its cookie jar) goes to `sticky(key)`: rendezvous
  (highest-random-weight) hashing of the key over the replica *indices*, so a rollout's calls all reach the
  replica that holds its session state, and a replica restarted at a new address keeps its keys;
- a call without one goes to `balanced()`: the up replica with the fewest calls in flight (ties in turn).

A replica that refuses connections is marked down for `cooldown_s`; balanced calls avoid it until the cool-down
ends (the client then re-reads the addresses from the head server: a restarted replica may have a new one).
Thaler & Ravishankar 1998 (rendezvous hashing): the hash of (key, replica) is the weight; the heaviest wins.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_COOLDOWN_S", "Replica", "ReplicaPool", "rendezvous_weight"]

DEFAULT_COOLDOWN_S = 10.0


def rendezvous_weight(key: str, replica: int) -> int:
    """Weight of `replica` for `key`: a stable 64-bit hash (same on every process and run)."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest(), "big")


@dataclass
class Replica:
    """One replica's address and counters. `calls`: attempts sent to it; `failures`: attempts that got no
    answer (connection refused or reset, timeout); `down_until_s`: end of its cool-down (`time.monotonic`),
    None while up."""

    replica: int
    url: str
    calls: int = 0
    failures: int = 0
    in_flight: int = 0
    down_until_s: float | None = None

    def is_down(self, now_s: float) -> bool:
        return self.down_until_s is not None and now_s < self.down_until_s

    def stats(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "url": self.url,
            "calls": self.calls,
            "failures": self.failures,
            "in_flight": self.in_flight,
            "down": self.is_down(time.monotonic()),
        }


class ReplicaPool:
    """The replicas of instance `name`.

    Args:
        name: instance name.
        urls: `{replica index: base URL}` (at least one).
        cooldown_s: how long a replica that refused a connection gets no balanced calls, seconds.
        fixed: addresses given by the caller, never re-read from the head server.
    """

    def __init__(self, name: str, urls: dict[int, str], *, cooldown_s: float = DEFAULT_COOLDOWN_S, fixed: bool = False):
        if not urls:
            raise ValueError(f"server {name!r}: no replica address")
        self.name = name
        self.cooldown_s = cooldown_s
        self.fixed = fixed
        self.send_run_token = True  # False for a server outside the run's token (external, NeMo Gym's): ServerClient
        self.replicas: dict[int, Replica] = {i: Replica(i, url) for i, url in sorted(urls.items())}
        self.generation = 0  # bumped by each `update`, so concurrent callers re-read the head server once
        self._turn = 0

    def update(self, urls: dict[int, str]) -> None:
        """Take the head server's current `{replica index: base URL}`: a replica whose address changed (restarted)
        or whose cool-down ended is up again; counters are kept; replicas it no longer lists are dropped. With
        `urls` empty (fixed addresses, or no answer from the head server), only the cool-downs that are over end."""
        now_s = time.monotonic()
        if urls:
            known = self.replicas
            self.replicas = {i: known.get(i) or Replica(i, url) for i, url in sorted(urls.items())}
            for i, url in urls.items():
                if self.replicas[i].url != url:
                    self.replicas[i].url, self.replicas[i].down_until_s = url, None
        for replica in self.replicas.values():
            if replica.down_until_s is not None and now_s >= replica.down_until_s:
                replica.down_until_s = None
        self.generation += 1

    def cooldown_ended(self) -> bool:
        """True when a replica's cool-down is over (time to re-read the addresses and try it again)."""
        now_s = time.monotonic()
        return any(r.down_until_s is not None and now_s >= r.down_until_s for r in self.replicas.values())

    def mark_down(self, replica: Replica) -> None:
        replica.down_until_s = time.monotonic() + self.cooldown_s

    def sticky(self, key: str) -> Replica:
        """The replica of `key`, up or down (a session lives on one replica only)."""
        return max(self.replicas.values(), key=lambda r: rendezvous_weight(key, r.replica))

    def up(self, avoid: Collection[int] = ()) -> list[Replica]:
        """The replicas not cooling down, leaving out the indices in `avoid`."""
        now_s = time.monotonic()
        return [r for r in self.replicas.values() if not r.is_down(now_s) and r.replica not in avoid]

    def balanced(self, avoid: Collection[int] = ()) -> Replica | None:
        """The up replica (not in `avoid`) with the fewest calls in flight, ties taken in turn; None when
        every such replica is down."""
        up = self.up(avoid)
        if not up:
            return None
        self._turn += 1
        fewest = min(r.in_flight for r in up)
        candidates = [r for r in up if r.in_flight == fewest]
        return candidates[self._turn % len(candidates)]

    def soonest_up(self) -> Replica:
        """The replica whose cool-down ends first (to try when every replica is down)."""
        return min(self.replicas.values(), key=lambda r: r.down_until_s or 0.0)

    def first_url(self) -> str:
        """The address of the lowest-numbered up replica (of replica 0 when all are down)."""
        return (self.up() or list(self.replicas.values()))[0].url

    def stats(self) -> list[dict[str, Any]]:
        """`[{replica, url, calls, failures, in_flight, down}]`, by replica index."""
        return [r.stats() for r in self.replicas.values()]
