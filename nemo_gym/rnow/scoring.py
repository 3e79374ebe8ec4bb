"""The total reward of a rollout from an entry's named `@reward` functions.

Total = the **sum** of the entry's rewards, or 0 when any precondition reward is 0: ReinforceNow's rule
(`compute_total_reward` in rnow: "if any precondition reward is 0, total reward is 0, otherwise the sum of
all rewards"). Each reward should return a float in [0, 1], so the total lies in [0, number of rewards].
Every reward is computed (no short cut after a failed gate) so `reward_components` always has them all.

A reward that raises, returns something other than a finite number in [0, 1], or runs past its timeout is
a failure of the rollout (`RewardError`, `RewardTimeoutError`: typed, written to the collector's failures
file), never a reward of 0. A sync reward past its timeout keeps running in its worker thread until it
returns (Python cannot kill a thread); an async one is cancelled.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nemo_gym.common.errors import ServerError
from nemo_gym.rnow.decorators import DEFAULT_REWARD_TIMEOUT_S, RewardArgs, RewardSpec

__all__ = ["RewardError", "RewardTimeoutError", "RewardOutcome", "total_reward", "run_reward", "score"]

SandboxRunner = Callable[[RewardSpec, RewardArgs, list[dict[str, Any]], float], Awaitable[Any]]


class RewardError(ServerError):
    """A reward function raised or returned something that is not a number in [0, 1]."""

    failure_class = "reward_error"


class RewardTimeoutError(RewardError):
    """A reward function ran past its timeout (seconds)."""

    failure_class = "reward_timeout"


@dataclass(frozen=True)
class RewardOutcome:
    total: float
    components: dict[str, float]


def total_reward(values: dict[str, float], preconditions: set[str]) -> float:
    """0 when a precondition reward is 0, else the sum of all values (preconditions included).

    Worked example: {format: 1 (precondition), accuracy: 0.5} → 1.5; {format: 0, accuracy: 1} → 0.
    """
    if any(values[name] == 0.0 for name in preconditions if name in values):
        return 0.0
    return float(sum(values.values()))


def _checked(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RewardError(
            f"reward {name!r} returned {type(value).__name__} {value!r:.100}; it must return a float in [0, 1]"
        )
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise RewardError(f"reward {name!r} returned {value!r}; it must return a float in [0, 1]")
    return float(value)


async def run_reward(
    spec: RewardSpec,
    args: RewardArgs,
    messages: list[dict[str, Any]],
    timeout_s: float,
    sandbox: SandboxRunner | None = None,
) -> float:
    """The value of one reward, in [0, 1].

    Raises:
        RewardError: it raised or returned a bad value. RewardTimeoutError: past `timeout_s` seconds.
        SandboxUnavailableError: a sandbox reward with no sandbox here.
    """
    messages = copy.deepcopy(messages)  # a reward that edits its list does not change what the next one sees
    if spec.sandbox:
        if sandbox is None:
            raise RewardError(f"reward {spec.name!r} has sandbox=True but this server has no sandbox")
        call: Awaitable[Any] = sandbox(spec, args, messages, timeout_s)
    elif asyncio.iscoroutinefunction(spec.fn):
        call = spec.fn(args, messages)
    else:
        call = asyncio.to_thread(spec.fn, args, messages)
    try:
        value = await asyncio.wait_for(call, timeout_s)
    except TimeoutError as exc:
        raise RewardTimeoutError(
            f"reward {spec.name!r} took longer than {timeout_s:g} s (set @reward(timeout=...) to allow more)"
        ) from exc
    except ServerError:
        raise
    except Exception as exc:
        raise RewardError(f"reward {spec.name!r} raised {type(exc).__name__}: {exc}") from exc
    return _checked(spec.name, value)


async def score(
    specs: list[RewardSpec],
    args: RewardArgs,
    messages: list[dict[str, Any]],
    *,
    default_timeout_s: float = DEFAULT_REWARD_TIMEOUT_S,
    sandbox: SandboxRunner | None = None,
) -> RewardOutcome:
    """Run the rewards (concurrently) and combine them with `total_reward`.

    Raises:
        RewardError, RewardTimeoutError: the first reward that failed (see `run_reward`).
    """
    values = await asyncio.gather(
        *(run_reward(s, args, messages, s.timeout_s or default_timeout_s, sandbox) for s in specs)
    )
    components = {spec.name: value for spec, value in zip(specs, values)}
    return RewardOutcome(total_reward(components, {s.name for s in specs if s.precondition}), components)
