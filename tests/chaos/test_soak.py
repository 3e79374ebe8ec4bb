"""Soak: continuous collection at concurrency 256 against the scripted model, through a real
`ng_run` (simple_agent + the weather resources server + scripted_model, `tests/configs/weather_scripted.yaml`),
for `NG_SOAK_SECONDS` seconds (default 1800). Memory (RSS) and open file descriptors of every process of the run
(ng_run itself and each server, by the PIDs the head server reports) are sampled every `NG_SOAK_SAMPLE_S` seconds
(default 5) with psutil; no rollout may fail, and neither may grow by 10 % or more.

Marked `soak`: skipped unless `NG_SOAK_SECONDS` is set or `-m soak` is given (tests/chaos/conftest.py), so the
default run leaves it out. Run it as

    NG_SOAK_SECONDS=1800 .venv/bin/python -m pytest -m soak tests/chaos/test_soak.py -s

One pass of 2,000 rollouts measures the rate; then one `ng_collect_rollouts` runs with twice the rollouts the rest
of the duration needs and is stopped by SIGINT at the end (exit 130, every written row whole, no failure record).
Growth is measured from the first samples after the warm-up (a fifth of the duration, at least 30 s: pools,
caches and the allocator's arenas fill up) to the last ones before the stop, each end the mean of 3 samples.

One collection rather than passes of many: a collection ends with `/aggregate_metrics` over all its rows (tens of
thousands of verify answers in one body, through the agent to the resources server), and each such burst of
~100k short-lived Python objects leaves pymalloc arenas pinned: RSS steps up at every collection end and levels off
only after several (measured: 40 calls of 20,000 rows, weather 74 -> 87 MiB and levelling; flat under
PYTHONMALLOC=malloc). That is the end of a collection, not continuous collection, so it is kept out of the window.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from chaos.chaos_helpers import collect_command, read_rows, side_file
from ng_process import NgRun

DURATION_S = float(os.environ.get("NG_SOAK_SECONDS", "1800"))
pytestmark = [pytest.mark.soak, pytest.mark.chaos, pytest.mark.timeout(DURATION_S + 900)]  # start-up, rate pass, stop

ROWS = Path(__file__).resolve().parents[2] / "resources_servers/example_single_tool_call/data/example.jsonl"
CONCURRENCY = 256
NUM_TASKS = 5  # rows of ROWS
RATE_REPEATS = 400  # 5 tasks x 400 = 2,000 rollouts in the pass that measures the rate
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


def sample_until(
    processes: dict[str, psutil.Process], samples: Samples, stop: threading.Event, every_s: float, started: float
) -> None:
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


def collect(head: str, out: Path, repeats: int, log: Path) -> subprocess.Popen:
    """`ng_collect_rollouts` of `repeats` x the NUM_TASKS rows of ROWS into `out` at CONCURRENCY."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            collect_command(out, head, rows=ROWS, repeats=repeats, concurrency=CONCURRENCY),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def test_soak_memory_and_fds_stay_flat(tmp_path):
    duration_s = DURATION_S
    every_s = float(os.environ.get("NG_SOAK_SAMPLE_S", "5"))
    warm_up_s = max(30.0, duration_s / 5)
    log = tmp_path / "collector.log"
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true", timeout_s=240) as run:
        head = run.wait_ready()
        servers = httpx.get(f"{head}/servers", headers=run.headers, timeout=10).json()
        processes = {"ng_run": psutil.Process(run.process.pid)} | {
            server["name"]: psutil.Process(server["pid"]) for server in servers
        }
        assert {"weather", "weather_agent", "policy_model"} <= processes.keys(), servers
        samples, stop, collector = Samples(), threading.Event(), None
        started = time.monotonic()
        sampler = threading.Thread(target=sample_until, args=(processes, samples, stop, every_s, started), daemon=True)
        sampler.start()
        try:
            rate_out = tmp_path / "rate.jsonl"
            assert collect(head, rate_out, RATE_REPEATS, log).wait(600) == 0, log.read_text(errors="replace")[-3000:]
            assert count_lines(rate_out) == NUM_TASKS * RATE_REPEATS and not read_rows(
                side_file(rate_out, "failures.jsonl")
            )
            rate_s = time.monotonic() - started
            rate = NUM_TASKS * RATE_REPEATS / rate_s
            out = tmp_path / "soak.jsonl"
            repeats = int(2 * rate * duration_s / NUM_TASKS) + 1  # more than the duration needs: stopped by SIGINT
            collector = collect(head, out, repeats, log)
            while time.monotonic() - started < duration_s:
                assert collector.poll() is None, (
                    f"the collection ended before the soak did:\n{log.read_text(errors='replace')[-3000:]}"
                )
                if time.monotonic() - started >= warm_up_s:
                    samples.steady.set()
                for name, process in processes.items():
                    assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE, (
                        f"{name} died during the soak"
                    )
                time.sleep(1.0)
            samples.steady.clear()
            collector.send_signal(signal.SIGINT)
            assert collector.wait(120) == 130, log.read_text(errors="replace")[-3000:]
        finally:
            stop.set()
            sampler.join(30)
            if collector is not None and collector.poll() is None:
                collector.kill()
        elapsed_s = time.monotonic() - started
        assert run.stop() == 0
        rollouts = count_lines(out)
        failures = read_rows(side_file(out, "failures.jsonl"))
        assert not failures, f"{len(failures)} failed rollouts, e.g. {failures[0]}"
        with out.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            assert handle.read() == b"\n", "the last row is torn"

    report = [
        f"{rollouts} rollouts in one collection of {elapsed_s - rate_s:.0f} s ({rollouts / (elapsed_s - rate_s):.0f}/s)"
        f" after {NUM_TASKS * RATE_REPEATS} in {rate_s:.0f} s, warm-up {warm_up_s:.0f} s, samples every {every_s:g} s"
    ]
    problems = []
    for name, rows in samples.rows.items():
        assert len(rows) >= 2 * ENDS, f"{name}: only {len(rows)} samples after the warm-up; raise NG_SOAK_SECONDS"
        rss_growth, fd_growth = growth([row[1] for row in rows]), growth([row[2] for row in rows])
        report.append(
            f"{name}: RSS {rows[0][1] / 2**20:.1f} -> {rows[-1][1] / 2**20:.1f} MiB ({rss_growth:+.1%}), "
            f"fds {rows[0][2]} -> {rows[-1][2]} ({fd_growth:+.1%}) over {len(rows)} samples"
        )
        if rss_growth >= 0.10 or fd_growth >= 0.10:
            problems.append(name)
    print("\n".join(report))
    assert not problems, "grew by 10 % or more: " + ", ".join(problems) + "\n" + "\n".join(report)
