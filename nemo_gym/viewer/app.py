"""`ng_viewer`: a Gradio app to browse a rollouts JSONL file.

The file is indexed once (`RolloutIndex`, one streaming pass; only offsets and table fields stay in memory) and a
rollout is read from disk when it is opened. The page has a filtered table of rollouts, the selected rollout's
rendering, and reward statistics (a histogram and per-task statistics) of the filtered rows. With a baseline file
(`+baseline_jsonl_fpath=`), a Compare tab shows both files per task side by side (`nemo_gym.viewer.compare_page`).

Privacy: Gradio's analytics and version check are off (`GRADIO_ANALYTICS_ENABLED=False`, set before Gradio is
imported), no share link is made, the theme uses local fonts only, and the server binds 127.0.0.1 by default.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before `import gradio`: no analytics, no version check
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from nemo_gym.collect.health import VERDICTS  # noqa: E402
from nemo_gym.common.errors import ConfigError  # noqa: E402
from nemo_gym.viewer.capture_view import HealthVerdicts  # noqa: E402
from nemo_gym.viewer.compare import ComparedFiles  # noqa: E402
from nemo_gym.viewer.compare_page import add_compare_tab  # noqa: E402
from nemo_gym.viewer.index import RolloutIndex, RowFilter  # noqa: E402
from nemo_gym.viewer.options import ViewerOptions  # noqa: E402
from nemo_gym.viewer.render import render_rollout  # noqa: E402
from nemo_gym.viewer.stats import reward_histogram, task_reward_stats  # noqa: E402

__all__ = ["build_app", "free_port", "viewer_launch_kwargs", "viewer_main"]

MAX_TABLE_ROWS = 1000  # rows sent to the browser; the filter narrows the rest
PORT_TRIES = 100
_LOCAL_FONTS = ["ui-sans-serif", "system-ui", "sans-serif"]
_LOCAL_MONO_FONTS = ["ui-monospace", "SFMono-Regular", "monospace"]


def free_port(host: str, port: int, tries: int = PORT_TRIES) -> int:
    """The first port from `port` on that can be bound on `host`.

    Raises:
        ConfigError: none of `port` .. `port + tries - 1` is free.
    """
    for candidate in range(port, port + tries):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, candidate))
            except OSError:
                continue
            return candidate
    raise ConfigError(f"no free port on {host} in {port}..{port + tries - 1}; pass +server_port=<port>")


def _bound(text: str | None, name: str) -> float | None:
    """A reward bound typed in a text box: blank means open.

    Raises:
        gr.Error: not a number (shown in the page).
    """
    text = (text or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise gr.Error(f"{name} must be a number or blank, got {text!r}") from None


class _Views:
    """What the page shows for a filter: the callbacks Gradio calls, over one index."""

    def __init__(self, index: RolloutIndex):
        self.index = index
        self.verdicts = HealthVerdicts.beside(index.path)  # ng_health_check's, when it ran on this folder

    def apply(
        self,
        reward_min: str | None,
        reward_max: str | None,
        environments: list[str] | None,
        text: str | None,
        health: list[str] | None = None,
    ) -> tuple[pd.DataFrame, str, pd.DataFrame, pd.DataFrame]:
        """Table, summary, histogram and per-task statistics of the rows passing the filter; `health` (verdict names,
        `nemo_gym.collect.health.VERDICTS`; empty: all) keeps the rows whose ng_health_check verdict is one of them."""
        row_filter = RowFilter(
            _bound(reward_min, "reward ≥"),
            _bound(reward_max, "reward ≤"),
            tuple(environments or ()),
            (text or "").strip(),
        )
        row_ids = self.index.filter(row_filter)
        table = self.index.table(row_ids)
        if self.verdicts.verdicts:  # a column to sort by: which rollouts ng_health_check found unhealthy
            pairs = list(zip(table["task_index"].tolist(), table["repeat"].tolist(), strict=True))
            table.insert(table.columns.get_loc("reward") + 1, "health", [self.verdicts.label(t, r) for t, r in pairs])
            if health:
                table = table[[(self.verdicts.verdicts.get(pair) or {}).get("verdict") in health for pair in pairs]]
        rewards = table["reward"].to_numpy(dtype=float)
        rated = rewards[np.isfinite(rewards)]
        mean = f"{rated.mean():.4f}" if rated.size else "n/a"
        shown = min(len(table), MAX_TABLE_ROWS)
        summary = f"**{len(table)}** of {len(self.index)} rollouts match (mean reward {mean}); showing {shown}."
        if len(table) > MAX_TABLE_ROWS:
            summary += " Narrow the filter to see the others."
        return (
            table.head(MAX_TABLE_ROWS),
            summary,
            reward_histogram(rewards),
            task_reward_stats(table).head(MAX_TABLE_ROWS),
        )

    def open_row(self, row_id: Any) -> str:
        """The rendering of row `row_id` (an error message for a bad id)."""
        if row_id is None:
            return "<p>Select a rollout in the table, or type its row number.</p>"
        try:
            row = self.index.read(int(row_id))
        except (IndexError, ValueError) as exc:
            return f"<p><b>Cannot open row {row_id}:</b> {exc}</p>"
        title = (
            f"Row {int(row_id)} (line {self.index.line_number(int(row_id))}): task"
            f" {row.get('_ng_task_index', int(row_id))}, repeat {row.get('_ng_rollout_index', 0)}"
        )
        return render_rollout(row, title, self.verdicts.of(row))

    def select(self, event: gr.SelectData) -> tuple[int, str]:
        """A table click: the clicked row's id and rendering."""
        row_id = int(event.row_value[0])
        return row_id, self.open_row(row_id)


def _header(index: RolloutIndex, index_s: float, label: str = "Rollouts") -> str:
    text = f"### {label}: `{index.path}`\n{len(index)} rollouts, indexed in {index_s:.1f} s."
    if index.skipped_lines:
        shown = ", ".join(map(str, index.skipped_lines[:10]))
        text += (
            f" Skipped {len(index.skipped_lines)} line(s) that are not JSON objects (line"
            f" {shown}{', ...' if len(index.skipped_lines) > 10 else ''})."
        )
    return text


def build_app(index: RolloutIndex, index_s: float = 0.0, compared: ComparedFiles | None = None) -> gr.Blocks:
    """The viewer page over `index` (launch it with `viewer_launch_kwargs`); with `compared` (whose candidate is
    `index`), also the Compare tab."""
    views = _Views(index)
    with gr.Blocks(title="nemo_gym rollouts", analytics_enabled=False) as app:
        gr.Markdown(_header(index, index_s))
        if views.verdicts.path is not None:
            note = f" ({views.verdicts.note})" if views.verdicts.note else ""
            gr.Markdown(f"Health verdicts (shown with each rollout): `{views.verdicts.path}`{note}")
        elif views.verdicts.note:
            gr.Markdown(f"Health verdicts: {views.verdicts.note}")
        if compared is not None and compared.baseline.skipped_lines:
            gr.Markdown(_header(compared.baseline, index_s, "Baseline"))
        with gr.Row():
            # Text boxes, not gr.Number: an empty gr.Number sends 0, and blank must mean "no bound".
            reward_min = gr.Textbox(label="reward ≥", placeholder="any", elem_id="reward-min")
            reward_max = gr.Textbox(label="reward ≤", placeholder="any", elem_id="reward-max")
            environments = gr.Dropdown(index.environments, multiselect=True, label="environment", elem_id="environment")
            text = gr.Textbox(label="text search (case-insensitive, in the row's JSON)", elem_id="text-search")
            health = gr.Dropdown(
                list(VERDICTS),
                multiselect=True,
                label="health (ng_health_check's verdict)",
                elem_id="health",
                visible=bool(views.verdicts.verdicts),
            )
            apply = gr.Button("Apply filters", variant="primary", elem_id="apply")
        summary = gr.Markdown(elem_id="summary")
        with gr.Tab("Rollouts"):
            table = gr.Dataframe(
                interactive=False, elem_id="rollouts-table", max_height=360, label="rollouts (click a row to open it)"
            )
            with gr.Row():
                row_number = gr.Number(label="row", precision=0, elem_id="row-number", scale=1)
                open_button = gr.Button("Open row", elem_id="open-row", scale=0)
            trajectory = gr.HTML(views.open_row(None), elem_id="trajectory")
        with gr.Tab("Reward statistics"):
            histogram = gr.BarPlot(
                x="reward",
                y="count",
                title="reward histogram (filtered rollouts)",
                elem_id="histogram",
                sort=None,
                y_lim=[0, None],
            )
            per_task = gr.Dataframe(
                interactive=False, elem_id="task-stats", label="per-task reward statistics (sample std, as ng_profile)"
            )
        if compared is not None:
            add_compare_tab(compared, app)
        filter_inputs = [reward_min, reward_max, environments, text, health]
        filter_outputs = [table, summary, histogram, per_task]
        app.load(views.apply, filter_inputs, filter_outputs)
        apply.click(views.apply, filter_inputs, filter_outputs)
        text.submit(views.apply, filter_inputs, filter_outputs)
        table.select(views.select, None, [row_number, trajectory])
        open_button.click(views.open_row, row_number, trajectory)
        row_number.submit(views.open_row, row_number, trajectory)
    return app


def viewer_launch_kwargs(host: str, port: int) -> dict[str, Any]:
    """`Blocks.launch` arguments: no share link, no browser, no server-side rendering, local fonts only, and quiet:
    Gradio's own lines would tell the user to "set `share=True` in `launch()`", which ng_viewer's user cannot do
    (ng_viewer prints the URL itself)."""
    theme = gr.themes.Default(font=_LOCAL_FONTS, font_mono=_LOCAL_MONO_FONTS)
    return dict(
        server_name=host,
        server_port=port,
        share=False,
        inbrowser=False,
        ssr_mode=False,
        mcp_server=False,
        theme=theme,
        quiet=True,
    )


def viewer_main(options: ViewerOptions) -> int:
    """`ng_viewer`: index the file, print the URL and serve until Ctrl-C. Returns 0.

    Raises:
        DataError: a file (jsonl_fpath or baseline_jsonl_fpath) does not exist.
        ConfigError: no free port.
    """
    start = time.perf_counter()
    index = RolloutIndex.build(options.jsonl_fpath)
    baseline = RolloutIndex.build(options.baseline_jsonl_fpath) if options.baseline_jsonl_fpath else None
    index_s = time.perf_counter() - start
    compared = None if baseline is None else ComparedFiles.build(baseline, index, options.pass_threshold)
    port = free_port(options.server_host, options.server_port)
    if port != options.server_port:
        print(f"ng_viewer: port {options.server_port} is in use; using {port}", flush=True)
    print(f"ng_viewer: {len(index)} rollouts from {options.jsonl_fpath} (indexed in {index_s:.1f} s)", flush=True)
    if compared is not None:
        compare_s = time.perf_counter() - start - index_s
        print(
            f"ng_viewer: compared with {len(compared.baseline)} baseline rollouts from {options.baseline_jsonl_fpath}"
            f" in {compare_s:.1f} s (tab Compare)",
            flush=True,
        )
    app = build_app(index, index_s, compared)
    app.launch(**viewer_launch_kwargs(options.server_host, port), prevent_thread_lock=True)
    print(
        f"ng_viewer: Running on local URL: {app.local_url} (Ctrl-C stops it; +server_host=0.0.0.0 serves other"
        " machines)",
        flush=True,
    )
    app.block_thread()  # until Ctrl-C
    return 0
