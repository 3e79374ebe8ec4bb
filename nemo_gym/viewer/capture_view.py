"""HTML of what `ng_collect_rollouts +observability_enabled=true` adds to a rollout: its `ng_trajectory` capture
record as tables (the invocation's status, each model call's status, finish reason, duration and tokens, each tool
call's status and duration, the record's gaps; the requests and answers are not repeated: the trajectory above is
the conversation), its `ng_perf` line, and its health verdict (`ng_health_check`'s `rollout_verdicts.jsonl` beside
the rollouts file, read by `HealthVerdicts.beside`). Every string from the row is HTML-escaped."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collect.health import VERDICTS_FILE, file_source, verdict_sources
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import NG_PERF_KEY, NG_TRAJECTORY_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, read_jsonl

__all__ = ["HealthVerdicts", "render_capture", "render_verdict"]

_VERDICT_COLORS = {"healthy": "#dcfce7", "unhealthy": "#fee2e2", "unobserved": "#f3f4f6"}


def _cell(value: Any) -> str:
    if value is None:
        return "<td></td>"
    if isinstance(value, float):
        return f"<td>{value:.1f}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    head = "".join(f"<th>{html.escape(name)}</th>" for name in header)
    body = "".join("<tr>" + "".join(_cell(value) for value in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _model_calls(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = []
    for number, call in enumerate(record.get("model_calls") or [], 1):
        if not isinstance(call, dict):
            continue
        metadata, stats = call.get("response_metadata") or {}, call.get("token_stats") or {}
        status = metadata.get("status_code")
        error = metadata.get("error_category")
        rows.append(
            (
                number,
                f"{status if status is not None else 'no answer'}{f' ({error})' if error else ''}",
                metadata.get("finish_reason") or metadata.get("response_status"),
                call.get("duration_ms"),
                stats.get("prompt_tokens"),
                stats.get("completion_tokens"),
            )
        )
    return rows


def _tool_calls(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (tool.get("tool_name"), tool.get("status"), tool.get("error_type"), tool.get("duration_ms"))
        for tool in record.get("tool_calls") or []
        if isinstance(tool, dict)
    ]


def render_capture(row: dict[str, Any]) -> str:
    """The "Capture record" section of a rollout's page; "" when the row has no `ng_trajectory`."""
    record = row.get(NG_TRAJECTORY_KEY)
    if not isinstance(record, dict):
        return ""
    parts = ["<h4>Capture record (ng_trajectory)</h4>"]
    for invocation in record.get("invocations") or []:
        if isinstance(invocation, dict):
            error = f", {invocation['error_type']}" if invocation.get("error_type") else ""
            parts.append(
                f"<p>invocation <code>{html.escape(str(invocation.get('invocation_id')))}</code>: "
                f"{html.escape(str(invocation.get('status')))}{html.escape(error)}, "
                f"{len(record.get('turns') or [])} turns</p>"
            )
    calls = _model_calls(record)
    if calls:
        header = ("model call", "status", "finish", "ms", "prompt tokens", "completion tokens")
        parts.append(_table(header, calls))
    tools = _tool_calls(record)
    if tools:
        parts.append(_table(("tool call", "status", "error", "ms"), tools))
    gaps = [gap.get("code") for gap in record.get("gaps") or [] if isinstance(gap, dict)]
    if gaps:
        parts.append(f"<p>not observed: {html.escape(', '.join(map(str, gaps)))}</p>")
    perf = row.get(NG_PERF_KEY)
    if isinstance(perf, dict):
        shown = ", ".join(f"{key} {value}" for key, value in perf.items())
        parts.append(f"<p><small>ng_perf: {html.escape(shown)}</small></p>")
    return "\n".join(parts)


def render_verdict(verdict: dict[str, Any] | None) -> str:
    """A rollout's health verdict (a `rollout_verdicts.jsonl` line) as a box: the verdict, each finding's check and
    what it saw, the checks left unobserved; "" without one."""
    if not isinstance(verdict, dict):
        return ""
    name = str(verdict.get("verdict"))
    lines = [f"<b>health: {html.escape(name)}</b>"]
    for finding in verdict.get("findings") or []:
        if isinstance(finding, dict):
            detail = {k: v for k, v in finding.items() if k != "check"}
            text = f"{finding.get('check')}: {orjson.dumps(detail).decode()}" if detail else str(finding.get("check"))
            lines.append(html.escape(text))
    if verdict.get("unobserved"):
        lines.append(html.escape(f"unobserved: {', '.join(map(str, verdict['unobserved']))}"))
    color = _VERDICT_COLORS.get(name, "#ffffff")
    return f'<div class="ng-item ng-health" style="background:{color}">' + "<br>".join(lines) + "</div>"


class HealthVerdicts:
    """The health verdicts of a rollouts file by (task index, rollout index), from the `rollout_verdicts.jsonl`
    that `ng_health_check` (or the collection) wrote beside it (it writes the file whole); empty when there is none or
    a line of it is no JSON object, and empty, with a `note` saying why, when its sources record
    (`nemo_gym.collect.health.verdict_sources`) says they are of another file, of this file before it changed, or of
    several files checked together (whose task and rollout indexes can collide). Without a sources record (NeMo Gym
    0.7.0's check wrote them) they are shown, and the `note` says that nothing tells which file they are of."""

    def __init__(self, verdicts: dict[tuple[int, int], dict[str, Any]], path: Path | None = None, note: str = ""):
        self.verdicts, self.path, self.note = verdicts, path, note

    @classmethod
    def beside(cls, rollouts: str | Path) -> HealthVerdicts:
        rollouts = Path(rollouts).expanduser()
        path = rollouts.parent / VERDICTS_FILE
        try:
            rows = read_jsonl(path) if path.is_file() else []
        except (DataError, OSError):
            return cls({})
        verdicts = {(row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)): row for row in rows}
        if not verdicts:
            return cls({})
        sources = verdict_sources(path.parent)
        if sources is None:
            return cls(verdicts, path, "nothing records which rollouts file they are of (NeMo Gym 0.7.0's check)")
        rerun = f"run `ng_health_check +rollouts_jsonl_fpath={rollouts}` for this file's"
        if len(sources) > 1:
            names = ", ".join(str(source["name"]) for source in sources)
            return cls({}, None, f"`{path}` holds the verdicts of {names} checked together, not shown: {rerun}")
        try:
            mine = file_source(rollouts)
        except OSError:
            return cls({})
        (source,) = sources
        if source["sha256"] == mine["sha256"]:
            return cls(verdicts, path)
        if source["path"] == mine["path"]:
            return cls({}, None, f"this file changed since `{path}` was written, not shown: {rerun}")
        return cls({}, None, f"`{path}` holds the verdicts of {source['name']}, not of this file: {rerun}")

    def of(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The verdict of rollout `row`, or None."""
        return self.verdicts.get((row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)))

    def label(self, task_index: int, rollout_index: int) -> str:
        """The verdict of rollout (task index, rollout index) for the table: `healthy`, `unhealthy: <checks>`,
        `unobserved`, or "" without one."""
        verdict = self.verdicts.get((task_index, rollout_index)) or {}
        checks = [str(f.get("check")) for f in verdict.get("findings") or [] if isinstance(f, dict)]
        return f"{verdict.get('verdict', '')}{': ' + ', '.join(dict.fromkeys(checks)) if checks else ''}"
