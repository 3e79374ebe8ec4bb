"""The GPU suite's stage runner (`bash benchmarks/gpu/run.sh` runs it with the system's python3; standard library only).

Stages run one after the other, each under `timeout` (coreutils) with its own limit, cut to what is left of the
whole suite's budget (default 570 s, so the suite ends within 10 minutes). A stage that fails or times out does not
stop the others. A stage skips itself by exiting with SKIP_STATUS (77, automake's convention) after printing a
line `SKIP: <why>`; it finds its limit in NG_GPU_STAGE_LIMIT_S (seconds). Each stage's output goes to
`<out>/<stage>.log`; `<out>/suite.json` holds every stage's status,
seconds and note; the summary (stages, the tests' counts from `<out>/tests.xml`, the main job's from
`<out>/main_job/summary.json`, then the benchmark's figures from `<out>/bench.json`, each against its target where it
has one) goes to stdout and `<out>/summary.txt`.

    python3 benchmarks/gpu/suite.py [--out results/bench/gpu] [--budget-s 570] [--stages env,setup,tests,main_job,bench]

The trainer's python is `$NG_GPU_PYTHON`, else `.venv-gpu/bin/python` (made by the setup stage). vLLM's python
(vllm_model's `engine_python`) is `$NG_GPU_ENGINE_PYTHON`, else, when vLLM was carried in (`$NG_GPU_VLLM_SITE`), the
trainer's python (it sees that vLLM); else vllm_model builds its engine venv (`vllm_package: vllm`). The stages get
it as NG_GPU_ENGINE_PYTHON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_STATUS = 77
TIMEOUT_STATUSES = (124, 137)  # `timeout`: the limit passed (124), or SIGKILL after the grace (128 + 9)
KILL_GRACE_S = 10
DEFAULT_BUDGET_S = 570.0


@dataclass
class Stage:
    """One step of the suite: `command` (argv) run from the repository root under `limit_s` seconds."""

    name: str
    command: list[str]
    limit_s: float
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class StageResult:
    name: str
    status: str  # passed | failed | timed_out | skipped
    seconds: float
    returncode: int | None
    note: str
    log: str


def run_stage(stage: Stage, out: Path, limit_s: float) -> StageResult:
    """Run one stage under `timeout` (SIGTERM at `limit_s`, SIGKILL KILL_GRACE_S later); never raises for the stage's
    own failure."""
    log = out / f"{stage.name}.log"
    started = time.monotonic()
    command = ["timeout", f"--kill-after={KILL_GRACE_S}", f"{max(1, int(limit_s))}", *stage.command]
    with log.open("w") as handle:
        handle.write(f"$ {' '.join(stage.command)}   (limit {limit_s:.0f} s)\n")
        handle.flush()
        try:
            env = {
                **os.environ,
                **stage.env,
                "NG_GPU_STAGE_LIMIT_S": str(int(limit_s)),
            }  # a stage may plan its parts by it
            process = subprocess.run(
                command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=limit_s + KILL_GRACE_S + 30
            )
            returncode: int | None = process.returncode
        except FileNotFoundError as exc:  # `timeout` itself missing
            handle.write(f"{exc}\n")
            returncode = 127
        except subprocess.TimeoutExpired:
            returncode = None
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    if returncode == SKIP_STATUS:
        status, note = "skipped", _last_line(text, "SKIP:") or "skipped itself"
    elif returncode is None or returncode in TIMEOUT_STATUSES:
        status, note = "timed_out", f"stopped at its limit of {limit_s:.0f} s"
    elif returncode == 0:
        status, note = "passed", _last_line(text, "NOTE:")
    else:
        status, note = "failed", f"exit {returncode}: {_last_line(text, '') or 'no output'}"
    return StageResult(stage.name, status, round(seconds, 1), returncode, note, str(log))


def run_stages(stages: list[Stage], out: Path, budget_s: float) -> list[StageResult]:
    """Every stage in order, each limited to min(its limit, the budget left); a stage with under 5 s left is skipped."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    results = []
    for stage in stages:
        left = deadline - time.monotonic()
        if left < 5:
            results.append(
                StageResult(stage.name, "skipped", 0.0, None, f"the suite's budget of {budget_s:.0f} s is spent", "")
            )
            continue
        result = run_stage(stage, out, min(stage.limit_s, left))
        results.append(result)
        print(
            f"[gpu suite] {stage.name}: {result.status} in {result.seconds:.0f}"
            f" s{' - ' + result.note if result.note else ''}",
            flush=True,
        )
    (out / "suite.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    return results


def test_counts(junit_xml: Path) -> dict[str, int] | None:
    """passed / failed / skipped / errors of a pytest --junitxml file; None when there is none."""
    if not junit_xml.is_file():
        return None
    root = ElementTree.parse(junit_xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    return {
        "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
        "failed": total["failures"],
        "errors": total["errors"],
        "skipped": total["skipped"],
    }


def summary(results: list[StageResult], out: Path) -> str:
    """The suite's summary: one line per stage, the tests' counts, the main job's, the benchmark's figures
    (`bench.json` rows, with `target` and whether it is `met` where a row has one)."""
    lines = ["GPU suite", f"{'stage':8} {'status':10} {'seconds':>8}  note"]
    lines += [f"{r.name:8} {r.status:10} {r.seconds:8.0f}  {r.note}" for r in results]
    counts = test_counts(out / "tests.xml")
    if counts is not None:
        lines.append("tests: " + ", ".join(f"{value} {key}" for key, value in counts.items()))
    main_job = out / "main_job" / "summary.json"
    if main_job.is_file():
        lines.append(
            "main job: " + "; ".join(f"{key} {value}" for key, value in json.loads(main_job.read_text()).items())
        )
    bench = out / "bench.json"
    if bench.is_file():
        data = json.loads(bench.read_text())
        lines.append(f"benchmark on {data.get('device', '?')}:")
        for row in data.get("rows", []):
            target = f"  target {row['target']}: {'met' if row.get('met') else 'MISSED'}" if row.get("target") else ""
            lines.append(f"  {row['model']:14} {row['what']:46} {row['value']:>10.3f} {row['unit']}{target}")
        for note in data.get("notes", []):
            lines.append(f"  note: {note}")
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    return text


STAGES = ("env", "setup", "tests", "main_job", "bench")


def default_stages(python: str, out: Path, engine_python: str = "") -> list[Stage]:
    """env → setup → tests (marked gpu) → main_job → bench. The limits add up to more than the budget on purpose: the
    budget cuts the bench on a first run (rerun it alone: --stages bench, the venvs then exist); the tests and the
    main job come first. `engine_python`: vLLM's python for every vllm_model of the stages (NG_GPU_ENGINE_PYTHON)."""
    env = {"NG_GPU_PYTHON": python, **({"NG_GPU_ENGINE_PYTHON": engine_python} if engine_python else {})}
    return [
        Stage(
            "env",
            [
                "bash",
                "-c",
                (
                    f"nvidia-smi || echo 'no nvidia-smi'; python3 -c 'import sys; print(sys.version)'; {python} -c"
                    " 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(),"
                    " torch.cuda.device_count())' || true"
                ),
            ],
            30,
        ),
        Stage("setup", ["bash", "benchmarks/gpu/setup.sh"], 240),
        Stage(
            "tests",
            [
                python,
                "-m",
                "pytest",
                "-m",
                "gpu",
                "tests/test_gpu.py",
                "-q",
                "-rA",
                "-s",
                "-p",
                "no:cacheprovider",
                f"--junitxml={out / 'tests.xml'}",
            ],
            210,
            env,
        ),
        Stage("main_job", ["bash", "benchmarks/gpu/main_job.sh", str(out / "main_job")], 150, env),
        Stage("bench", [python, "benchmarks/gpu/bench.py", f"--out={out}"], 300, env),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results/bench/gpu")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in this order")
    args = parser.parse_args(argv)
    python = os.environ.get("NG_GPU_PYTHON") or str(REPO / ".venv-gpu/bin/python")
    engine_python = os.environ.get("NG_GPU_ENGINE_PYTHON") or (python if os.environ.get("NG_GPU_VLLM_SITE") else "")
    wanted = args.stages.split(",")
    stages = [s for s in default_stages(python, args.out, engine_python) if s.name in wanted]
    unknown = set(wanted) - {s.name for s in stages}
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; the stages are {', '.join(STAGES)}")
    results = run_stages(stages, args.out, args.budget_s)
    print(summary(results, args.out), flush=True)
    return 0 if all(r.status in ("passed", "skipped") for r in results) else 1


def _last_line(text: str, prefix: str) -> str:
    for line in reversed(text.strip().splitlines()):
        if line.startswith(prefix):
            return line[len(prefix) :].strip()[:300]
    return ""


if __name__ == "__main__":
    sys.exit(main())
