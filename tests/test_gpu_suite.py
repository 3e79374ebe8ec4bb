"""The GPU suite's plumbing on a CPU (benchmarks/gpu/): the stage runner's statuses and time limits, the budget, the
summary (with the main job's and the benchmark's targets), the engine python the stages get, `run.sh` on a machine
without CUDA (setup, main_job and bench skip themselves saying why, the gpu tests skip), the benchmark's `--smoke` run
(training and the syncs by path into a stand-in receiver on a tiny model) feeding the summary; and the lent GPU's
flow: carry.sh refusing a checkout without .venv, the carried parts packed into device calls (device_calls.py),
`device.sh stash`, the venv on top of a python that setup.sh makes there (overlay.py: a stand-in vLLM folder first, a
carried wheel installed only when missing, the ng_* commands)."""

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


def stage(name: str, script: str, limit_s: float = 30) -> suite.Stage:
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
    assert [row["status"] for row in json.loads((tmp_path / "suite.json").read_text())] == [
        "passed",
        "failed",
        "timed_out",
        "skipped",
        "passed",
    ]


@pytest.mark.long
def test_budget_cuts_the_last_stages(tmp_path):
    results = suite.run_stages(
        [stage("first", "sleep 3", limit_s=60), stage("second", "sleep 60", limit_s=60), stage("third", "true")],
        tmp_path,
        budget_s=10,
    )
    assert [(r.name, r.status) for r in results] == [("first", "passed"), ("second", "timed_out"), ("third", "skipped")]
    assert results[1].seconds < 12 and "budget of 10 s is spent" in results[2].note


def test_summary_reads_the_tests_the_main_job_and_the_benchmark(tmp_path):
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/></testsuites>'
    )
    (tmp_path / "main_job").mkdir()
    (tmp_path / "main_job" / "summary.json").write_text(json.dumps({"rollouts": 420, "steps_trained": [True, True]}))
    rows = [
        {"model": "smollm2", "what": "training tokens/s (all)", "value": 12345.6, "unit": "tokens/s"},
        {
            "model": "qwen2-0.5b",
            "what": "weight sync cuda_ipc → vLLM (s)",
            "value": 0.21,
            "unit": "s",
            "target": "≤ 0.5 s",
            "met": True,
        },
        {
            "model": "smollm2",
            "what": "gym's share of collection wall time",
            "value": 7.5,
            "unit": "%",
            "target": "≤ 5 %",
            "met": False,
        },
    ]
    (tmp_path / "bench.json").write_text(
        json.dumps({"device": "NVIDIA H100 80GB HBM3", "rows": rows, "notes": ["grpo_vs_trl: skipped"]})
    )
    results = [suite.StageResult("tests", "failed", 12.0, 1, "exit 1: 1 failed", "")]
    text = suite.summary(results, tmp_path)
    assert "tests    failed           12  exit 1: 1 failed" in text
    assert "tests: 2 passed, 1 failed, 0 errors, 2 skipped" in text
    assert "main job: rollouts 420; steps_trained [True, True]" in text
    assert (
        "benchmark on NVIDIA H100 80GB HBM3:" in text
        and "12345.600 tokens/s" in text
        and "note: grpo_vs_trl: skipped" in text
    )
    assert "0.210 s  target ≤ 0.5 s: met" in text and "7.500 %  target ≤ 5 %: MISSED" in text
    assert (tmp_path / "summary.txt").read_text() == text + "\n"


def test_the_stages_get_the_engine_python(monkeypatch, tmp_path):
    stages = {stage.name: stage for stage in suite.default_stages("/g/python", tmp_path, "/g/python")}
    assert list(stages) == ["env", "setup", "tests", "main_job", "bench"]
    assert all(
        stages[name].env == {"NG_GPU_PYTHON": "/g/python", "NG_GPU_ENGINE_PYTHON": "/g/python"}
        for name in ("tests", "main_job", "bench")
    )
    assert stages["main_job"].command == ["bash", "benchmarks/gpu/main_job.sh", str(tmp_path / "main_job")]
    assert (
        "NG_GPU_ENGINE_PYTHON" not in suite.default_stages("/g/python", tmp_path)[2].env
    )  # no carried vLLM: its engine venv


@pytest.mark.long
@pytest.mark.integration
def test_run_sh_on_a_machine_without_cuda(tmp_path):
    """setup and bench skip themselves; the gpu tests all skip (skip-without-CUDA), so the suite passes."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {
        **clean_env(),
        "NG_GPU_PYTHON": sys.executable,
        "NG_GPU_BUDGET_S": "300",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("NG_GPU_STAGES", None)
    done = subprocess.run(
        ["bash", "benchmarks/gpu/run.sh", f"--out={tmp_path}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stages = {row["name"]: row for row in json.loads((tmp_path / "suite.json").read_text())}
    assert list(stages) == ["env", "setup", "tests", "main_job", "bench"]
    if not _has_nvidia_smi():
        assert stages["setup"]["status"] == "skipped" and stages["setup"]["note"] == "no nvidia-smi: not a CUDA machine"
    assert stages["tests"]["status"] == "passed"
    assert (
        stages["main_job"]["status"] == "skipped" and stages["main_job"]["note"] == f"no CUDA GPU for {sys.executable}"
    )
    assert stages["bench"]["status"] == "skipped" and "no CUDA GPU" in stages["bench"]["note"]
    counts = suite.test_counts(tmp_path / "tests.xml")
    assert counts["skipped"] >= 10 and counts["passed"] == counts["failed"] == counts["errors"] == 0
    assert (
        "GPU suite" in done.stdout
        and f"tests: 0 passed, 0 failed, 0 errors, {counts['skipped']} skipped" in done.stdout
    )


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.integration
def test_bench_smoke_feeds_the_summary(tmp_path):
    pytest.importorskip("deepspeed")
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu/bench.py", "--smoke", f"--out={tmp_path}"],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    whats = [row["what"] for row in data["rows"]]
    assert whats == [
        "training step (s)",
        "training tokens/s (all)",
        "training tokens/s (generated)",
        "weight sync cuda_ipc (host shared memory) → stand-in receiver (s)",
        "weight sync gloo broadcast → stand-in receiver (s)",
        "weight sync filesystem (write only) (s)",
    ]
    assert all(row["value"] > 0 for row in data["rows"]) and data["rows"][3]["target"] == "≤ 0.5 s"
    assert data["notes"] == [
        "tiny: weight sync nccl not measured: NCCL needs vLLM on a GPU other than the trainer's (0 GPUs here, vLLM on"
        " the trainer's)"
    ]
    assert (tmp_path / "bench.png").stat().st_size > 0
    text = suite.summary([], tmp_path)
    assert "weight sync gloo broadcast" in text and "target ≤ 0.5 s: " in text
    # the models it wrote (on a GPU: GBs) stay out of the results folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.png", "summary.txt"]


def _has_nvidia_smi() -> bool:
    import shutil

    return shutil.which("nvidia-smi") is not None


# -- the lent GPU's flow -----------------------------------------------------------------------------------------
device_calls = load("device_calls")
MIB = 1 << 20


def test_device_calls_pack_the_parts_and_end_with_the_install(tmp_path):
    sizes = {".vc0": 50 * MIB, ".vc1": 50 * MIB, ".vc2": 20 * MIB, ".vw0": 50 * MIB, ".vw1": 30 * MIB, ".vw2": 8 * MIB}
    # the install part (20 MiB) takes the smallest beside it (8, then 30: 58 MiB); the three of 50 MiB one call each
    assert device_calls.plan(sizes, ".vc2", 60 * MIB) == [[".vc0"], [".vc1"], [".vw0"], [".vc2", ".vw2", ".vw1"]]
    assert device_calls.plan({".vc0": 10 * MIB, ".vw0": 10 * MIB, ".vw1": 15 * MIB}, ".vc0", 30 * MIB) == [
        [".vw1"],
        [".vc0", ".vw0"],
    ]
    with pytest.raises(ValueError, match=r"parts over 60 MiB: \.vc0"):
        device_calls.plan({".vc0": 61 * MIB, ".vc1": MIB}, ".vc1", 60 * MIB)
    for name, size in {".vc0": 3000, ".vc1": 1000, ".vw0": 2000}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "part.00").write_bytes(b"x" * size)
    (tmp_path / ".vc1" / "install.sh").write_text("")
    (tmp_path / ".vcache").mkdir()  # not a part
    assert device_calls.parts(tmp_path) == {".vc0": 3000, ".vc1": 1000, ".vw0": 2000}


def test_device_sh_stashes_the_parts_and_refuses_anything_else(tmp_path):
    (tmp_path / ".vw0").mkdir()
    (tmp_path / ".vw0" / "part.00").write_text("wheels")
    (tmp_path / ".vw0" / "SHA256").write_text("abc\n")
    env = {**os.environ, "NG_CARRY_TMP": str(tmp_path / "tmp")}
    script = str(REPO / "benchmarks/gpu/device.sh")
    done = subprocess.run(
        ["bash", script, "stash", str(tmp_path / ".vw0")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tmp/vw/part.00").read_text() == "wheels" and (tmp_path / "tmp/vw/SHA256").read_text() == "abc\n"
    done = subprocess.run(["bash", script, "stash", "results"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a carried part: results" in done.stderr
    done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: bash benchmarks/gpu/device.sh stash <parts...> | run" in done.stderr


def test_carry_sh_in_a_checkout_without_venv_says_what_to_run_before_downloading(tmp_path):
    """The wheels' versions are .venv's: in a fresh clone carry.sh stops at once, naming setup.sh (not minutes of
    vLLM downloads later, on `.venv/bin/python: No such file`)."""
    (tmp_path / "benchmarks/gpu").mkdir(parents=True)
    for name in ("carry.sh", "wheelhouse.sh"):
        (tmp_path / "benchmarks/gpu" / name).write_text((REPO / "benchmarks/gpu" / name).read_text())
        done = subprocess.run(
            ["bash", str(tmp_path / "benchmarks/gpu" / name)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1 and "run 'bash scripts/setup.sh' first" in done.stderr, done.stderr
        assert "==" not in done.stdout  # nothing started


def make_wheel(folder: Path, name: str, version: str, module: str) -> Path:
    """A pure-Python wheel of one module."""
    import zipfile

    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}.py", "VALUE = 42\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.mark.integration
def test_overlay_venv_on_a_python_with_a_carried_vllm(tmp_path):
    """overlay.py on this .venv's python (a venv itself, like an image's): the stand-in vLLM folder comes first, a
    carried wheel is installed only where its distribution is missing, and the ng_* commands run in the new venv."""
    site = tmp_path / "vllm-site" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("__version__ = '0.24.0'\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "ng_carried_probe", "1.0", "ng_carried_probe")
    make_wheel(wheels, "pydantic", "0.0.1", "pydantic_impostor")  # the base has pydantic: not installed
    venv = tmp_path / "venv"
    done = subprocess.run(
        [
            "python3",
            str(REPO / "benchmarks/gpu/overlay.py"),
            "--venv",
            str(venv),
            "--base-python",
            sys.executable,
            "--site",
            str(site.parent),
            "--wheels",
            str(wheels),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NOTE: " in done.stdout and "1 of 2 carried wheels installed" in done.stdout
    code = (
        "import sys, vllm, ng_carried_probe, nemo_gym, pydantic; print(sys.executable, vllm.__version__,"
        " ng_carried_probe.VALUE, pydantic.VERSION)"
    )
    answer = subprocess.run([str(venv / "bin/python"), "-c", code], capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    executable, version, value, pydantic_version = answer.stdout.split()
    assert (executable, version, value) == (str(venv / "bin/python"), "0.24.0", "42") and pydantic_version != "0.0.1"
    assert not (venv / "carried" / "pydantic_impostor.py").exists()
    version_command = subprocess.run([str(venv / "bin/ng_version")], capture_output=True, text=True, timeout=120)
    assert version_command.returncode == 0 and version_command.stdout.startswith("nemo_gym "), version_command.stderr
