"""`ng_viewer` as a real process in a real browser (Debian's Chromium driven by Playwright), and its memory use
on a ~200 MB rollouts file.

The browser test saves a screenshot to results/viewer_test/viewer.png (git-ignored). It needs `/usr/bin/chromium`
(`apt-get install -y chromium`); Playwright's own browser download (`playwright install`) is never used.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
PEER_SERVERS = REPO.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = REPO / "results" / "viewer_test" / "viewer.png"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.integration


class Viewer:
    """`ng_viewer` in its own session, stopped by PID; `url` once it prints its address."""

    def __init__(self, jsonl_fpath: Path, port: int, log_path: Path, *overrides: str):
        self.command = [str(BIN / "ng_viewer"), f"+jsonl_fpath={jsonl_fpath}", f"+server_port={port}", *overrides]
        self.log_path = log_path
        self.url = ""

    def __enter__(self) -> Viewer:
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            self.command, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = re.search(r"Running on local URL:\s+(\S+)", self.output())
            if match:
                self.url = match.group(1)
                return self.url
            if self.process.poll() is not None:
                raise RuntimeError(f"ng_viewer exited with {self.process.returncode}:\n{self.output()}")
            time.sleep(0.2)
        raise TimeoutError(f"ng_viewer not ready after {timeout_s} s:\n{self.output()}")

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port held by this test, so that ng_viewer must take the next one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.long
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (/usr/bin/chromium); run `apt-get install -y chromium`",
)
@pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found (../shared/peer_data)")
def test_viewer_in_chromium(tmp_path: Path, taken_port: int) -> None:
    from playwright.sync_api import expect, sync_playwright

    rollouts = tmp_path / "rollouts.jsonl"  # the 5 peer rollout files: 25 rollouts, 5 of them with reward 2.0
    rollouts.write_bytes(b"".join(f.read_bytes() for f in sorted(PEER_SERVERS.glob("*/data/example_rollouts.jsonl"))))
    with Viewer(rollouts, taken_port, tmp_path / "viewer.log") as viewer, sync_playwright() as playwright:
        url = viewer.wait_ready()
        assert f"port {taken_port} is in use; using" in viewer.output() and urlparse(url).hostname == "127.0.0.1"
        for probe in (
            "/etc/passwd",
            str(rollouts),
            "../../../../../../etc/passwd",
            "..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
            "pyproject.toml",
        ):
            answer = httpx.get(
                f"{url.rstrip('/')}/gradio_api/file={probe}", timeout=10
            )  # path containment: no file is served
            assert answer.status_code in (403, 404) and "root:" not in answer.text, (
                probe,
                answer.status_code,
                answer.text[:200],
            )
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            outside = []
            page.on(
                "request",
                lambda request: (
                    outside.append(request.url) if urlparse(request.url).hostname not in ("127.0.0.1", None) else None
                ),
            )
            page.goto(url)
            expect(page.locator("#summary")).to_contain_text("25 of 25 rollouts match", timeout=60_000)

            page.locator("#reward-min textarea").fill("1.5")
            page.locator("#apply").click()
            expect(page.locator("#summary")).to_contain_text(
                "5 of 25 rollouts match (mean reward 2.0000)", timeout=30_000
            )
            expect(page.locator("#rollouts-table")).to_contain_text("example_tool_call_multireward_simple_agent")

            page.locator('#rollouts-table [data-testid="cell-0-1"]').click()  # first row, task_index column
            trajectory = page.locator("#trajectory")
            expect(trajectory).to_contain_text("function call", timeout=30_000)
            expect(trajectory.locator(".ng-tool-name").first).to_have_text("get_weather")
            expect(trajectory).to_contain_text('"city": "New York"')
            expect(trajectory.locator(".ng-final-reward")).to_have_text("2.0")
            expect(trajectory).to_contain_text("reward_components")
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)

            page.get_by_role("tab", name="Reward statistics").click()
            expect(page.locator("#task-stats")).to_contain_text("avg_reward", timeout=30_000)
            expect(page.locator("#histogram")).to_be_visible()
            page.locator("#reward-min textarea").fill("")
            page.locator("#apply").click()  # all rewards: bars at 0, 1 and 2
            expect(page.locator("#summary")).to_contain_text("25 of 25 rollouts match", timeout=30_000)
            page.wait_for_timeout(1000)  # let the plot redraw
            page.screenshot(path=str(SCREENSHOT.with_name("viewer_stats.png")), full_page=True)
            assert outside == [], f"the page fetched from outside loopback: {outside}"
        finally:
            browser.close()


MEMORY_PROBE = textwrap.dedent("""
    import json, sys
    import psutil
    from nemo_gym.viewer import RolloutIndex, RowFilter
    base_kb = psutil.Process().memory_info().rss / 1024  # current RSS after the imports (not their peak)
    index = RolloutIndex.build(sys.argv[1])
    found = index.filter(RowFilter(reward_min=0.5, text="needle-7f3a"))
    row = index.read(len(index) - 1)
    # VmHWM is this process's own peak RSS; ru_maxrss would include the parent's RSS at fork (Linux keeps it
    # across exec), which is gigabytes when pytest has run the vLLM and DeepSpeed tests before this one
    peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    growth_mb = (peak_kb - base_kb) / 1024
    last_task = row["_ng_task_index"]
    print(json.dumps({"rows": len(index), "found": found.tolist(), "last_task": last_task, "growth_mb": growth_mb}))
    """)


def _write_large_rollouts(path: Path, rows: int, text_chars: int) -> None:
    """`rows` rollouts of ~`text_chars` characters each; row 123 (reward 1.0) holds the text "needle-7f3a"."""
    import orjson

    filler = ("lorem ipsum dolor sit amet " * (text_chars // 27 + 1))[:text_chars]
    with path.open("wb") as f:
        for i in range(rows):
            text = filler + (" needle-7f3a" if i == 123 else "")
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": f"task {i // 4}"}]},
                "response": {
                    "output": [
                        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
                    ],
                    "usage": {"output_tokens": 900},
                },
                "reward": float(i % 2),
                "_ng_task_index": i // 4,
                "_ng_rollout_index": i % 4,
                "agent_ref": {"name": "big_agent"},
            }
            f.write(orjson.dumps(row) + b"\n")


def test_a_200_mb_file_is_indexed_without_loading_it(tmp_path: Path) -> None:
    path = tmp_path / "large_rollouts.jsonl"
    _write_large_rollouts(path, rows=10_000, text_chars=20_000)  # ~200 MB
    try:
        size_mb = path.stat().st_size / 2**20
        assert size_mb > 190
        probe = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, str(path)], capture_output=True, text=True, timeout=600, cwd=REPO
        )
        assert probe.returncode == 0, probe.stderr
        result = json.loads(probe.stdout)
        print(f"indexed {size_mb:.0f} MB; peak RSS growth {result['growth_mb']:.1f} MB")
        assert result["rows"] == 10_000 and result["found"] == [123] and result["last_task"] == 2499
        assert result["growth_mb"] < 100, (
            f"peak RSS grew by {result['growth_mb']:.0f} MB while indexing a {size_mb:.0f} MB file"
        )
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.long
def test_ng_viewer_prints_its_url_and_no_gradio_share_hint(tmp_path: Path) -> None:
    """Gradio's own start lines tell the user to "set `share=True` in `launch()`", which an ng_viewer user cannot
    do: ng_viewer starts Gradio quietly and prints its URL itself."""
    rollouts = tmp_path / "rollouts.jsonl"
    row = {
        "responses_create_params": {"input": "What is 2 + 2?"},
        "response": {
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}]
        },
        "reward": 1.0,
    }
    rollouts.write_text(json.dumps(row) + "\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Viewer(rollouts, port, tmp_path / "viewer.log") as viewer:
        url = viewer.wait_ready()
        assert httpx.get(url, timeout=30).status_code == 200
    output = viewer.output()
    assert f"ng_viewer: Running on local URL: http://127.0.0.1:{port}/ (Ctrl-C stops it" in output
    assert "share=True" not in output and "public link" not in output


@pytest.mark.long
@pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found (../shared/peer_data)")
def test_ng_viewer_compares_two_files_over_http(tmp_path: Path) -> None:
    """`ng_viewer +baseline_jsonl_fpath=`: the Compare tab's callbacks through Gradio's HTTP API (gradio_client), on
    NeMo Gym's example_single_tool_call rollouts before/after (tests/test_viewer.py::before_after)."""
    from gradio_client import Client
    from test_viewer import before_after

    before, after = before_after(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Viewer(after, port, tmp_path / "viewer.log", f"+baseline_jsonl_fpath={before}") as viewer:
        url = viewer.wait_ready()
        assert f"compared with 5 baseline rollouts from {before} in " in viewer.output()
        client = Client(url, verbose=False, download_files=False, analytics_enabled=False)
        headline, summary = client.predict(api_name="/compare_overview")
        assert (
            "paired by task over **4** tasks" in headline
            and "**+0.3750**" in headline
            and "Tasks only in baseline: 1;" in headline
        )
        assert summary["headers"] == ["metric", "baseline", "candidate", "difference"] and summary["data"][0] == [
            "tasks",
            5,
            4,
            -1,
        ]
        tasks, note = client.predict("improved", api_name="/compare_tasks")
        assert note.startswith("**2** of 5 tasks") and [row[2] for row in tasks["data"]] == ["both", "both"]
        task = next(row[0] for row in tasks["data"] if row[tasks["headers"].index("candidate_n")] == 2)
        left, right = client.predict(task, 1, api_name="/compare_task")  # task 0's second rollout after; before has one
        assert "This file has 1 rollout(s)" in left and "rollout 2 of 2" in right and "reward <b>0.0</b>" in right
        left, right = client.predict(task, 0, api_name="/compare_task")
        assert "tool calls 0 · turns 1" in left and "tool calls 1 · turns 2" in right and "get_weather" in right


@pytest.mark.long
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (/usr/bin/chromium); run `apt-get install -y chromium`",
)
@pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found (../shared/peer_data)")
def test_compare_tab_in_chromium_shows_two_columns(tmp_path: Path) -> None:
    """The Compare tab in a real browser: a click on a task renders its baseline and candidate rollouts side by side
    (two columns at the same height, the baseline left); screenshot results/viewer_test/compare.png."""
    from playwright.sync_api import expect, sync_playwright
    from test_viewer import before_after

    before, after = before_after(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        Viewer(after, port, tmp_path / "viewer.log", f"+baseline_jsonl_fpath={before}") as viewer,
        sync_playwright() as playwright,
    ):
        url = viewer.wait_ready()
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            outside = []
            page.on(
                "request",
                lambda request: (
                    outside.append(request.url) if urlparse(request.url).hostname not in ("127.0.0.1", None) else None
                ),
            )
            page.goto(url)
            page.get_by_role("tab", name="Compare").click()
            expect(page.locator("#compare-headline")).to_contain_text("paired by task over 4 tasks", timeout=60_000)
            expect(page.locator("#compare-summary")).to_contain_text("turns per rollout")
            expect(page.locator("#compare-tasks")).to_contain_text("baseline only", timeout=30_000)
            page.locator("#compare-status input").fill("improved")
            page.keyboard.press("Enter")
            page.locator("#compare-show").click()
            expect(page.locator("#compare-note")).to_contain_text("2 of 5 tasks (improved)", timeout=30_000)
            page.locator('#compare-tasks [data-testid="cell-0-0"]').click()  # first improved task
            left, right = page.locator("#compare-baseline"), page.locator("#compare-candidate")
            expect(right).to_contain_text("tool calls 1 · turns 2", timeout=30_000)
            expect(left).to_contain_text("tool calls 0 · turns 1")
            expect(right.locator(".ng-tool-name").first).to_have_text("get_weather")
            left_box, right_box = left.bounding_box(), right.bounding_box()
            assert left_box["x"] + left_box["width"] <= right_box["x"] and abs(left_box["y"] - right_box["y"]) < 5, (
                left_box,
                right_box,
            )
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT.with_name("compare.png")), full_page=True)
            assert outside == [], f"the page fetched from outside loopback: {outside}"
        finally:
            browser.close()
