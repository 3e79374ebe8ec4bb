"""Test harness run INSIDE the sandbox (standard library only): loads the candidate and calls its function on
each test's arguments, reporting what it returned. It never judges: the expected values are not in the
sandbox, and the server compares the reported values with them.

Input: `spec.json` in the working directory, `{"nonce", "entry_point", "tests": [{"args", "kwargs"}],
"test_timeout_s"}`, and the candidate's code in `solution.py`.
Output: one line per event on the stdout it had at start, `<nonce> <json>`:
`{"event": "loaded"}` or `{"event": "load_error", "error"}`, then per test `{"event": "test", "index", "ok":
true, "value"}` or `{"event": "test", "index", "ok": false, "error", "limit"}`, then `{"event": "done"}`.

Why forging results gains nothing: the candidate runs in this process and can read the nonce and write
result lines, but a result line only carries the candidate's own return values; the pass/fail verdict is
made outside the sandbox against expected values the candidate never sees. The nonce only tells result
lines apart from whatever the candidate prints. The candidate's `print`s go to stderr (a candidate writing
to fd 1 directly is tolerated: the server reads only lines holding the nonce).
"""

import errno
import json
import os
import signal
import sys
import traceback

SPEC_FILE = "spec.json"
SOLUTION_FILE = "solution.py"


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException so that `except Exception` in the candidate lets it through)."""


def on_alarm(signum, frame):
    raise TestTimeout()


def limit_of(exc: BaseException) -> str | None:
    """Which resource limit an exception shows, or None."""
    if isinstance(exc, TestTimeout):
        return "test_time"
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, RecursionError):
        return "recursion"
    if isinstance(exc, OSError):
        return {
            errno.EAGAIN: "processes",
            errno.EFBIG: "file_size",
            errno.EMFILE: "open_files",
            errno.ENOMEM: "memory",
            errno.ENOSPC: "disk",
        }.get(exc.errno)
    return None


def describe(exc: BaseException) -> str:
    if isinstance(exc, TestTimeout):
        return "TestTimeout: the test ran longer than its time limit"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1000:]


class Reporter:
    def __init__(self, nonce: str):
        self.nonce = nonce
        self.fd = os.dup(1)  # taken before the candidate's code runs
        self.pid = os.getpid()

    def send(self, **event) -> None:
        if os.getpid() != self.pid:  # a process the candidate forked came back into the harness: stop it
            os._exit(0)
        line = f"\n{self.nonce} {json.dumps(event, allow_nan=False)}\n".encode()
        while line:
            line = line[os.write(self.fd, line) :]


def run_test(function, test: dict, timeout_s: float, reporter: Reporter, index: int) -> None:
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        value = function(*test.get("args", []), **test.get("kwargs", {}))
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            reporter.send(
                event="test",
                index=index,
                ok=False,
                error=f"returned a {type(value).__name__}, which is not JSON-serializable",
                limit=None,
            )
            return
        reporter.send(event="test", index=index, ok=True, value=value)
    except BaseException as exc:  # everything the candidate raises is its test's failure
        signal.setitimer(signal.ITIMER_REAL, 0)
        reporter.send(event="test", index=index, ok=False, error=describe(exc), limit=limit_of(exc))


def main() -> None:
    with open(SPEC_FILE) as f:
        spec = json.load(f)
    reporter = Reporter(spec["nonce"])
    sys.stdout = sys.stderr  # the candidate's prints
    signal.signal(signal.SIGALRM, on_alarm)
    timeout_s = float(spec["test_timeout_s"])
    namespace = {"__name__": "solution", "__file__": SOLUTION_FILE}
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with open(SOLUTION_FILE) as f:
            code = compile(f.read(), SOLUTION_FILE, "exec")
        exec(code, namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        kind = "syntax_error" if isinstance(exc, SyntaxError) else "load_error"
        reporter.send(event="load_error", kind=kind, error=describe(exc), limit=limit_of(exc))
        return
    function = namespace.get(spec["entry_point"])
    if not callable(function):
        reporter.send(
            event="load_error",
            kind="missing_function",
            error=f"no function named {spec['entry_point']!r} is defined",
            limit=None,
        )
        return
    reporter.send(event="loaded")
    for index, test in enumerate(spec["tests"]):
        run_test(function, test, timeout_s, reporter, index)
    reporter.send(event="done")


if __name__ == "__main__":
    main()
