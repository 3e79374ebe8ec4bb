"""`ng_eval`'s tables: one report (`format_table`), and a baseline and a candidate side by side with their
difference (`format_comparison_table`); `print_report` prints them. All take the JSON report `nemo_gym.eval.command`
writes; rich renders the tables when installed, else aligned plain text.
"""

from __future__ import annotations

import io
from typing import Any

__all__ = ["format_comparison_table", "format_table", "print_report"]

_SIDES = ("baseline", "candidate", "difference")


def _metric_names(ks: list[int]) -> list[str]:
    return ["mean_reward", *(f"pass@{k}" for k in ks), *(f"pass^{k}" for k in ks)]


def _number(value: float | None, signed: bool = False) -> str:
    return "n/a" if value is None else f"{value:+.4f}" if signed else f"{value:.4f}"


def _render(title: str, header: list[str], rows: list[list[str]], section_ends: set[int]) -> str:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])
    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for i, row in enumerate(rows):
        table.add_row(*row, end_section=i in section_ends)
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    return console.file.getvalue().rstrip()


def format_table(report: dict[str, Any]) -> str:
    """One report: a row per environment and one overall (rich when installed, else aligned plain text)."""
    metric_names = _metric_names(report["k"])
    header = ["environment", "tasks", "samples", "excluded", *metric_names]
    groups = [*report["environments"].items(), ("overall", report["overall"])]
    rows = [
        [
            name,
            str(m["num_tasks"]),
            str(m["num_samples"]),
            str(m["num_tasks_excluded"]),
            *(_number(m[x]) for x in metric_names),
        ]
        for name, m in groups
    ]
    return _render(
        f"pass@k / pass^k (sample passes when reward >= {report['pass_threshold']})", header, rows, {len(rows) - 2}
    )


def format_comparison_table(report: dict[str, Any]) -> str:
    """Baseline, candidate and their difference per environment and overall, on the tasks scored in both files,
    then the paired mean reward difference with its bootstrap interval."""
    paired = report["comparison"]["paired"]
    metric_names = [*_metric_names(report["k"]), "tool_calls_per_sample", "turns_per_sample"]
    header = ["environment", "rollouts", "tasks", "samples", *metric_names]
    groups = [*paired["environments"].items(), ("overall", paired["overall"])]
    rows, section_ends = [], set()
    for name, group in groups:
        for side in _SIDES:
            m = group[side]
            counts = ["", ""] if side == "difference" else [str(m["num_tasks"]), str(m["num_samples"])]
            rows.append(
                [
                    name if side == "baseline" else "",
                    side,
                    *counts,
                    *(_number(m.get(x), side == "difference") for x in metric_names),
                ]
            )
        section_ends.add(len(rows) - 1)
    title = (
        f"baseline vs candidate on the {paired['num_tasks']} tasks scored in both (sample passes when reward >="
        f" {report['pass_threshold']})"
    )
    return _render(title, header, rows, section_ends) + "\n" + _difference_line(paired)


def _difference_line(paired: dict[str, Any]) -> str:
    diff = paired["mean_reward_difference"]
    if diff["mean"] is None:
        return "No task is scored in both files: no paired difference."
    low, high = diff["ci95"]
    text = (
        f"Mean reward difference (candidate - baseline), paired by task over {paired['num_tasks']} tasks:"
        f" {diff['mean']:+.4f}, 95 % bootstrap interval [{low:+.4f}, {high:+.4f}] ({diff['resamples']} resamples over"
        f" tasks); improved {diff['improved']}, worsened {diff['worsened']}, unchanged {diff['unchanged']}."
    )
    only = {"baseline": len(paired["baseline_only"]), "candidate": len(paired["candidate_only"])}
    if any(only.values()):
        text += (
            f"\nTasks scored in one file only (not compared): baseline {only['baseline']}, candidate"
            f" {only['candidate']}."
        )
    if paired["prompt_mismatches"]:
        text += (
            f"\nWarning: {len(paired['prompt_mismatches'])} paired tasks have different prompts in the two files"
            " (prompt_mismatches in the report)."
        )
    return text


def print_report(report: dict[str, Any], report_path: str) -> int:
    """Print the table(s), the exclusions and the report's path; returns ng_eval's exit status (1 when a task of either
    file is excluded)."""
    print(format_table(report))
    excluded = len(report["excluded_tasks"])
    if excluded:
        print(
            f"{excluded} tasks excluded (infrastructure failures or missing samples); see excluded_tasks in the report."
        )
    if "comparison" in report:
        comparison = report["comparison"]
        print(f"\nbaseline: {comparison['baseline_rollouts_jsonl_fpath']}\ncandidate: {report['rollouts_jsonl_fpath']}")
        print(format_comparison_table(report))
        baseline_excluded = len(comparison["baseline"]["excluded_tasks"])
        if baseline_excluded:
            print(f"{baseline_excluded} baseline tasks excluded; see comparison.baseline.excluded_tasks in the report.")
        excluded += baseline_excluded
    print(f"Report: {report_path}")
    return 1 if excluded else 0
