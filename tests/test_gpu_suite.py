"""The GPU suite's plumbing on a CPU (benchmarks/gpu/): the stage runner's statuses and time limits, the budget, the
summary, `run.sh` on a machine without CUDA (setup and bench skip themselves, the gpu tests skip), and the benchmark's
`--smoke` run (training and the stand-in broadcast on a tiny model) feeding the summary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ng_process import clean_env

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", REPO / "benchmarks/gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


suite = load("suite")


def stage(name: str, script: str, limit_s: float = 30) -> "suite.Stage":
    return suite.Stage(name, ["bash", "-c", script], limit_s)


def test_stage_statuses_limits_and_budget(tmp_path):
    stages = [
        stage("ok", "echo working; echo 'NOTE: all good'"),
        stage("bad", "echo 'something broke' >&2; exit 3"),
        stage("slow", "sleep 60", limit_s=2),
        stage("skipper", "echo 'SKIP: no GPU here'; exit 77"),
        stage("after", "echo still runs"),
    ]
    started = time.monotonic()
    results = suite.run_stages(stages, tmp_path, budget_s=120)
    assert time.monotonic() - started < 30  # the 60 s sleep was stopped at its 2 s limit
    got = {r.name: (r.status, r.returncode, r.note) for r in results}
    assert got == {
        "ok": ("passed", 0, "all good"),
        "bad": ("failed", 3, "exit 3: something broke"),
        "slow": ("timed_out", 124, "stopped at its limit of 2 s"),
        "skipper": ("skipped", 77, "no GPU here"),
        "after": ("passed", 0, ""),
    }
    assert (tmp_path / "bad.log").read_text().startswith("$ bash -c echo 'something broke'")
    assert [row["status"] for row in json.loads((tmp_path / "suite.json").read_text())] == ["passed", "failed", "timed_out", "skipped", "passed"]


@pytest.mark.long
def test_budget_cuts_the_last_stages(tmp_path):
    results = suite.run_stages([stage("first", "sleep 3", limit_s=60), stage("second", "sleep 60", limit_s=60), stage("third", "true")], tmp_path, budget_s=10)
    assert [(r.name, r.status) for r in results] == [("first", "passed"), ("second", "timed_out"), ("third", "skipped")]
    assert results[1].seconds < 12 and "budget of 10 s is spent" in results[2].note


def test_summary_reads_the_tests_and_the_benchmark(tmp_path):
    (tmp_path / "tests.xml").write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/></testsuites>')
    (tmp_path / "bench.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "rows": [{"model": "smollm2", "what": "training tokens/s (all)", "value": 12345.6, "unit": "tokens/s"}], "notes": ["smollm2 sync: skipped"]}))
    results = [suite.StageResult("tests", "failed", 12.0, 1, "exit 1: 1 failed", "")]
    text = suite.summary(results, tmp_path)
    assert "tests    failed           12  exit 1: 1 failed" in text
    assert "tests: 2 passed, 1 failed, 0 errors, 2 skipped" in text
    assert "benchmark on NVIDIA H100 80GB HBM3:" in text and "12345.60 tokens/s" in text and "note: smollm2 sync: skipped" in text
    assert (tmp_path / "summary.txt").read_text() == text + "\n"


@pytest.mark.long
@pytest.mark.integration
def test_run_sh_on_a_machine_without_cuda(tmp_path):
    """setup and bench skip themselves; the gpu tests all skip (skip-without-CUDA), so the suite passes."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {**clean_env(), "NG_GPU_PYTHON": sys.executable, "NG_GPU_STAGES": "env,setup,tests,bench", "NG_GPU_BUDGET_S": "300", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(["bash", "benchmarks/gpu/run.sh", f"--out={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    stages = {row["name"]: row for row in json.loads((tmp_path / "suite.json").read_text())}
    if not _has_nvidia_smi():
        assert stages["setup"]["status"] == "skipped" and stages["setup"]["note"] == "no nvidia-smi: not a CUDA machine"
    assert stages["tests"]["status"] == "passed"
    assert stages["bench"]["status"] == "skipped" and "no CUDA GPU" in stages["bench"]["note"]
    counts = suite.test_counts(tmp_path / "tests.xml")
    assert counts["skipped"] >= 10 and counts["passed"] == counts["failed"] == counts["errors"] == 0
    assert "GPU suite" in done.stdout and f"tests: 0 passed, 0 failed, 0 errors, {counts['skipped']} skipped" in done.stdout


@pytest.mark.long
@pytest.mark.integration
def test_bench_smoke_feeds_the_summary(tmp_path):
    pytest.importorskip("deepspeed")
    done = subprocess.run([sys.executable, "benchmarks/gpu/bench.py", "--smoke", f"--out={tmp_path}"], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    whats = [row["what"] for row in data["rows"]]
    assert whats == [
        "training step (s)", "training tokens/s (all)", "training tokens/s (generated)",
        "weight sync gloo broadcast → stand-in receiver (s)", "weight sync filesystem (write only) (s)",
    ]  # fmt: skip
    assert all(row["value"] > 0 for row in data["rows"]) and data["notes"] == []
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "weight sync gloo broadcast" in suite.summary([], tmp_path)
    # the models it wrote (on a GPU: GBs) stay out of the results folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.png", "summary.txt"]


def _has_nvidia_smi() -> bool:
    import shutil

    return shutil.which("nvidia-smi") is not None
