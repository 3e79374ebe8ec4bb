"""Soak (issue 8, item 11): continuous collection at concurrency 256 against the scripted model, through a real
`ng_run` (simple_agent + the weather resources server + scripted_model, `tests/configs/weather_scripted.yaml`),
for `NG_SOAK_SECONDS` seconds (default 1800). Memory (RSS) and open file descriptors of every process of the run
(ng_run itself and each server, by the PIDs the head server reports) are sampled every `NG_SOAK_SAMPLE_S` seconds
(default 5) with psutil; no rollout may fail, and neither may grow by 10 % or more.

Marked `soak`: skipped unless `NG_SOAK_SECONDS` is set or `-m soak` is given (tests/chaos/conftest.py), so the
default run leaves it out. Run it as

    NG_SOAK_SECONDS=1800 .venv/bin/python -m pytest -m soak tests/chaos/test_soak.py -s

Passes: one of 2,000 rollouts measures the rate; every later pass has the same size, sized to last
min(120 s, a third of the duration). Growth is measured from the first sample after the warm-up (a fifth of the
duration, at least 30 s, and at least one full-size pass: pools, caches and the allocator's arenas fill up) to the
last one. The warm-up must hold a full-size pass because each pass ends with `/aggregate_metrics` over all its
rollouts (tens of thousands of verify answers in one body, through the agent to the resources server): the largest
body sets the allocator's high-water mark, which glibc keeps, so passes of growing size would read as growth
(seen: +24 % in a 300 s run whose measured passes were 20x the warm-up's). Samples are taken only while a collector
pass runs at full concurrency (256 rollouts in flight, whose sockets and buffers count), not in the seconds between
two passes, and each end is the mean of 3 consecutive samples.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from chaos.chaos_helpers import read_rows, side_file
from ng_process import BIN, NgRun

pytestmark = [pytest.mark.soak, pytest.mark.chaos]

ROWS = Path(__file__).resolve().parents[2] / "resources_servers/example_single_tool_call/data/example.jsonl"
CONCURRENCY = 256
NUM_TASKS = 5  # rows of ROWS
RATE_REPEATS = 400  # 5 tasks x 400 = 2,000 rollouts in the pass that measures the rate
PASS_S = 120.0  # then passes sized to last about this long (seconds, at most a third of the run), files deleted in between
ENDS = 3  # samples averaged at each end


@dataclass
class Samples:
    """(seconds since start, RSS bytes, open fds) per process name, taken only while `steady` is set."""

    rows: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)
    steady: threading.Event = field(default_factory=threading.Event)

    def take(self, processes: dict[str, psutil.Process], at_s: float) -> None:
        for name, process in processes.items():
            with process.oneshot():
                self.rows.setdefault(name, []).append((at_s, process.memory_info().rss, process.num_fds()))


def sample_until(processes: dict[str, psutil.Process], samples: Samples, stop: threading.Event, every_s: float, started: float) -> None:
    while not stop.wait(every_s):
        if samples.steady.is_set():
            samples.take(processes, time.monotonic() - started)


def growth(values: list[float]) -> float:
    """Relative growth from the mean of the first ENDS values to the mean of the last ENDS."""
    first, last = statistics.fmean(values[:ENDS]), statistics.fmean(values[-ENDS:])
    return (last - first) / first


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


class Collector:
    """Passes of `ng_collect_rollouts` (fresh output files, two in turn, so the disk does not fill up); every pass
    must end with all its rollouts and no failure."""

    def __init__(self, head: str, folder: Path):
        self.head, self.folder, self.passes, self.rollouts = head, folder, 0, 0

    def start(self, repeats: int) -> tuple[subprocess.Popen, Path, int]:
        out = self.folder / f"pass_{self.passes % 2}.jsonl"
        for stale in self.folder.glob(f"pass_{self.passes % 2}*"):
            stale.unlink()
        command = [str(BIN / "ng_collect_rollouts"), "+agent_name=weather_agent", f"+input_jsonl_fpath={ROWS}", f"+output_jsonl_fpath={out}",
                   f"+num_repeats={repeats}", f"+num_samples_in_parallel={CONCURRENCY}", "+progress=false", f"+head_server_url={self.head}"]  # fmt: skip
        with (self.folder / "collector.log").open("wb") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), out, NUM_TASKS * repeats

    def finish(self, process: subprocess.Popen, out: Path, expected: int) -> None:
        returncode = process.wait(3600)
        log = (self.folder / "collector.log").read_text(errors="replace")
        assert returncode == 0, log[-3000:]
        failures = read_rows(side_file(out, "failures.jsonl"))
        assert not failures, f"pass {self.passes}: {len(failures)} failed rollouts, e.g. {failures[0]}"
        assert count_lines(out) == expected, f"pass {self.passes}: {count_lines(out)} of {expected} rollouts"
        self.passes, self.rollouts = self.passes + 1, self.rollouts + expected


def test_soak_memory_and_fds_stay_flat(tmp_path):
    duration_s = float(os.environ.get("NG_SOAK_SECONDS", "1800"))
    every_s = float(os.environ.get("NG_SOAK_SAMPLE_S", "5"))
    warm_up_s = max(30.0, duration_s / 5)
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true", timeout_s=240) as run:
        head = run.wait_ready()
        servers = httpx.get(f"{head}/servers", headers=run.headers, timeout=10).json()
        processes = {"ng_run": psutil.Process(run.process.pid)} | {server["name"]: psutil.Process(server["pid"]) for server in servers}
        assert {"weather", "weather_agent", "policy_model"} <= processes.keys(), servers
        samples, stop, collector = Samples(), threading.Event(), Collector(head, tmp_path)
        started = time.monotonic()
        sampler = threading.Thread(target=sample_until, args=(processes, samples, stop, every_s, started), daemon=True)
        sampler.start()
        try:
            collector.finish(*collector.start(RATE_REPEATS))
            rate = collector.rollouts / (time.monotonic() - started)
            repeats = max(RATE_REPEATS, int(rate * min(PASS_S, duration_s / 3) / NUM_TASKS))  # every later pass
            collector.finish(*collector.start(repeats))  # warm-up: at least one full-size pass
            while time.monotonic() - started < warm_up_s:
                collector.finish(*collector.start(repeats))
            while time.monotonic() - started < duration_s:
                process, out, expected = collector.start(repeats)
                while process.poll() is None:  # samples count once the pass runs at full concurrency, until it ends
                    if not samples.steady.is_set() and count_lines(out) >= CONCURRENCY:
                        samples.steady.set()
                    time.sleep(0.5)
                samples.steady.clear()
                collector.finish(process, out, expected)
                for name, process in processes.items():
                    assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE, f"{name} died during the soak"
        finally:
            stop.set()
            sampler.join(30)
        elapsed_s = time.monotonic() - started
        assert run.stop() == 0

    report = [f"{collector.passes} passes, {collector.rollouts} rollouts in {elapsed_s:.0f} s ({collector.rollouts / elapsed_s:.0f}/s), "
              f"warm-up {warm_up_s:.0f} s, samples every {every_s:g} s at full concurrency"]  # fmt: skip
    problems = []
    for name, rows in samples.rows.items():
        assert len(rows) >= 2 * ENDS, f"{name}: only {len(rows)} samples after the warm-up; raise NG_SOAK_SECONDS"
        rss_growth, fd_growth = growth([row[1] for row in rows]), growth([row[2] for row in rows])
        report.append(f"{name}: RSS {rows[0][1] / 2**20:.1f} -> {rows[-1][1] / 2**20:.1f} MiB ({rss_growth:+.1%}), "
                      f"fds {rows[0][2]} -> {rows[-1][2]} ({fd_growth:+.1%}) over {len(rows)} samples")  # fmt: skip
        if rss_growth >= 0.10 or fd_growth >= 0.10:
            problems.append(name)
    print("\n".join(report))
    assert not problems, "grew by 10 % or more: " + ", ".join(problems) + "\n" + "\n".join(report)
