"""The viewer's "Compare" tab (`ng_viewer +baseline_jsonl_fpath=`): both files' summary and the paired difference,
the per-task deltas (filtered, at most `MAX_TASK_ROWS` sent to the browser), and one task's rollouts of both files
side by side, each with its reward, tool calls and turns. Imported by `nemo_gym.viewer.app` only (needs Gradio).
"""

from __future__ import annotations

import html
import re

import gradio as gr
import pandas as pd

from nemo_gym.eval.comparison import TaskKey
from nemo_gym.viewer.compare import STATUS_CHOICES, ComparedFiles
from nemo_gym.viewer.render import render_rollout

__all__ = ["CompareViews", "add_compare_tab", "parse_task_key"]

MAX_TASK_ROWS = 1000


def parse_task_key(text: str | None) -> TaskKey | None:
    """A task key typed or clicked: an integer (`_ng_task_index`), else the text (a `sha256:` digest); None if blank."""
    text = (text or "").strip()
    if not text:
        return None
    return int(text) if re.fullmatch(r"-?\d+", text) else text


class CompareViews:
    """The callbacks of the Compare tab, over one `ComparedFiles`."""

    def __init__(self, compared: ComparedFiles):
        self.compared = compared

    def overview(self) -> tuple[str, pd.DataFrame]:
        """The headline (paired difference, tasks in one file only) and the summary table."""
        return self.compared.headline(), self.compared.summary_table()

    def tasks(self, status: str | None) -> tuple[pd.DataFrame, str]:
        """The per-task table for a status filter, and a line saying how many rows match and are shown."""
        rows = self.compared.filter_tasks(status or "all")
        shown = min(len(rows), MAX_TASK_ROWS)
        note = (
            f"**{len(rows)}** of {len(self.compared.tasks)} tasks ({status or 'all'}); showing {shown}, sorted by task."
        )
        return rows.head(MAX_TASK_ROWS).round(4), note

    def side(self, side: str, key: TaskKey, repeat: int) -> str:
        """One file's rollout `repeat` (0-based, in repeat order) of task `key`, with its reward, tool calls and
        turns."""
        index = self.compared.index(side)
        name = f"{side}: {index.path.name}"
        rows = index.rows_of_task(key)
        if len(rows) == 0:
            return (
                f'<h3>{html.escape(name)}</h3><p class="ng-missing">Task {html.escape(str(key))} is not in this'
                " file.</p>"
            )
        if not 0 <= repeat < len(rows):
            return (
                f"<h3>{html.escape(name)}</h3><p>This file has {len(rows)} rollout(s) of task {html.escape(str(key))}:"
                f" repeat 0 to {len(rows) - 1}.</p>"
            )
        row_id = int(rows[repeat])
        row = index.read(row_id)
        calls, turns = int(index.column("tool_calls")[row_id]), int(index.column("turns")[row_id])
        stats = (
            f'<p class="ng-side-stats">reward <b>{html.escape(str(row.get("reward")))}</b> · tool calls {calls} · turns'
            f" {turns}</p>"
        )
        title = f"{name}, line {index.line_number(row_id)}: task {key}, rollout {repeat + 1} of {len(rows)}"
        return stats + render_rollout(row, title)

    def open_task(self, key_text: str | None, repeat: float | None) -> tuple[str, str]:
        """Both sides of a task typed in the task box (a message when blank)."""
        key = parse_task_key(key_text)
        if key is None:
            message = "<p>Select a task in the table, or type its key.</p>"
            return message, message
        repeat_index = int(repeat or 0)
        return self.side("baseline", key, repeat_index), self.side("candidate", key, repeat_index)

    def select(self, event: gr.SelectData) -> tuple[str, int, str, str]:
        """A click in the per-task table: that task's key, repeat 0 and both sides."""
        key_text = str(event.row_value[0])
        return (key_text, 0, *self.open_task(key_text, 0))


def add_compare_tab(compared: ComparedFiles, app: gr.Blocks) -> None:
    """The Compare tab, inside `app`'s `with gr.Blocks()` block; filled when the page loads."""
    views = CompareViews(compared)
    with gr.Tab("Compare", elem_id="compare-tab"):
        gr.Markdown(
            f"Baseline `{compared.baseline.path}` ({len(compared.baseline)} rollouts) vs candidate"
            f" `{compared.candidate.path}` ({len(compared.candidate)} rollouts); a sample passes when reward ≥"
            f" {compared.pass_threshold:g}."
        )
        headline = gr.Markdown(elem_id="compare-headline")
        summary = gr.Dataframe(
            interactive=False, elem_id="compare-summary", label="summary (means over each file's rollouts)"
        )
        with gr.Row():
            status = gr.Dropdown(STATUS_CHOICES, value="all", label="tasks", elem_id="compare-status")
            show = gr.Button("Show tasks", elem_id="compare-show")
        note = gr.Markdown(elem_id="compare-note")
        tasks = gr.Dataframe(
            interactive=False,
            elem_id="compare-tasks",
            max_height=360,
            label="per task (click a row to open both sides)",
        )
        with gr.Row():
            key = gr.Textbox(label="task", elem_id="compare-task", scale=2)
            repeat = gr.Number(0, label="repeat (0-based)", precision=0, elem_id="compare-repeat", scale=1)
            open_button = gr.Button("Open task", elem_id="compare-open", scale=0)
        with gr.Row(equal_height=False):
            with gr.Column():
                baseline = gr.HTML("<p>Select a task in the table, or type its key.</p>", elem_id="compare-baseline")
            with gr.Column():
                candidate = gr.HTML("<p>Select a task in the table, or type its key.</p>", elem_id="compare-candidate")
    app.load(views.overview, None, [headline, summary], api_name="compare_overview")
    app.load(views.tasks, status, [tasks, note], api_name="compare_tasks_on_load")
    show.click(views.tasks, status, [tasks, note], api_name="compare_tasks")
    status.change(views.tasks, status, [tasks, note])
    tasks.select(views.select, None, [key, repeat, baseline, candidate])
    open_button.click(views.open_task, [key, repeat], [baseline, candidate], api_name="compare_task")
    key.submit(views.open_task, [key, repeat], [baseline, candidate])
