"""Grading of a code answer: extract the code, run the tests in the sandbox, compare the returned values.

The sandbox runs `harness.py`, which calls the candidate's function on each test's arguments and reports the
returned values; the comparison with the expected values happens here, outside the sandbox (see harness.py
for why that makes forged results worthless).
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from markdown_it import MarkdownIt

from nemo_gym.env.answers import last_assistant_text  # re-exported: app.py reads it from here

if TYPE_CHECKING:  # sandbox.py is a sibling module, loaded by app.py under a unique name
    from sandbox import Sandbox, SandboxResult

__all__ = ["Grade", "TestOutcome", "extract_code", "last_assistant_text", "values_equal", "grade", "parse_events"]

HARNESS_SOURCE = (Path(__file__).resolve().parent / "harness.py").read_text()
PYTHON_FENCE_LANGS = {"python", "py", "python3", "py3"}
_MARKDOWN = MarkdownIt("commonmark")


@dataclass
class TestOutcome:
    """One test: passed, or why not (`error`; `limit` when a resource limit stopped it)."""

    index: int
    passed: bool
    error: str | None = None
    limit: str | None = None


@dataclass
class Grade:
    """The verdict on one answer. `reward` = passed / total, in [0, 1]."""

    tests: list[TestOutcome]
    failure_reason: str | None
    sandbox: SandboxResult | None = None
    load_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def reward(self) -> float:
        return self.passed / len(self.tests) if self.tests else 0.0


def extract_code(text: str) -> str:
    """The code of an answer: the last fenced block tagged python (`python`, `py`, `python3`), else the last
    untagged fenced block, else the whole text (CommonMark fences, via markdown-it-py; an unclosed fence runs
    to the end of the text)."""
    fences = [t for t in _MARKDOWN.parse(text) if t.type == "fence"]
    language = [t for t in fences if (t.info.split() or [""])[0].lower() in PYTHON_FENCE_LANGS]
    untagged = [t for t in fences if not t.info.strip()]
    chosen = (language or untagged or [None])[-1]
    return chosen.content if chosen is not None else text


def values_equal(actual: Any, expected: Any, rel_tol: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """JSON values compared: bools and strings exactly, numbers numerically (floats within the tolerances),
    lists item by item, objects key by key."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if isinstance(expected, int) and isinstance(actual, int):
            return actual == expected
        return math.isclose(actual, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(map(values_equal, actual, expected))
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(values_equal(actual[k], expected[k]) for k in expected)
        )
    return type(actual) is type(expected) and actual == expected


def parse_events(stdout: str, nonce: str) -> list[dict[str, Any]]:
    """The harness's events: JSON objects after `<nonce> ` on a line of stdout (other lines ignored)."""
    marker = nonce + " "
    events = []
    for line in stdout.splitlines():
        start = line.find(marker)
        if start == -1:
            continue
        try:
            event = json.loads(line[start + len(marker) :])
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def grade(sandbox: Sandbox, code: str, entry_point: str, tests: list[dict[str, Any]], test_timeout_s: float) -> Grade:
    """Run `code`'s `entry_point` on each test (`{"args", "kwargs", "expected"}`) in a fresh sandbox.

    Raises:
        SandboxUnavailableError: the sandbox cannot run here (an infrastructure failure).
    """
    nonce = secrets.token_hex(16)
    spec = {
        "nonce": nonce,
        "entry_point": entry_point,
        "test_timeout_s": test_timeout_s,
        "tests": [{"args": t.get("args", []), "kwargs": t.get("kwargs", {})} for t in tests],
    }
    result = sandbox.run_python(
        "harness.py", {"harness.py": HARNESS_SOURCE, "solution.py": code, "spec.json": json.dumps(spec)}
    )
    events = parse_events(result.stdout, nonce)
    load_error = next((e for e in events if e.get("event") == "load_error"), None)
    reported: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("event") == "test" and isinstance(event.get("index"), int):
            reported.setdefault(event["index"], event)
    outcomes = [outcome(i, reported.get(i), test["expected"], result, load_error) for i, test in enumerate(tests)]
    reason = failure_reason(outcomes, result, load_error, events)
    return Grade(outcomes, reason, result, load_error=(load_error or {}).get("error"))


def outcome(
    index: int, event: dict[str, Any] | None, expected: Any, result: SandboxResult, load_error: dict | None
) -> TestOutcome:
    if event is None:
        why = "not run: the code did not load" if load_error else f"no result (sandbox {result.killed_by or 'exited'})"
        return TestOutcome(index, False, why, None)
    if not event.get("ok"):
        return TestOutcome(index, False, str(event.get("error"))[:1000], event.get("limit"))
    if values_equal(event.get("value"), expected):
        return TestOutcome(index, True)
    return TestOutcome(index, False, f"wrong answer: returned {json.dumps(event.get('value'))[:200]}", None)


SANDBOX_KILL_REASONS = {
    "wall_time": "timeout",
    "output_limit": "output_limit",
    "cpu_time": "cpu_time_limit",
    "signal": "killed_by_signal",
}


def failure_reason(
    outcomes: list[TestOutcome], result: SandboxResult, load_error: dict | None, events: list[dict]
) -> str | None:
    """Why the reward is below 1 (None when every test passed). Most telling first: a sandbox kill, a load
    failure, a resource limit met by a test, then a wrong answer or an error."""
    if all(t.passed for t in outcomes):
        return None
    if result.killed_by:
        return SANDBOX_KILL_REASONS[result.killed_by]
    if load_error:
        limit = load_error.get("limit")
        return f"{limit}_limit" if limit else str(load_error.get("kind") or "load_error")
    limit = next((t.limit for t in outcomes if t.limit), None)
    if limit:
        return f"{limit}_limit"
    if not any(e.get("event") == "done" for e in events):
        return "exited_early"
    return "tests_failed"
