"""Two rollout files of the same tasks side by side (a baseline, e.g. the policy before training, and a
candidate, e.g. after): tasks paired by key, each side's summary, per-task deltas, and the paired difference of
mean reward with a percentile bootstrap interval over tasks. `ng_viewer +baseline_jsonl_fpath=` and
`ng_eval +baseline_rollouts=` both use it.

A task's key is `_ng_task_index` (the row's index in the collection's input file), else the SHA-256 of its prompt
(`responses_create_params.input`) and `agent_ref`: the same prompt to the same agent is the same task, whatever
the sampling parameters. Two files keyed by index are paired by index; a pair whose prompts differ is flagged
(`TaskPair.same_prompt` False): the files were collected from different inputs, or on purpose with other prompts.

Per rollout: `tool_calls` counts `function_call` items of `response.output`; `turns` counts the model's turns,
the runs of consecutive model items (assistant message, reasoning, function_call) between tool outputs and other
roles' messages, i.e. the model calls an agent made: `[function_call, function_call_output, message]` is 2 turns, and
so is a game's `[assistant, user observation, assistant]`.

Pure Python (no numpy): this is core, and ng_eval runs without the viewer's extras.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from nemo_gym.common.jsonl import TASK_INDEX_KEY
from nemo_gym.env.trajectory import count_model_turns, with_message_types
from nemo_gym.eval.bootstrap_ci import DEFAULT_RESAMPLES, bootstrap_mean_ci

__all__ = [
    "PairedDifference",
    "SideSummary",
    "TaskKey",
    "TaskPair",
    "TaskTally",
    "pair_tasks",
    "paired_reward_difference",
    "prompt_digest",
    "summarize",
    "task_key",
    "tool_calls_and_turns",
]

TaskKey = int | str


def prompt_digest(row: Mapping[str, Any]) -> str:
    """SHA-256 (16 hex digits) of the row's `responses_create_params.input` and `agent_ref`."""
    params = row.get("responses_create_params")
    prompt = params.get("input") if isinstance(params, dict) else None
    return hashlib.sha256(orjson.dumps([prompt, row.get("agent_ref")], option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def task_key(row: Mapping[str, Any]) -> TaskKey:
    """`_ng_task_index` when it is an int, else `"sha256:" + prompt_digest(row)`."""
    index = row.get(TASK_INDEX_KEY)
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    return "sha256:" + prompt_digest(row)


def tool_calls_and_turns(response: Any) -> tuple[int, int]:
    """(function calls, model turns) in `response.output` (see the module docstring; turns as
    `nemo_gym.env.trajectory.count_model_turns`, a message item written without its `type` counted as one); (0, 0) for
    no output."""
    output = response.get("output") if isinstance(response, dict) else None
    items = with_message_types(output if isinstance(output, list) else ())
    return sum(item.get("type") == "function_call" for item in items), count_model_turns(items)


@dataclass
class TaskTally:
    """One task's rollouts in one file, as sums (a sample passes when its reward >= the pass threshold)."""

    environment: str
    prompt_digest: str | None = None
    num_rollouts: int = 0
    reward_sum: float = 0.0
    num_passed: int = 0
    tool_calls: int = 0
    turns: int = 0
    first_line: int | None = None

    def add(self, reward: float, passed: bool, tool_calls: int, turns: int) -> None:
        self.num_rollouts += 1
        self.reward_sum += reward
        self.num_passed += passed
        self.tool_calls += tool_calls
        self.turns += turns

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.num_rollouts

    @property
    def pass_rate(self) -> float:
        return self.num_passed / self.num_rollouts


@dataclass(frozen=True)
class SideSummary:
    """One file over its tasks; every mean is over rollouts (a task with more rollouts weighs more)."""

    num_tasks: int
    num_rollouts: int
    mean_reward: float | None
    pass_rate: float | None
    tool_calls_per_rollout: float | None
    turns_per_rollout: float | None


def summarize(tallies: Iterable[TaskTally]) -> SideSummary:
    """The summary of one file's tasks (tasks without rollouts are not counted); means None without rollouts."""
    tallies = [t for t in tallies if t.num_rollouts]
    n = sum(t.num_rollouts for t in tallies)

    def per_rollout(total: float) -> float | None:
        return total / n if n else None

    return SideSummary(
        num_tasks=len(tallies),
        num_rollouts=n,
        mean_reward=per_rollout(sum(t.reward_sum for t in tallies)),
        pass_rate=per_rollout(sum(t.num_passed for t in tallies)),
        tool_calls_per_rollout=per_rollout(sum(t.tool_calls for t in tallies)),
        turns_per_rollout=per_rollout(sum(t.turns for t in tallies)),
    )


PairStatus = Literal["both", "baseline only", "candidate only"]


@dataclass(frozen=True)
class TaskPair:
    """A task of either file: its tally in each (None where the file does not have it)."""

    key: TaskKey
    baseline: TaskTally | None
    candidate: TaskTally | None

    @property
    def status(self) -> PairStatus:
        if self.baseline is not None and self.candidate is not None:
            return "both"
        return "baseline only" if self.candidate is None else "candidate only"

    @property
    def environment(self) -> str:
        return (self.candidate or self.baseline).environment  # type: ignore[union-attr]  # one of them is set

    @property
    def reward_delta(self) -> float | None:
        """Candidate minus baseline mean reward of this task; None unless in both."""
        return self.candidate.mean_reward - self.baseline.mean_reward if self.baseline and self.candidate else None

    @property
    def same_prompt(self) -> bool | None:
        """Whether both files hold the same prompt for this task; None unless in both with known prompts."""
        if not (self.baseline and self.candidate) or None in (
            self.baseline.prompt_digest,
            self.candidate.prompt_digest,
        ):
            return None
        return self.baseline.prompt_digest == self.candidate.prompt_digest


def _order(key: TaskKey) -> tuple[bool, Any]:
    return isinstance(key, str), key  # task indices first, ascending; then prompt digests


def pair_tasks(baseline: Mapping[TaskKey, TaskTally], candidate: Mapping[TaskKey, TaskTally]) -> list[TaskPair]:
    """Every task of either file (with at least one rollout there), by key, sorted (indices, then digests)."""

    def live(tallies: Mapping[TaskKey, TaskTally], key: TaskKey) -> TaskTally | None:
        tally = tallies.get(key)
        return tally if tally is not None and tally.num_rollouts else None

    keys = {k for k, t in baseline.items() if t.num_rollouts} | {k for k, t in candidate.items() if t.num_rollouts}
    return [TaskPair(key, live(baseline, key), live(candidate, key)) for key in sorted(keys, key=_order)]


@dataclass(frozen=True)
class PairedDifference:
    """Candidate minus baseline over the tasks in both files, each task weighing the same.

    `mean_difference` is the mean over paired tasks of (candidate task mean reward - baseline task mean reward);
    `ci95` its 95 % percentile bootstrap interval over tasks (None without a paired task).
    """

    num_tasks: int
    mean_difference: float | None
    ci95: tuple[float, float] | None
    improved: int
    worsened: int
    unchanged: int
    resamples: int = DEFAULT_RESAMPLES
    prompt_mismatches: list[TaskKey] = field(default_factory=list)


def paired_reward_difference(
    pairs: Iterable[TaskPair], resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> PairedDifference:
    """The paired difference of mean reward over the pairs in both files (see `PairedDifference`)."""
    both = [p for p in pairs if p.status == "both"]
    deltas = [p.reward_delta for p in both]
    return PairedDifference(
        num_tasks=len(deltas),
        mean_difference=statistics.fmean(deltas) if deltas else None,
        ci95=bootstrap_mean_ci(deltas, resamples, seed=seed) if deltas else None,
        improved=sum(d > 0 for d in deltas),
        worsened=sum(d < 0 for d in deltas),
        unchanged=sum(d == 0 for d in deltas),
        resamples=resamples,
        prompt_mismatches=[p.key for p in both if p.same_prompt is False],
    )
