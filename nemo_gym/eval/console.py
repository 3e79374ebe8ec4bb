"""Rollouts in the terminal (rich): the conversation, tool calls and their outputs, per-reward scores, the total.

A rollout row follows docs/architecture.md, Data formats: the prompt is `responses_create_params.input` (a string or
a list of messages), the trajectory is `response.output` (Responses items: `message`, `reasoning`, `function_call`,
`function_call_output`, ...), `reward` is the total and `reward_components` (when the environment returns it, as rnow
projects do) the score of each reward. A failure record (`failure_class`, `message`) is shown as a failure, in red,
never as a reward. Every text from the row is shown literally (`rich.text.Text`, never markup), so a model that
writes `[bold]` cannot restyle the terminal. Token ids and log-probs are not shown, their count is.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = ["rollout_panel", "failure_panel", "summary_table", "verifier_fields", "new_console"]

_ROLE_STYLES = {
    "system": "magenta",
    "developer": "magenta",
    "user": "cyan",
    "assistant": "green",
    "tool": "yellow",
    "reasoning": "dim",
}
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
# Row keys that are not verifier fields: the task and bookkeeping keys the agent echoes back.
_NOT_VERIFIER = {"response", "reward", "reward_components", "agent_ref", "_ng_task_index", "_ng_rollout_index"}


# The viewer's HTML renderer (nemo_gym.viewer.render) reads items with these two as well.
def pretty_json(value: Any) -> str:
    """`value` pretty-printed when it is JSON (a string holding an object or a list, or such a value), else as is."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if not isinstance(parsed, (dict, list)):
            return value
        value = parsed
    return json.dumps(value, indent=2, ensure_ascii=False)


def content_text(content: Any) -> str:
    """A message's or tool output's text; non-text parts (images, files) appear as `[<type>]`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else pretty_json(content)
    parts = [
        (
            part["text"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else f"[{part.get('type', 'part')}]"
            if isinstance(part, dict)
            else str(part)
        )
        for part in content
    ]
    return "\n".join(parts)


def _prompt_items(params: Any) -> list[Any]:
    if not isinstance(params, dict):
        return []
    items: list[Any] = []
    if params.get("instructions"):
        items.append({"type": "message", "role": "system", "content": params["instructions"]})
    prompt = params.get("input")
    items += [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    return items


def _item_line(item: Any) -> tuple[str, Text]:
    """(label, body) of one input or output item."""
    if isinstance(item, str):
        return "user", Text(item)
    if not isinstance(item, dict):
        return "item", Text(pretty_json(item))
    kind = item.get("type") or ("message" if "role" in item else "item")
    if kind == "message":
        return str(item.get("role", "message")), Text(content_text(item.get("content")))
    if kind == "function_call":
        body = Text(f"{item.get('name', '?')}(", style="bold")
        body.append(_compact_json(item.get("arguments", "")), style="")
        body.append(")", style="bold")
        return "tool call", body
    if kind == "function_call_output":
        return "tool output", Text(pretty_json(content_text(item.get("output"))))
    if kind == "reasoning":
        parts = [content_text([part]) for part in (item.get("summary") or []) + (item.get("content") or [])]
        return "reasoning", Text("\n\n".join(p for p in parts if p) or "(no reasoning text)")
    return str(kind), Text(pretty_json(item))


def _compact_json(text: Any) -> str:
    """Tool-call arguments on one line when they are JSON (`{"a": 17, "b": 25}`), else as they are."""
    if isinstance(text, str):
        try:
            return json.dumps(json.loads(text), ensure_ascii=False)
        except ValueError:
            return text
    return json.dumps(text, ensure_ascii=False)


def _style(label: str) -> str:
    if label in ("tool call", "tool output"):
        return _ROLE_STYLES["tool"]
    return _ROLE_STYLES.get(label, "white")


def _conversation(row: dict[str, Any]) -> Table:
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    output = response.get("output") if isinstance(response.get("output"), list) else []
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, min_width=11)
    grid.add_column(overflow="fold")
    for item in [*_prompt_items(row.get("responses_create_params")), *output]:
        label, body = _item_line(item)
        grid.add_row(Text(label, style=f"bold {_style(label)}"), body)
    if not output:
        grid.add_row(Text("(no output)", style="bold red"), Text(""))
    return grid


def _format_score(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    return f"{value:g}" if math.isfinite(value) else str(value)


def verifier_fields(row: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """What the verifier added to the task row (e.g. `extracted_answer`, `failure_reason`, `stop_reason`):
    keys of `row` that the `task` (the row as dispatched) does not have, besides the reward and the response."""
    return {k: v for k, v in row.items() if k not in task and k not in _NOT_VERIFIER}


def _scores(row: dict[str, Any], task: dict[str, Any]) -> Text:
    text = Text()
    components = row.get("reward_components")
    if isinstance(components, dict) and components:
        text.append("rewards  ", style="bold")
        text.append("  ".join(f"{name} {_format_score(score)}" for name, score in components.items()))
        text.append("\n")
    extra = verifier_fields(row, task)
    for key, value in extra.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        text.append(f"{key}  ", style="dim bold")
        text.append(shown[:300] + ("..." if len(shown) > 300 else "") + "\n", style="dim")
    text.append("total reward  ", style="bold")
    text.append(_format_score(row.get("reward")), style="bold green" if _is_positive(row.get("reward")) else "bold")
    output = (row.get("response") or {}).get("output") if isinstance(row.get("response"), dict) else None
    counts = {key: sum(len(i.get(key) or []) for i in output or [] if isinstance(i, dict)) for key in _TOKEN_KEYS}
    if any(counts.values()):
        text.append("\nnot shown: " + ", ".join(f"{n} {key}" for key, n in counts.items() if n), style="dim")
    return text


def _is_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def rollout_panel(row: dict[str, Any], task: dict[str, Any], title: str) -> Panel:
    """One finished rollout: every message, tool call and tool output in order, then the per-reward scores,
    the verifier's other fields and the total reward. `task` is the row as dispatched (to tell the verifier's
    fields apart)."""
    model = (row.get("response") or {}).get("model") if isinstance(row.get("response"), dict) else None
    subtitle = Text(f"model {model}") if model else None
    return Panel(
        Group(_conversation(row), Text(""), _scores(row, task)),
        title=Text(title, style="bold"),
        subtitle=subtitle,
        title_align="left",
        border_style="blue",
        box=box.ROUNDED,
    )


def failure_panel(failure: dict[str, Any], title: str, task: dict[str, Any] | None = None) -> Panel:
    """One failed rollout: its failure class and message (and HTTP status, failed server), in red; no reward.
    When the failure carries the trajectory a failed verify got (`response`), the conversation comes first, with
    the prompt of `task` (the row as dispatched): what the verifier (e.g. a reward function) failed on."""
    text = Text()
    text.append("FAILED  ", style="bold red")
    text.append(str(failure.get("failure_class", "?")), style="bold red")
    for key in ("status_code", "failed_server", "transient"):
        if key in failure:
            text.append(f"  {key} {failure[key]}", style="red")
    text.append("\n")
    text.append(str(failure.get("message", "")))
    body: Any = text
    if isinstance(failure.get("response"), dict):
        body = Group(_conversation({**(task or {}), "response": failure["response"]}), Text(""), text)
    return Panel(
        body, title=Text(title + " · failed", style="bold red"), title_align="left", border_style="red", box=box.ROUNDED
    )


def summary_table(
    labels: dict[int, str], rows: list[dict[str, Any]], failures: list[dict[str, Any]], num_rollouts: int
) -> Table:
    """Per entry: rollouts done and failed, mean total reward, and the mean of each reward component."""
    by_entry: dict[int, list[dict[str, Any]]] = defaultdict(list)
    failed: dict[int, int] = defaultdict(int)
    for row in rows:
        by_entry[row["_ng_task_index"]].append(row)
    for failure in failures:
        failed[failure["_ng_task_index"]] += 1
    names = list(
        dict.fromkeys(
            name
            for row in rows
            for name in row.get("reward_components") or {}
            if isinstance(row.get("reward_components"), dict)
        )
    )
    table = Table(title="ng_try summary", box=box.SIMPLE_HEAVY, title_justify="left")
    for column in ("entry", "where", "ok", "failed", "mean reward", *names):
        table.add_column(column, justify="left" if column in ("entry", "where") else "right")
    for entry, label in labels.items():
        done = by_entry.get(entry, [])
        mean = _mean([r.get("reward") for r in done])
        component_means = [_mean([(r.get("reward_components") or {}).get(name) for r in done]) for name in names]
        table.add_row(
            str(entry),
            label,
            f"{len(done)}/{num_rollouts}",
            Text(str(failed[entry]), style="bold red" if failed[entry] else ""),
            _shown_mean(mean),
            *map(_shown_mean, component_means),
        )
    return table


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) / len(numbers) if numbers else None


def _shown_mean(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def new_console() -> Console:
    """A console on stdout that keeps text literal (no emoji codes, no markup in printed strings)."""
    return Console(emoji=False, markup=False, highlight=False, soft_wrap=False)
