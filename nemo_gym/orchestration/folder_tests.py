"""`ng_test`, `ng_test_all`, `ng_dev_test` and `ng_pip_list`: test servers in their own environments.

`ng_test +entrypoint=<type>/<name>` builds (or reuses) the server's environment with `ensure_venv` (the
one `ng_run` uses, keyed by its requirements.txt) plus pytest, then runs there, with the repository root as
working directory: the server's pytest suite (`<folder>/tests/`), its verifier fixtures
(`tests/verifier_cases.jsonl`, no model) and, with `+should_validate_data=true`, the data checks of
`nemo_gym.env.validation`, and, on a resources server, the conformance checks of `nemo_gym.env.conformance` (each check
a test: one that fails is reported by name with what was wrong; `+run_conformance=false` skips them; agent and model
servers have none). `ng_test_all` does that for every server folder, a few at a time.

The helpers a server's own tests share (`server_client`, `assistant_response`, `post_verify`, `NgRun`, ...) live
in `nemo_gym.env.testing`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT, SERVER_TYPES
from nemo_gym.config import did_you_mean
from nemo_gym.orchestration.venvs import VenvBuildError, ensure_venv, find_links_args, uv_executable

__all__ = [
    "TestOptions",
    "TestAllOptions",
    "DevTestOptions",
    "PipListOptions",
    "RowSchemaOptions",
    "TestReport",
    "server_folder",
    "run_server_tests",
    "test_main",
    "test_all_main",
    "dev_test_main",
    "pip_list_main",
    "row_schema_main",
]

TEST_PACKAGES = ("pytest>=8", "pytest-timeout>=2.3")


class TestOptions(BaseModel):
    """Parameters of `ng_test`."""

    __test__ = False  # not a pytest test class
    model_config = ConfigDict(extra="forbid")
    entrypoint: str = Field(description="the server folder, <type>/<name>, e.g. resources_servers/mcqa")
    should_validate_data: bool = Field(
        False,
        description="also check data/example.jsonl (5 valid rows, known tools) and re-verify example_rollouts.jsonl",
    )
    run_conformance: bool = Field(
        True,
        description=(
            "run the conformance checks of nemo_gym.env.conformance on a resources server (health, tool schemas,"
            " malformed /verify bodies, sessions, example rows, bad answers)"
        ),
    )
    markers: str = Field("not e2e", description="pytest -m expression selecting the tests ('' = all)")
    skip_venv: bool = Field(
        False, description="run with this Python instead of the server's own uv environment (development)"
    )
    timeout_s: float = Field(1800.0, description="seconds allowed for the environment build, then for the tests")


class TestAllOptions(BaseModel):
    """Parameters of `ng_test_all`."""

    __test__ = False
    model_config = ConfigDict(extra="forbid")
    should_validate_data: bool = Field(False, description="also validate each resources server's data (see ng_test)")
    run_conformance: bool = Field(True, description="run the conformance checks on each resources server (see ng_test)")
    fail_on_total_and_test_mismatch: bool = Field(False, description="fail when a server folder has no tests")
    num_workers: int = Field(
        min(2, os.cpu_count() or 1), ge=1, description="servers tested at the same time (default: CPU cores, at most 2)"
    )
    markers: str = Field("not e2e", description="pytest -m expression selecting the tests ('' = all)")
    skip_venv: bool = Field(
        False, description="run with this Python instead of each server's own uv environment (development)"
    )
    server_types: list[str] = Field(list(SERVER_TYPES), description="which server types to test")


class DevTestOptions(BaseModel):
    """Parameters of `ng_dev_test`."""

    model_config = ConfigDict(extra="forbid")
    paths: list[str] = Field(["tests"], description="test paths, relative to the repository root")
    markers: str = Field(
        "not integration and not e2e", description="pytest -m expression ('' = all, integration included)"
    )
    fail_under: float | None = Field(None, ge=0, le=100, description="fail when total coverage (percent) is below this")


class PipListOptions(BaseModel):
    """Parameters of `ng_pip_list`."""

    model_config = ConfigDict(extra="forbid")
    entrypoint: str = Field(description="the server folder, <type>/<name>, whose environment to list")
    format: Literal["columns", "freeze", "json"] = Field("columns", description="output format of `uv pip list`")
    outdated: bool = Field(False, description="list only packages with a newer version on the package index")


class RowSchemaOptions(BaseModel):
    """Parameters of `ng_row_schema`."""

    model_config = ConfigDict(extra="forbid")
    entrypoint: str = Field(description="the resources server folder, resources_servers/<name>")
    skip_venv: bool = Field(
        False, description="read it with this Python instead of the server's own uv environment (development)"
    )


@dataclass
class TestReport:
    """Outcome of `ng_test` on one server. `passed`/`failed` count pytest tests, verifier cases and conformance
    checks."""

    __test__ = False
    server: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    has_tests: bool = False
    seconds: float = 0.0
    problems: list[str] = field(
        default_factory=list
    )  # data/verifier problems, failed conformance checks and setup errors, one line each
    log: str = ""

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.problems


def server_folders(types: list[str] | tuple[str, ...] = SERVER_TYPES) -> list[Path]:
    """Every server folder (`<type>/<name>/app.py` exists), sorted."""
    return sorted(
        p.parent for t in types for p in (REPO_ROOT / t).glob("*/app.py") if not p.parent.name.startswith((".", "_"))
    )


def server_folder(entrypoint: str) -> Path:
    """The folder of `<type>/<name>` of this repository, else a server folder of the user's (a path from the
    working directory, e.g. `.` in a project made by `ng_init`).

    Raises:
        ConfigError: not a server folder (with a suggestion among the existing ones).
    """
    rel = entrypoint.strip().rstrip("/") or "."
    folder = (REPO_ROOT / rel).resolve()
    if not (folder / "app.py").is_file() and (Path.cwd() / rel / "app.py").is_file():
        folder = (Path.cwd() / rel).resolve()
    if not (folder / "app.py").is_file():
        known = [str(p.relative_to(REPO_ROOT)) for p in server_folders()]
        raise ConfigError(
            f"+entrypoint={entrypoint}: no server folder there (<type>/<name> with an app.py){did_you_mean(rel, known)}"
        )
    return folder


def python_for_tests(folder: Path, timeout_s: float = 1800) -> Path:
    """The Python of the server's environment (built or reused by `ensure_venv`), with pytest installed.

    Raises:
        VenvBuildError: building the environment or installing pytest failed.
    """
    python = asyncio.run(ensure_venv(folder / "requirements.txt", timeout_s=timeout_s))
    root = python.parent.parent
    marker = root / ".test-ready"
    if marker.exists():
        return python
    with (root.parent / f"{root.name}.test.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            command = [
                uv_executable(),
                "pip",
                "install",
                "--quiet",
                "--python",
                str(python),
                *find_links_args(),
                *TEST_PACKAGES,
            ]
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_clean_env())
            if done.returncode != 0:
                raise VenvBuildError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
            marker.write_text(" ".join(command) + "\n")
    return python


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}


def server_test_files(folder: Path) -> list[Path]:
    return sorted((folder / "tests").glob("test_*.py")) + sorted((folder / "tests").glob("*_test.py"))


def junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a pytest JUnit XML file; failed includes errors."""
    if not path.is_file() or path.stat().st_size == 0:
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - failed - skipped, failed, skipped


def run_server_tests(
    folder: Path,
    *,
    should_validate_data: bool = False,
    markers: str = "not e2e",
    skip_venv: bool = False,
    timeout_s: float = 1800,
    stream: bool = True,
    run_conformance: bool = True,
) -> TestReport:
    """Run a server's tests, verifier cases, conformance checks (`run_conformance`, resources servers only) and
    (optionally) data checks in its environment.

    `stream`: print the tools' output as it comes (else it is kept in `report.log`).
    """
    start = time.monotonic()
    report = TestReport(_shown(folder), has_tests=bool(server_test_files(folder)))
    try:
        python = Path(sys.executable) if skip_venv else python_for_tests(folder, timeout_s)
    except VenvBuildError as exc:
        report.problems.append(f"{report.server}: environment: {exc}")
        report.seconds = time.monotonic() - start
        return report
    with tempfile.TemporaryDirectory(prefix="ng_test_") as tmp:
        if report.has_tests:
            junit = Path(tmp) / "junit.xml"
            command = [
                str(python),
                "-m",
                "pytest",
                str(folder / "tests"),
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
            ]
            code = _run(command + (["-m", markers] if markers else []), report, stream, timeout_s)
            report.passed, report.failed, report.skipped = junit_counts(junit)
            if (
                code not in (0, 5) and report.failed == 0
            ):  # 5 = no test selected; other codes: a usage or collection error
                report.problems.append(f"{report.server}: pytest exited with code {code}")
        if folder.parent.name == "resources_servers":
            _validate(python, folder, report, should_validate_data, stream, timeout_s, Path(tmp) / "validation.json")
        if run_conformance and folder.parent.name not in ("responses_api_agents", "responses_api_models"):
            _conformance(python, folder, report, stream, timeout_s, Path(tmp) / "conformance.json")
    report.seconds = time.monotonic() - start
    return report


def _shown(folder: Path) -> str:
    """`<type>/<name>` for a folder of this repository, else the full path."""
    try:
        return str(folder.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(folder)


def _validate(
    python: Path, folder: Path, report: TestReport, data: bool, stream: bool, timeout_s: float, out: Path
) -> None:
    if not data and not (folder / "tests" / "verifier_cases.jsonl").is_file():
        return
    command = [str(python), "-m", "nemo_gym.env.validation", str(folder), "--json-out", str(out)] + (
        ["--data"] if data else []
    )
    code = _run(command, report, stream, timeout_s)
    if not out.is_file():
        report.problems.append(f"{report.server}: validation crashed (exit {code})")
        return
    result = json.loads(out.read_text())
    report.passed += result["verifier_cases_passed"]
    report.failed += result["verifier_cases_failed"]
    report.problems += [
        f"{p['file']}:{p['line']}: [{p['rule']}] {p['message']}"
        for p in result["problems"]
        if p["rule"] != "verifier-case"
    ]


def _conformance(python: Path, folder: Path, report: TestReport, stream: bool, timeout_s: float, out: Path) -> None:
    """The conformance checks (`python -m nemo_gym.env.conformance`) in the server's environment: each check that passed
    counts as a passed test, each that failed as a failed test and a problem naming it. A folder outside
    `resources_servers/`
    whose server is an agent or a model is skipped there (the checks are for resources servers)."""
    code = _run(
        [str(python), "-m", "nemo_gym.env.conformance", str(folder), "--json-out", str(out), "--quiet"],
        report,
        stream,
        timeout_s,
    )
    if not out.is_file():
        report.problems.append(f"{report.server}: the conformance checks crashed (exit {code})")
        return
    result = json.loads(out.read_text())
    report.passed += len(result["passed"])
    report.failed += len(result["problems"])
    report.problems += [
        f"{report.server}: conformance check {p['check']} failed: {p['message']}" for p in result["problems"]
    ]


def _run(command: list[str], report: TestReport, stream: bool, timeout_s: float) -> int:
    """Run `command` in the repository root; its output goes to stdout (`stream`) or to `report.log`."""
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=_clean_env(),
            timeout=timeout_s,
            text=True,
            stdout=None if stream else subprocess.PIPE,
            stderr=None if stream else subprocess.STDOUT,
        )
    except subprocess.TimeoutExpired:
        report.problems.append(f"{report.server}: {' '.join(command[:4])} ... took longer than {timeout_s:.0f} s")
        return -1
    report.log += done.stdout or ""
    return done.returncode


def test_main(options: TestOptions) -> int:
    folder = server_folder(options.entrypoint)
    report = run_server_tests(
        folder,
        should_validate_data=options.should_validate_data,
        markers=options.markers,
        skip_venv=options.skip_venv,
        timeout_s=options.timeout_s,
        run_conformance=options.run_conformance,
    )
    for problem in report.problems:
        print(problem)
    verdict = "passed" if report.ok else "FAILED"
    print(
        f"ng_test {report.server}: {verdict} ({report.passed} passed, {report.failed} failed, {report.skipped} skipped,"
        f" {report.seconds:.1f} s)"
    )
    return 0 if report.ok else 1


def summary_table(reports: list[TestReport]) -> str:
    """A text table: server, passed, failed, skipped, seconds, status."""
    width = max([len("server")] + [len(r.server) for r in reports])
    lines = [f"{'server':<{width}}  {'passed':>6}  {'failed':>6}  {'skipped':>7}  {'seconds':>7}  status"]
    for r in reports:
        status = "ok" if r.ok and r.has_tests else "NO TESTS" if r.ok else "FAILED"
        lines.append(f"{r.server:<{width}}  {r.passed:>6}  {r.failed:>6}  {r.skipped:>7}  {r.seconds:>7.1f}  {status}")
    return "\n".join(lines)


def test_all_main(options: TestAllOptions) -> int:
    unknown = [t for t in options.server_types if t not in SERVER_TYPES]
    if unknown:
        raise ConfigError(f"+server_types: unknown {unknown}; choose among {list(SERVER_TYPES)}")
    folders = server_folders(options.server_types)
    print(f"Testing {len(folders)} servers, {options.num_workers} at a time...", flush=True)

    def one(folder: Path) -> TestReport:
        report = run_server_tests(
            folder,
            should_validate_data=options.should_validate_data,
            markers=options.markers,
            skip_venv=options.skip_venv,
            stream=False,
            run_conformance=options.run_conformance,
        )
        print(f"  {report.server}: {'ok' if report.ok else 'FAILED'} ({report.seconds:.1f} s)", flush=True)
        return report

    with ThreadPoolExecutor(options.num_workers) as pool:
        reports = list(pool.map(one, folders))
    for report in reports:
        if not report.ok:
            print(f"\n--- {report.server} ---\n{report.log[-4000:]}" + "".join(f"\n{p}" for p in report.problems))
    print()
    print(summary_table(reports))
    untested = [r.server for r in reports if not r.has_tests]
    failed = [r.server for r in reports if not r.ok]
    print(
        f"\n{len(reports) - len(failed)}/{len(reports)} servers passed; {len(untested)} without tests"
        + (f": {', '.join(untested)}" if untested else "")
    )
    if options.fail_on_total_and_test_mismatch and untested:
        print(
            f"ng_test_all: {len(untested)} of {len(reports)} servers have no tests"
            " (+fail_on_total_and_test_mismatch=true)",
            file=sys.stderr,
        )
        return 1
    return 1 if failed else 0


def coverage_percent(report_json: Path) -> float:
    """Total coverage in percent from a coverage.py JSON report."""
    return float(json.loads(report_json.read_text())["totals"]["percent_covered"])


def dev_test_main(options: DevTestOptions) -> int:
    with tempfile.TemporaryDirectory(prefix="ng_dev_test_") as tmp:
        report = Path(tmp) / "coverage.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            *options.paths,
            "--cov=nemo_gym",
            "--cov-report=term",
            f"--cov-report=json:{report}",
        ]
        command += ["-m", options.markers] if options.markers else []
        env = {**os.environ, "COVERAGE_FILE": str(Path(tmp) / ".coverage")}  # no .coverage left in the checkout
        code = subprocess.run(command, cwd=REPO_ROOT, env=env).returncode
        if not report.is_file():
            print(
                "ng_dev_test: no coverage report was written (is pytest-cov installed? pip install -e '.[dev]')",
                file=sys.stderr,
            )
            return code or 1
        percent = coverage_percent(report)
    print(f"coverage of nemo_gym: {percent:.1f}%")
    if options.fail_under is not None and percent < options.fail_under:
        print(f"ng_dev_test: coverage {percent:.1f}% is below +fail_under={options.fail_under}", file=sys.stderr)
        return code or 1
    return code


def pip_list_main(options: PipListOptions) -> int:
    if options.outdated and options.format == "freeze":
        raise ConfigError("+outdated=true lists versions side by side: use +format=columns or +format=json")
    folder = server_folder(options.entrypoint)
    python = asyncio.run(ensure_venv(folder / "requirements.txt"))
    command = [uv_executable(), "pip", "list", "--python", str(python), "--format", options.format]
    command += ["--outdated"] if options.outdated else []
    return subprocess.run(command, env=_clean_env()).returncode


def row_schema_main(options: RowSchemaOptions) -> int:
    """`ng_row_schema`: the JSON Schema of a resources server's dataset rows (its verify request's task fields and its
    seed request's, `GET /row_schema`; NeMo Gym 0.7.0's `gym env schema`), read in the server's own environment (built
    or reused as `ng_run` builds it: its app.py may import its requirements). Returns the exit status.

    Raises:
        ConfigError: not a server folder. VenvBuildError: its environment could not be built.
    """
    folder = server_folder(options.entrypoint)
    python = Path(sys.executable) if options.skip_venv else asyncio.run(ensure_venv(folder / "requirements.txt"))
    command = [str(python), "-m", "nemo_gym.env.validation", str(folder), "--schema"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=_clean_env())
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"ng_row_schema: {_shown(folder)}: the schema could not be read: {last[0]}", file=sys.stderr)
        return 1
    print(done.stdout, end="")
    return 0
