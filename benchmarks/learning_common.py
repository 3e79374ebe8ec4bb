"""Shared pieces of the learning benchmarks (`learning_basic_arithmetic.py`, `learning_tool_agent.py`).

Held-out figures: a rollout file of `ng_collect_rollouts` (or an ng_train evaluation, `rollouts/eval_step_*.jsonl`) →
per-task means → the mean with a 95 % percentile-bootstrap interval over tasks (10,000 resamples,
`nemo_gym.eval.bootstrap_ci`, draw for draw from a seeded `random.Random`); two files of
the same tasks → the paired difference with its interval. The reward curve: training batch mean reward per GRPO
step, its moving average, held-out mean reward at each evaluation (ng_train's `metrics.jsonl`).
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from nemo_gym.common.jsonl import iter_jsonl, read_jsonl
from nemo_gym.eval.bootstrap_ci import DEFAULT_RESAMPLES, bootstrap_mean_ci

__all__ = ["eval_per_task", "compare", "format_comparison", "read_metrics", "eval_files", "plot_reward_curve"]


def eval_per_task(rollouts_file: Path, key: str) -> dict[int, list[float]]:
    """Per task (its index in the evaluated file), the rewards (key `reward`) or passes (`pass`) of its samples."""
    per_task: dict[int, list[float]] = defaultdict(list)
    for _, row in iter_jsonl(rollouts_file):
        value = float(row["reward"]) if key == "reward" else float(float(row["reward"]) >= 1.0)
        per_task[row["_ng_task_index"]].append(value)
    return per_task


def compare(before_file: Path, after_file: Path, rng: random.Random) -> dict[str, dict[str, Any]]:
    """`mean_reward` and `pass_at_1` of two evaluations of the same tasks: before, after and the paired difference,
    each with its 95 % interval, over the tasks present in both files."""
    summary = {}
    for key in ("reward", "pass"):
        before, after = eval_per_task(before_file, key), eval_per_task(after_file, key)
        tasks = sorted(set(before) & set(after))
        b = [sum(before[t]) / len(before[t]) for t in tasks]
        a = [sum(after[t]) / len(after[t]) for t in tasks]
        diff = [y - x for x, y in zip(b, a)]
        summary["mean_reward" if key == "reward" else "pass_at_1"] = {
            "before": sum(b) / len(b),
            "before_ci95": bootstrap_mean_ci(b, DEFAULT_RESAMPLES, rng=rng),
            "after": sum(a) / len(a),
            "after_ci95": bootstrap_mean_ci(a, DEFAULT_RESAMPLES, rng=rng),
            "difference": sum(diff) / len(diff),
            "difference_ci95": bootstrap_mean_ci(diff, DEFAULT_RESAMPLES, rng=rng),
            "tasks": len(tasks),
        }
    return summary


def format_comparison(name: str, s: dict[str, Any]) -> str:
    """One line: before [ci] -> after [ci]; difference [ci] (tasks)."""
    return (
        f"{name}: before {s['before']:.3f} [{s['before_ci95'][0]:.3f}, {s['before_ci95'][1]:.3f}] -> after"
        f" {s['after']:.3f} [{s['after_ci95'][0]:.3f}, {s['after_ci95'][1]:.3f}]; difference {s['difference']:+.3f}"
        f" [{s['difference_ci95'][0]:+.3f}, {s['difference_ci95'][1]:+.3f}] ({s['tasks']} tasks)"
    )


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of an ng_train run's `metrics.jsonl`."""
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


def eval_files(run_dir: Path) -> list[Path]:
    """An ng_train run's evaluation rollout files, in step order (side files left out)."""
    files = sorted((Path(run_dir) / "rollouts").glob("eval_step_*.jsonl"))
    return [
        path
        for path in files
        if not path.name.endswith(("_failures.jsonl", "_tasks.jsonl", "_materialized_inputs.jsonl"))
    ]


def plot_reward_curve(
    metrics: list[dict[str, Any]], path: Path, title: str, references: dict[str, float] | None = None
) -> None:
    """The reward curve PNG; `references`: labelled held-out levels drawn as horizontal dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [(m["step"], m["reward_mean"]) for m in metrics if "reward_mean" in m and "time_generation_s" in m]
    evals = [(m["step"], m["eval_reward_mean"]) for m in metrics if "eval_reward_mean" in m]
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        xs, ys = zip(*steps)
        ax.plot(xs, ys, ".", alpha=0.4, label="training batch mean reward")
        window = 5
        smooth = [
            sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))
        ]
        ax.plot(xs, smooth, "-", label=f"training, moving average ({window} steps)")
    if evals:
        ex, ey = zip(*evals)
        ax.plot(ex, ey, "o-", color="black", label="held-out mean reward")
    for (label, level), style in zip((references or {}).items(), ("--", ":", "-.")):
        ax.axhline(level, color="gray", linestyle=style, label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
