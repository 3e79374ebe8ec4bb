"""HTML rendering of one rollout: the prompt, the trajectory, the reward and the verifier's fields.

Rows follow docs/architecture.md, Data formats: `responses_create_params.input` (a string or a list of messages) is
the prompt, `response.output` (Responses API items: `message`, `reasoning`, `function_call`, `function_call_output`,
...) is the trajectory, and the other top-level keys are the task and verifier fields. Every string from the row is
HTML-escaped. Token ids and log-probs are not shown (they are long and unreadable); their count is. A rollout's
capture record (`ng_trajectory`) and its health verdict are shown as `nemo_gym.viewer.capture_view` renders them.
"""

from __future__ import annotations

import html
import json
from typing import Any

from nemo_gym.common.jsonl import NG_PERF_KEY, NG_TRAJECTORY_KEY
from nemo_gym.eval.console import content_text, pretty_json
from nemo_gym.viewer.capture_view import render_capture, render_verdict

__all__ = ["render_rollout", "VERIFIER_EXCLUDED_KEYS"]

# Top-level keys shown elsewhere (or not at all) rather than among the task and verifier fields.
VERIFIER_EXCLUDED_KEYS = {"responses_create_params", "response", "reward", NG_TRAJECTORY_KEY, NG_PERF_KEY}
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_ROLE_COLORS = {"system": "#f3e8ff", "developer": "#f3e8ff", "user": "#e0f2fe", "assistant": "#ecfdf5"}
_KIND_COLORS = {"reasoning": "#fef9c3", "function_call": "#ffedd5", "function_call_output": "#f1f5f9"}

_STYLE = """<style>
.ng-rollout {font-family: ui-sans-serif, system-ui, sans-serif; font-size: 14px; color: #111827;}
.ng-rollout .ng-item {border: 1px solid #d1d5db; border-radius: 6px; margin: 6px 0; padding: 6px 10px;}
.ng-rollout .ng-label {font-weight: 600; font-size: 12px; text-transform: uppercase; color: #374151;}
.ng-rollout pre {white-space: pre-wrap; word-break: break-word; margin: 4px 0; font-size: 13px;
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; background: transparent; color: #111827;}
.ng-rollout table {border-collapse: collapse;}
.ng-rollout td {border: 1px solid #e5e7eb; padding: 2px 8px; vertical-align: top;}
.ng-rollout .ng-reward {font-size: 18px; font-weight: 700;}
</style>"""


def _escape(text: Any) -> str:
    return html.escape(text if isinstance(text, str) else json.dumps(text, ensure_ascii=False))


def _box(label: str, body: str, color: str = "#ffffff", css_class: str = "") -> str:
    return (
        f'<div class="ng-item {css_class}" style="background:{color}"><div class="ng-label">{label}</div>{body}</div>'
    )


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def _message(item: dict[str, Any]) -> str:
    role = str(item.get("role", "message"))
    return _box(
        html.escape(role),
        _pre(content_text(item.get("content"))),
        _ROLE_COLORS.get(role, "#ffffff"),
        f"ng-{html.escape(role)}",
    )


def _reasoning(item: dict[str, Any]) -> str:
    texts = [content_text([part]) for part in (item.get("summary") or []) + (item.get("content") or [])]
    text = "\n\n".join(t for t in texts if t)
    if not text:
        text = "(no reasoning text" + ("; encrypted content" if item.get("encrypted_content") else "") + ")"
    return _box("reasoning", _pre(text), _KIND_COLORS["reasoning"], "ng-reasoning")


def _function_call(item: dict[str, Any]) -> str:
    name = html.escape(str(item.get("name", "?")))
    call_id = html.escape(str(item.get("call_id", "")))
    body = f'<div>tool <code class="ng-tool-name">{name}</code> <small>call_id {call_id}</small></div>'
    return _box(
        "function call",
        body + _pre(pretty_json(item.get("arguments", ""))),
        _KIND_COLORS["function_call"],
        "ng-function-call",
    )


def _function_call_output(item: dict[str, Any]) -> str:
    call_id = html.escape(str(item.get("call_id", "")))
    body = f"<div><small>call_id {call_id}</small></div>" + _pre(pretty_json(content_text(item.get("output"))))
    return _box("function call output", body, _KIND_COLORS["function_call_output"], "ng-function-output")


def _other(item: dict[str, Any]) -> str:
    kind = html.escape(str(item.get("type", "item")))
    return _box(kind, f"<details><summary>JSON</summary>{_pre(pretty_json(item))}</details>")


def render_item(item: Any) -> str:
    """One input or output item as HTML."""
    if isinstance(item, str):
        return _box("user", _pre(item), _ROLE_COLORS["user"], "ng-user")
    if not isinstance(item, dict):
        return _box("item", _pre(pretty_json(item)))
    kind = item.get("type") or ("message" if "role" in item else None)
    renderers = {
        "message": _message,
        "reasoning": _reasoning,
        "function_call": _function_call,
        "function_call_output": _function_call_output,
    }
    return renderers.get(kind, _other)(item)


def _prompt(params: Any) -> list[str]:
    if not isinstance(params, dict):
        return []
    parts = []
    if params.get("instructions"):
        parts.append(
            _box("instructions", _pre(content_text(params["instructions"])), _ROLE_COLORS["system"], "ng-system")
        )
    prompt = params.get("input")
    items = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    parts += [render_item(item) for item in items]
    tools = [t.get("name", "?") for t in params.get("tools") or [] if isinstance(t, dict)]
    if tools:
        parts.append(f"<div><small>tools offered: {html.escape(', '.join(map(str, tools)))}</small></div>")
    return parts


def _fields_table(fields: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(k)}</code></td><td>{_pre(pretty_json(v))}</td></tr>" for k, v in fields.items()
    )
    return f"<table>{rows}</table>" if rows else "<p>(none)</p>"


def _token_note(output: list[Any]) -> str:
    counts = {key: sum(len(i.get(key) or []) for i in output if isinstance(i, dict)) for key in _TOKEN_KEYS}
    shown = ", ".join(f"{n} {key}" for key, n in counts.items() if n)
    return f"<p><small>not shown: {shown}</small></p>" if shown else ""


def render_rollout(row: dict[str, Any], title: str = "", verdict: dict[str, Any] | None = None) -> str:
    """`row` (one rollout) as an HTML fragment: header (with its health `verdict`, a `rollout_verdicts.jsonl` line,
    when given), prompt, trajectory, reward, verifier fields, and its capture record when it has one."""
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    output = response.get("output") if isinstance(response.get("output"), list) else []
    reward = row.get("reward")
    parts = [_STYLE, '<div class="ng-rollout">']
    if title:
        parts.append(f"<h3>{html.escape(title)}</h3>")
    parts.append(f'<div class="ng-reward">reward: {_escape(reward)}</div>')
    parts.append(render_verdict(verdict))
    parts.append("<h4>Prompt</h4>")
    parts += _prompt(row.get("responses_create_params"))
    parts.append(f"<h4>Trajectory ({len(output)} items; model {html.escape(str(response.get('model', '?')))})</h4>")
    parts += [render_item(item) for item in output] or ["<p>(empty output)</p>"]
    parts.append(_token_note(output))
    parts.append(f'<h4>Reward</h4><div class="ng-reward ng-final-reward">{_escape(reward)}</div>')
    fields = {k: v for k, v in row.items() if k not in VERIFIER_EXCLUDED_KEYS}
    parts.append("<h4>Task and verifier fields</h4>" + _fields_table(fields))
    if response.get("usage"):
        parts.append("<details><summary>usage</summary>" + _pre(pretty_json(response["usage"])) + "</details>")
    parts.append(render_capture(row))
    parts.append("</div>")
    return "\n".join(parts)
