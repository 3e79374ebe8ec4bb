"""`CollectSummary`: what a collection did, as `ng_collect_rollouts` prints it and returns its exit status
(`nemo_gym.collect.command`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_gym.collect.attempts import MAX_ATTEMPTS, TERMINAL
from nemo_gym.collect.engine import CollectResult
from nemo_gym.collect.files import OutputPaths

__all__ = ["CollectSummary"]


@dataclass
class CollectSummary:
    """What a collection did. Counts are rollouts; `wall_s` and `rollouts_per_s` cover this run only."""

    output_jsonl_fpath: str
    rollouts_expected: int
    rollouts_done: int
    rollouts_this_run: int
    rollouts_resumed: int
    failures_by_class: dict[str, int]
    mean_reward: float | None
    wall_s: float
    retries: int
    failures_jsonl_fpath: str
    watchdog: dict[str, Any] = field(default_factory=dict)
    not_retried: dict[str, int] = field(default_factory=dict)

    @property
    def rollouts_missing(self) -> int:
        return self.rollouts_expected - self.rollouts_done

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts_this_run / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def exit_status(self) -> int:
        return 0 if self.rollouts_missing == 0 else 1

    @classmethod
    def of(cls, result: CollectResult, paths: OutputPaths) -> CollectSummary:
        """The summary of a collection into the files `paths`."""
        return cls(
            output_jsonl_fpath=str(paths.output),
            rollouts_expected=result.rollouts_expected,
            rollouts_done=result.rollouts_done,
            rollouts_this_run=len(result.rollouts),
            rollouts_resumed=result.rollouts_resumed,
            failures_by_class=result.failures_by_class,
            mean_reward=result.mean_reward,
            wall_s=result.wall_s,
            retries=result.retries,
            failures_jsonl_fpath=str(paths.failures),
            watchdog=result.watchdog,
            not_retried=result.not_retried,
        )

    def as_metrics(self) -> dict[str, Any]:
        """The `collection` part of `<out>_aggregate_metrics.json`."""
        return {
            "rollouts_expected": self.rollouts_expected,
            "rollouts_done": self.rollouts_done,
            "rollouts_this_run": self.rollouts_this_run,
            "rollouts_resumed": self.rollouts_resumed,
            "rollouts_failed": self.rollouts_missing,
            "failures_by_class": self.failures_by_class,
            "rollouts_not_retried": self.not_retried,
            "mean_reward": self.mean_reward,
            "wall_s": self.wall_s,
            "rollouts_per_s": self.rollouts_per_s,
            "retries": self.retries,
            "watchdog": self.watchdog,
        }

    def format(self) -> str:
        mean = "n/a" if self.mean_reward is None else f"{self.mean_reward:.4f}"
        lines = [
            (
                f"Rollouts: {self.rollouts_done}/{self.rollouts_expected} in {self.output_jsonl_fpath} "
                f"({self.rollouts_this_run} this run, {self.rollouts_resumed} from an earlier run)"
            ),
            f"Mean reward: {mean}",
            f"Wall time: {self.wall_s:.1f} s, {self.rollouts_per_s:.2f} rollouts/s, {self.retries} retries",
        ]
        if self.rollouts_missing:
            classes = ", ".join(f"{name}: {n}" for name, n in sorted(self.failures_by_class.items())) or "none this run"
            retryable = self.rollouts_missing - sum(self.not_retried.values())
            rerun = (
                f" Rerun the same command to retry {retryable if self.not_retried else 'them'}." if retryable else ""
            )
            lines.append(
                f"Failed: {self.rollouts_missing} rollouts ({classes}); they are in {self.failures_jsonl_fpath}, "
                f"not in the output.{rerun}"
            )
        if self.not_retried:
            lines.append(self._not_retried_line())
        return "\n".join(lines)

    def _not_retried_line(self) -> str:
        """Which failed rollouts this run did not send again, and why (`nemo_gym.collect.attempts`)."""
        reasons = {
            TERMINAL: "whose failure was terminal (_ng_failure_terminal: a retry cannot help, said its server)",
            MAX_ATTEMPTS: "that failed +max_rollout_attempts times (raise it to retry them)",
        }
        held = "; ".join(f"{n} rollout{'s' * (n != 1)} {reasons[why]}" for why, n in sorted(self.not_retried.items()))
        return f"Not retried: {held}."
