"""Trajectories and groups of trajectories, the data a rollout function returns (ART's `art.Trajectory`).

A `Trajectory` is one episode: the chat it went through (`messages_and_choices`: OpenAI message dicts for
what the policy did not generate, and the `Choice` objects the policy server answered, which are what is
trained), one `reward`, numeric `metrics` and free `metadata`. A `TrajectoryGroup` holds the trajectories of
one task: GRPO compares rewards inside a group.

`TrajectoryGroup(rollout(...) for _ in range(n))` given awaitables returns a `PendingGroup` to await (or to
pass to `gather_trajectory_groups`): the rollouts run concurrently, and one that raises becomes an entry of
the group's `exceptions` instead of failing the group.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import threading
import traceback
from collections import Counter
from collections.abc import Awaitable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = [
    "MetricValue",
    "MetadataValue",
    "MessageOrChoice",
    "RolloutError",
    "Trajectory",
    "TrajectoryGroup",
    "PendingGroup",
    "GatherProgress",
]

MetricValue = StrictFloat | StrictInt | StrictBool
"""A metric: a number or a bool (strings are rejected, so every metric can be averaged)."""
MetadataValue = StrictFloat | StrictInt | StrictBool | StrictStr | None
MessageOrChoice = Union["ChatCompletionMessageParam", Choice]
"""An OpenAI chat message dict (context, not trained) or a `Choice` of the policy server (trained)."""

MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _is_choice_dict(item: Any) -> bool:
    """A dumped `Choice` (from JSON): it has a `message` and no `role`."""
    return isinstance(item, dict) and "message" in item and "role" not in item


class Trajectory(BaseModel):
    """One episode of the policy: its chat, reward and metrics.

    Attributes:
        messages_and_choices: message dicts (`{"role": ..., "content": ...}`, context) and the `Choice`s the
            policy server returned (the trained tokens: their `message` carries `prompt_token_ids`,
            `generation_token_ids`, `generation_log_probs` from vllm_model).
        reward: finite float; any range (GRPO only compares rewards inside a group).
        metrics: name → number or bool, averaged in progress bars and logs.
        metadata: name → scalar or None, kept with the trajectory.
        tools: the OpenAI tool definitions offered to the policy, if any.
        logs: free text lines.
    """

    model_config = ConfigDict(validate_assignment=True, extra="forbid")

    messages_and_choices: list[Choice | dict[str, Any]] = Field(
        default_factory=list, description="chat messages (context) and Choices (trained)"
    )
    reward: float = Field(allow_inf_nan=False, description="the trajectory's reward (finite)")
    metrics: dict[str, MetricValue] = Field(default_factory=dict, description="numeric or bool metrics")
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, description="scalar metadata")
    tools: list[dict[str, Any]] | None = Field(None, description="OpenAI tool definitions offered to the policy")
    logs: list[str] = Field(default_factory=list, description="free text lines")

    @field_validator("messages_and_choices", mode="before")
    @classmethod
    def _choices_from_json(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [Choice.model_validate(item) if _is_choice_dict(item) else item for item in value]
        return value

    @field_validator("messages_and_choices")
    @classmethod
    def _roles(cls, value: list[Choice | dict[str, Any]]) -> list[Choice | dict[str, Any]]:
        for index, item in enumerate(value):
            if isinstance(item, dict) and item.get("role") not in MESSAGE_ROLES:
                raise ValueError(
                    f"messages_and_choices[{index}] is neither a Choice nor a message with a role in"
                    f" {sorted(MESSAGE_ROLES)}: {str(item)[:200]}"
                )
        return value

    def check_metrics(self) -> None:
        """Re-check `metrics` (they may have been mutated in place since validation).

        Raises:
            ValueError: a metric that is not a number or a bool, or a non-finite reward.
        """
        for name, value in self.metrics.items():
            if not isinstance(value, (int, float)):  # bool is an int
                raise ValueError(f"metric {name!r} = {value!r} is not a number or a bool")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward {self.reward!r} is not finite")

    def choices(self) -> list[Choice]:
        """The policy's `Choice`s, in order (the trained turns)."""
        return [item for item in self.messages_and_choices if isinstance(item, Choice)]

    def messages(self) -> list[dict[str, Any]]:
        """The chat as message dicts, ready for the next `chat.completions.create` call.

        A `Choice` becomes its assistant message, token ids included, so that vllm_model continues the
        conversation from exactly the tokens it generated (no re-tokenization of earlier turns).
        """
        return [
            item.message.model_dump(mode="json", exclude_none=True) if isinstance(item, Choice) else item
            for item in self.messages_and_choices
        ]

    def __str__(self) -> str:
        return f"Trajectory(reward={self.reward}, metrics={self.metrics}, metadata={self.metadata})"


class RolloutError(BaseModel):
    """An exception raised by one rollout of a group, kept as a value."""

    type: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, exc: BaseException) -> RolloutError:
        return cls(
            type=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )


# `TrajectoryGroup(generator)`: __new__ must look inside the iterable (to tell awaitables from trajectories),
# which exhausts a generator before __init__ sees it, so __new__ leaves the list it made here for __init__.
_materialized = threading.local()


class TrajectoryGroup(BaseModel):
    """The trajectories of one task (a GRPO group), with the exceptions of its failed rollouts.

    `TrajectoryGroup(trajectories)` with `Trajectory` (or exception) items builds the group; with awaitables
    (`rollout(...)` coroutines) it returns a `PendingGroup` instead, to await or to gather.
    """

    trajectories: list[Trajectory]
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    exceptions: list[RolloutError] = Field(default_factory=list)

    def __new__(cls, trajectories: Iterable[Any] | None = None, **kwargs: Any) -> Any:
        if trajectories is None:
            return super().__new__(cls)
        items = list(trajectories)
        if any(inspect.isawaitable(item) for item in items):
            return PendingGroup(items, metadata=kwargs.get("metadata") or {})
        if not hasattr(_materialized, "items"):
            _materialized.items = {}
        _materialized.items[id(trajectories)] = items
        return super().__new__(cls)

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException] = (),
        *,
        metadata: dict[str, Any] | None = None,
        exceptions: Iterable[BaseException | RolloutError | dict[str, Any]] = (),
    ) -> None:
        stash = getattr(_materialized, "items", {})
        items = stash.pop(id(trajectories), None)
        items = list(trajectories) if items is None else items
        errors = [e for e in items if isinstance(e, BaseException)] + list(exceptions)
        super().__init__(
            trajectories=[t for t in items if not isinstance(t, BaseException)],
            metadata=metadata or {},
            exceptions=[RolloutError.from_exception(e) if isinstance(e, BaseException) else e for e in errors],
        )

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def rewards(self) -> list[float]:
        """[n] the trajectories' rewards, in order."""
        return [t.reward for t in self.trajectories]


# -- a group not yet run, and the progress of `gather_trajectory_groups` (nemo_gym.art.gather) that it advances --
@dataclass
class GatherProgress:
    """Counts and the progress bar of one `gather_trajectory_groups` call."""

    total: int = 0
    max_exceptions: int | float = 0
    pbar: tqdm | None = None
    sums: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    exceptions: int = 0

    def record(self, trajectory: Trajectory) -> None:
        trajectory.check_metrics()
        for name, value in {"reward": trajectory.reward, **trajectory.metrics}.items():
            self.sums[name] += float(value)
            self.counts[name] += 1
        self._update(1)

    def record_exception(self) -> None:
        """Count one failed rollout (or group); the caller re-raises it when `too_many_exceptions()`."""
        self.exceptions += 1
        self._update(1)

    def too_many_exceptions(self) -> bool:
        if 0 < self.max_exceptions < 1:
            return self.exceptions > self.max_exceptions * max(1, self.total)
        return self.exceptions > self.max_exceptions

    def _update(self, n: int) -> None:
        if self.pbar is None:
            return
        self.pbar.update(n)
        postfix: dict[str, Any] = {name: self.sums[name] / self.counts[name] for name in self.sums}
        if self.exceptions:
            postfix["exceptions"] = self.exceptions
        self.pbar.set_postfix(postfix, refresh=False)


GATHER_PROGRESS: contextvars.ContextVar[GatherProgress | None] = contextvars.ContextVar(
    "nemo_gym_art_gather", default=None
)


class PendingGroup:
    """The rollouts of one group, not yet run: `await` it for the `TrajectoryGroup`.

    Made by `TrajectoryGroup(awaitables)`. Inside `gather_trajectory_groups` each finished rollout advances
    the shared progress bar; a rollout that raises is kept in `exceptions` (or re-raised when the gather has
    seen more than `max_exceptions`). Awaited alone, a raising rollout is kept too.
    """

    def __init__(self, awaitables: list[Awaitable[Trajectory]], metadata: dict[str, Any]):
        self.awaitables = awaitables
        self.metadata = metadata

    @property
    def num_trajectories(self) -> int:
        return len(self.awaitables)

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        return self._run().__await__()

    async def _run(self) -> TrajectoryGroup:
        progress = GATHER_PROGRESS.get()
        trajectories: list[Trajectory] = []
        exceptions: list[BaseException] = []
        futures = [asyncio.ensure_future(a) for a in self.awaitables]
        try:
            for future in asyncio.as_completed(futures):
                try:
                    trajectory = await future
                except Exception as exc:  # a failed rollout is a value (BaseException: let cancellation through)
                    exceptions.append(exc)
                    if progress is not None:
                        progress.record_exception()
                        if progress.too_many_exceptions():
                            raise
                    continue
                if not isinstance(trajectory, Trajectory):
                    raise TypeError(f"a rollout returned {type(trajectory).__name__}, expected a Trajectory")
                trajectories.append(trajectory)
                if progress is not None:
                    progress.record(trajectory)
        finally:
            for future in futures:
                future.cancel()  # no-op for finished ones; stops the rest when we raise or are cancelled
        return TrajectoryGroup(trajectories, metadata=self.metadata, exceptions=exceptions)
