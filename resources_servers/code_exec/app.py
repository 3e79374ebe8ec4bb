"""code_exec: the policy writes a Python function; the reward is the fraction of the task's unit tests it passes.

The code is the last ```python block of the last assistant message (else the last untagged block, else the
whole text). It runs only in the sandbox of `sandbox.py` (bubblewrap: no network, a fresh working directory
as the only writable place, the server's files and environment out of sight, CPU/wall/memory/process/file/
output limits), under `harness.py`, which calls the function on each test's arguments; the returned values
are compared with the expected ones here, outside the sandbox (`grading.py`). Without bwrap the server
still starts (and says why it cannot run code); a rollout that needs the sandbox is then an infrastructure
failure (502 `sandbox_unavailable`), never reward 0 and never unsandboxed execution.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session

from . import grading
from . import sandbox as sandbox_module

logger = logging.getLogger(__name__)


class UnitTest(BaseModel):
    """One test: call the function with `args` and `kwargs`; it must return `expected` (JSON values)."""

    model_config = ConfigDict(extra="forbid")
    args: list[Any] = Field(default_factory=list, description="positional arguments")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")
    expected: Any = Field(description="the value the function must return (floats compared within 1e-9)")


class CodeExecRequest(VerifyRequest):
    """The `/verify` body: the row's task fields plus `response`."""

    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="name of the function to test")
    tests: list[UnitTest] = Field(min_length=1, max_length=200, description="the unit tests")


class CodeExecResult(VerifyResult):
    failure_reason: str | None = Field(description="why the reward is below 1; None when every test passed")
    tests_passed: int
    tests_total: int
    test_results: list[dict[str, Any]] = Field(description="per test: index, passed, error, limit")
    extracted_code: str | None = Field(description="the code that was run (None when the answer had none)")
    sandbox: dict[str, Any] | None = Field(description="how the sandboxed run ended (exit code, limits hit, ...)")


class CodeExecServer(ResourcesServer):
    """Python function synthesis scored by unit tests run in a sandbox. Reward in [0, 1]: tests passed / tests."""

    verify_request_type = CodeExecRequest

    class Config(ServerConfig):
        wall_time_s: float = Field(
            10.0, gt=0, description="wall-clock seconds for loading the code and running all tests"
        )
        test_timeout_s: float = Field(2.0, gt=0, description="seconds per test (and for loading the code)")
        cpu_time_s: int = Field(10, gt=0, description="CPU seconds of the sandboxed program (RLIMIT_CPU)")
        memory_mb: int = Field(512, ge=64, description="address space per process, MiB (RLIMIT_AS)")
        max_processes: int = Field(32, ge=1, description="processes and threads of the sandbox (RLIMIT_NPROC)")
        max_output_bytes: int = Field(
            256 * 1024, ge=4096, description="stdout + stderr bytes before the sandbox is killed"
        )
        max_file_size_mb: int = Field(16, ge=1, description="largest file the code may write, MiB (RLIMIT_FSIZE)")
        max_open_files: int = Field(64, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
        max_disk_mb: int = Field(
            64, ge=1, description="size of the working directory (a tmpfs), MiB, all files together"
        )
        max_concurrent_runs: int = Field(2, ge=1, le=64, description="sandboxes running at once (more rollouts wait)")
        max_code_chars: int = Field(100_000, ge=1, description="longer code is not run (reward 0, code_too_long)")
        python_executable: str | None = Field(
            None,
            description="interpreter in the sandbox (default: this Python's base interpreter; standard library only)",
        )
        bwrap_path: str | None = Field(None, description="the bubblewrap binary (default: `bwrap` on PATH)")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        c = self.config
        limits = sandbox_module.SandboxLimits(
            wall_time_s=c.wall_time_s,
            cpu_time_s=c.cpu_time_s,
            memory_mb=c.memory_mb,
            max_processes=c.max_processes,
            max_output_bytes=c.max_output_bytes,
            max_file_size_mb=c.max_file_size_mb,
            max_open_files=c.max_open_files,
            max_disk_mb=c.max_disk_mb,
        )
        self.sandbox = sandbox_module.Sandbox(
            limits, python_executable=c.python_executable, bwrap_path=c.bwrap_path, max_concurrent=c.max_concurrent_runs
        )

    async def startup(self) -> None:
        try:
            await asyncio.to_thread(self.sandbox.check)
        except sandbox_module.SandboxUnavailableError as exc:
            logger.error("code_exec: %s; every rollout with code will fail with 502 sandbox_unavailable", exc)

    async def verify(self, request: CodeExecRequest, session: Session) -> CodeExecResult:
        """Run the answer's code against the row's tests. Reward in [0, 1].

        Raises:
            SandboxUnavailableError: the sandbox cannot run here (the framework answers 502).
        """
        tests = [t.model_dump() for t in request.tests]
        text = grading.last_assistant_text(request.response)
        code = grading.extract_code(text) if text.strip() else ""
        if not code.strip() or len(code) > self.config.max_code_chars:
            reason = "no_code" if not code.strip() else "code_too_long"
            outcomes = [grading.TestOutcome(i, False, reason) for i in range(len(tests))]
            return self._result(grading.Grade(outcomes, reason), code or None)
        verdict = await asyncio.to_thread(
            grading.grade, self.sandbox, code, request.entry_point, tests, self.config.test_timeout_s
        )
        return self._result(verdict, code)

    def _result(self, verdict: Any, code: str | None) -> CodeExecResult:
        sandbox = verdict.sandbox
        return CodeExecResult(
            reward=verdict.reward,
            reward_components={f"test_{t.index}": float(t.passed) for t in verdict.tests},
            failure_reason=verdict.failure_reason,
            tests_passed=verdict.passed,
            tests_total=len(verdict.tests),
            test_results=[
                {"index": t.index, "passed": t.passed, "error": t.error, "limit": t.limit} for t in verdict.tests
            ],
            extracted_code=code,
            sandbox=(
                None
                if sandbox is None
                else {
                    "exit_code": sandbox.exit_code,
                    "signal": sandbox.signal,
                    "timed_out": sandbox.timed_out,
                    "killed_by": sandbox.killed_by,
                    "limits_hit": sandbox.limits_hit,
                    "output_truncated": sandbox.output_truncated,
                    "wall_time_s": sandbox.wall_time_s,
                    "stderr_tail": sandbox.stderr[-2000:],
                }
            ),
        )

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus `pass_rate` (all tests passed) and the count of each failure_reason."""
        metrics = await super().aggregate_metrics(verify_responses)
        rows = [r for r in verify_responses if isinstance(r, dict) and "reward" in r]
        if rows:
            metrics["pass_rate"] = sum(float(r["reward"]) >= 1.0 for r in rows) / len(rows)
            reasons: dict[str, int] = {}
            for r in rows:
                if r.get("failure_reason"):
                    reasons[str(r["failure_reason"])] = reasons.get(str(r["failure_reason"]), 0) + 1
            metrics["failure_reasons"] = reasons
        return metrics
