"""A rollout's attempts across runs of one collection: which of an earlier run's failed rollouts a rerun sends
again, and as which attempt, as NeMo Gym 0.7.0's collector decides (`rollout_collection._load_from_cache` and
`is_terminal_failure`).

A rollout that failed is retried by the next run of the same command, as its next attempt (`_ng_attempt_index`
one past the failed one's, a first attempt unstamped), unless its failure was terminal (the agent or environment
server answered 0.7.0's `_ng_failure_terminal`: a retry cannot help, e.g. a sample that cannot be run) or it has
failed `max_attempts` times (0.7.0's `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`, default 3). Those stay in the failures file,
counted by the reason (`RerunPolicy.held`); a larger `+max_rollout_attempts` sends the second kind again.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym.collect.files import Pair, rollout_input
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import ATTEMPT_INDEX_KEY

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_ATTEMPTS_ENV",
    "MAX_ATTEMPTS",
    "TERMINAL",
    "RerunPolicy",
    "attempt",
    "max_attempts_from_env",
    "rollout_inputs",
]

DEFAULT_MAX_ATTEMPTS = 3  # NeMo Gym 0.7.0's `_DEFAULT_MAX_ROLLOUT_ATTEMPTS`
MAX_ATTEMPTS_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"  # 0.7.0's setting of it, read as the default here too
TERMINAL, MAX_ATTEMPTS = "terminal", "max_attempts"  # why a failed rollout is not sent again (`RerunPolicy.held`)
# NeMo Gym 0.7.0's `_ng_failure_class` labels that `retry_terminal_timeouts` retries even when stamped terminal: the
# per-task timeout and the environment faults that can be repaired between runs; `skipped` stays terminal regardless.
_RETRIED_WITH_TIMEOUTS = frozenset({"timeout_exceeded", "reference_missing", "eval_missing", "transport_ineligible"})
_ALWAYS_TERMINAL = frozenset({"skipped"})


def max_attempts_from_env() -> int:
    """`$NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` (a positive integer), else 3, as NeMo Gym 0.7.0 reads it.

    Raises:
        ConfigError: it is set to anything else (0.7.0 warns and uses 3; here the run does not start).
    """
    raw = os.environ.get(MAX_ATTEMPTS_ENV, "")
    if not raw:
        return DEFAULT_MAX_ATTEMPTS
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"{MAX_ATTEMPTS_ENV}={raw!r}: must be a positive integer (attempts of one rollout)")
    return int(raw)


def attempt(row: dict[str, Any], failure: dict[str, Any] | None) -> dict[str, Any]:
    """`row` as this attempt of its rollout is sent: after an earlier run's `failure` record, with
    `_ng_attempt_index` one past the failed attempt's (a record without one: the first, 0); a first attempt is left
    unstamped, as NeMo Gym 0.7.0's collector leaves it. The attempt goes into an episode's id and the records."""
    if failure is None:
        return row
    return {**row, ATTEMPT_INDEX_KEY: attempts_used(failure)}


def rollout_inputs(
    pending: Sequence[Pair], row_of: Callable[[Pair], dict[str, Any]], failures: Mapping[Pair, Any], add_seed: bool
) -> Iterator[dict[str, Any]]:
    """The rows of the `pending` pairs as they are sent, in order (`nemo_gym.collect.files.rollout_input`), each as
    its next attempt after an earlier run's failure (`attempt`); the failures are read now (a run adds its own to the
    same dict as they come)."""
    earlier = dict(failures)
    return (attempt(rollout_input(row_of(pair), *pair, add_seed=add_seed), earlier.get(pair)) for pair in pending)


def attempts_used(failure: dict[str, Any]) -> int:
    """How many attempts a rollout has had, by the record of its last failed one (attempts count from 0)."""
    return int(failure.get(ATTEMPT_INDEX_KEY, 0)) + 1


@dataclass(frozen=True)
class RerunPolicy:
    """Which failed rollouts a rerun sends again (module docstring).

    max_attempts: attempts of one rollout, over every run (at least 1); retry_terminal_timeouts: NeMo Gym 0.7.0's
    flag of that name, for agents whose builds stamped their per-attempt timeouts terminal: a terminal failure of
    class `timeout_exceeded`, `reference_missing`, `eval_missing` or `transport_ineligible` is retried (up to
    `max_attempts`), one of class `skipped` never is.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_terminal_timeouts: bool = False

    def held(self, failure: dict[str, Any]) -> str | None:
        """Why the rollout of an earlier run's `failure` record is not sent again: `TERMINAL` or `MAX_ATTEMPTS`;
        None when it is."""
        if self._terminal(failure):
            return TERMINAL
        return MAX_ATTEMPTS if attempts_used(failure) >= self.max_attempts else None

    def to_send(
        self, pairs: Sequence[Pair], done: Mapping[Pair, Any], failures: Mapping[Pair, dict[str, Any]]
    ) -> tuple[list[Pair], dict[str, int]]:
        """The `pairs` a run sends, in order: neither `done` by an earlier run nor held after its failure (`held`);
        and the held ones counted by why."""
        held = {pair: why for pair, failure in failures.items() if (why := self.held(failure))}
        return [pair for pair in pairs if pair not in done and pair not in held], dict(Counter(held.values()))

    def _terminal(self, failure: dict[str, Any]) -> bool:
        """0.7.0's `is_terminal_failure` on our record (its `_ng_failure_class` is our `failure_class`)."""
        if not self.retry_terminal_timeouts:
            return bool(failure.get(TERMINAL))
        if failure.get("failure_class") in _RETRIED_WITH_TIMEOUTS:
            return False
        return failure.get("failure_class") in _ALWAYS_TERMINAL or bool(failure.get(TERMINAL))
