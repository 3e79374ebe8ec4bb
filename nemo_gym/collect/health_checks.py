"""The rollout health checks of one rollout record (`digest`): NeMo Gym 0.7.0's check registry and rules (its
`gym eval health-check`, `nemo_gym.health.checks`), over the record's `ng_trajectory` capture record
(`nemo_gym.env.capture_record`). `nemo_gym.collect.health` runs them over files and adds the task checks.

A check reads some evidence (`Check.reads`); when the record lacks it the check is *unobserved* for that rollout,
never passed. A check *finds* problems (`Finding`s); a rollout with a finding is unhealthy, else one with an
unobserved check is unobserved, else healthy. The checks of one rollout:

- `record_unreadable`: the line is not a JSON object, or its `ng_trajectory` does not validate;
- `rollout_missing_agent_turns`: no turn with a message, a tool call or a model call reference;
- `agent_turn_hollow`: a turn with neither message (or reasoning) nor tool call;
- `rollout_ended_on_failed_model_call`: a model server's own last call in the rollout (by start time) failed
  (status >= 400, an error category, or a failed, errored or cancelled answer);
- `model_call_zero_completion_tokens`, `model_call_missing_token_counts`, `model_call_failed`,
  `model_call_runaway_generation` (stopped on length with no content): over the model calls the invocations and turns
  own (their references resolve to exactly one call);
- `trajectory_capture_mismatch`: a reference that resolves to no call or to several, or a gap that says so;
- `rollout_token_count_mismatch`: the response's `usage` against the sum over the calls the turns reference;
- `check_execution_error`: a check that raised (it is then unobserved too); `rollout_duplicate_identity` is decided
  over the whole run (`nemo_gym.collect.health`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from nemo_gym.collect.health_evidence import (
    Evidence,
    answer_has_content,
    by_model,
    failed,
    last_failed_call,
    ref_key,
    succeeded,
    token_count,
    usage_tokens,
)
from nemo_gym.common.jsonl import NG_TRAJECTORY_KEY, ROLLOUT_ID_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym.env.capture_record import TrajectoryRecord

__all__ = ["CHECKS", "Check", "Digest", "Line", "digest", "known_checks", "subject_of"]

Verdict = Literal["healthy", "unhealthy", "unobserved"]


@dataclass(frozen=True)
class Check:
    id: str
    scope: Literal["rollout", "task"]
    reads: frozenset[str]


def _check(check_id: str, scope: Literal["rollout", "task"], *reads: str) -> Check:
    return Check(check_id, scope, frozenset(reads))


# 0.7.0's registry, in its order (the order of the summary's keys)
CHECKS = (
    _check("check_execution_error", "rollout", "record"),
    _check("record_unreadable", "rollout", "record"),
    _check("rollout_duplicate_identity", "rollout", "record"),
    _check("rollout_missing_agent_turns", "rollout", "record", "trajectory", "agent_turns"),
    _check("rollout_ended_on_failed_model_call", "rollout", "record", "trajectory", "observed_model_calls"),
    _check("agent_turn_hollow", "rollout", "record", "trajectory", "agent_turns"),
    _check("model_call_zero_completion_tokens", "rollout", "record", "trajectory", "owned_model_calls"),
    _check("model_call_missing_token_counts", "rollout", "record", "trajectory", "owned_model_calls"),
    _check("trajectory_capture_mismatch", "rollout", "record", "trajectory", "owned_model_calls"),
    _check("model_call_failed", "rollout", "record", "trajectory", "owned_model_calls"),
    _check("rollout_token_count_mismatch", "rollout", "record", "trajectory", "bound_calls"),
    _check("model_call_runaway_generation", "rollout", "record", "trajectory", "owned_model_calls"),
    _check("task_consistently_unhealthy", "task", "repeat_verdicts"),
    _check("task_no_successful_model_calls", "task", "repeat_digests"),
)
ROLLOUT_CHECKS = tuple(check for check in CHECKS if check.scope == "rollout")
# gaps that say the model calls were not all captured, and those that say a reference did not resolve
_CONTRADICTIONS = {
    "model_call_reference_unmatched": "missing_captured_call",
    "model_call_reference_ambiguous": "duplicated_captured_call",
    "model_call_reference_conflict": "conflicting_call_ownership",
}
_LENGTH_LIMITS = frozenset({"length", "max_output_tokens", "max_tokens"})


def known_checks(checks: Sequence[str] | str | None) -> frozenset[str]:
    """Check ids from a list or a comma-separated string (blanks dropped).

    Raises:
        ValueError: an id that is no check's, naming it.
    """
    if checks is None:
        return frozenset()
    names = {name.strip() for name in (checks.split(",") if isinstance(checks, str) else checks) if name.strip()}
    unknown = sorted(names - {check.id for check in CHECKS})
    if unknown:
        raise ValueError(f"Unknown rollout health check(s): {', '.join(unknown)}")
    return frozenset(names)


def subject_of(task_index: Any, rollout_index: Any = None) -> dict[str, Any]:
    return {TASK_INDEX_KEY: task_index} | ({} if rollout_index is None else {ROLLOUT_INDEX_KEY: rollout_index})


def finding(check: str, subject: dict[str, Any], detail: dict[str, Any], locator: dict | None = None) -> dict:
    return {"check": check, "subject": subject, "locator": locator, "detail": detail}


def _locator(call: dict[str, Any], fallback: Any) -> dict[str, str]:
    return {"call_id": str(call.get("model_call_id") or call.get("response_id") or fallback)}


def _missing_agent_turns(ev: Evidence) -> list[dict]:
    if any(message or tools or refs for _, message, tools, refs in ev.steps()):
        return []
    return [finding("rollout_missing_agent_turns", ev.subject, {"reason": "no agent turn with model activity"})]


def _hollow_turns(ev: Evidence) -> list[dict]:
    detail = {"reason": "agent turn has no message or tool calls"}
    return [
        finding("agent_turn_hollow", ev.subject, detail, locator)
        for locator, message, tools, _ in ev.steps()
        if not message and not tools
    ]


def _ended_on_failed_call(ev: Evidence) -> list[dict]:
    findings = []
    for model, chain in by_model(ev.calls).items():
        if (last := last_failed_call(chain)) is None:
            continue
        detail = {
            "model_ref": "/".join(str(part) for part in model) if model else None,
            "status": last.get("status_code"),
            "error_category": last.get("error_category"),
            "observed_calls": len(chain),
            "successful_calls": sum(1 for call in chain if succeeded(call)),
        }
        findings.append(
            finding("rollout_ended_on_failed_model_call", ev.subject, detail, _locator(last, last.get("call_index")))
        )
    return findings


def _zero_completion(ev: Evidence) -> list[dict]:
    return [
        finding("model_call_zero_completion_tokens", ev.subject, {"completion_tokens": 0}, _locator(call, position))
        for position, call in enumerate(ev.owned.matched)
        if call.get("tokens_out") == 0
    ]


def _missing_token_counts(ev: Evidence) -> list[dict]:
    counts = (("prompt_tokens", "tokens_in"), ("completion_tokens", "tokens_out"))
    return [
        finding(
            "model_call_missing_token_counts",
            ev.subject,
            {"missing": [name for name, key in counts if call.get(key) is None]},
            _locator(call, position),
        )
        for position, call in enumerate(ev.owned.matched)
        if call.get("tokens_in") is None or call.get("tokens_out") is None
    ]


def _capture_mismatch(ev: Evidence) -> list[dict]:
    kinds = [(key, "missing_captured_call", {}) for key in ev.owned.missing]
    kinds += [(key, "duplicated_captured_call", {"count": count}) for key, count in ev.owned.duplicated]
    findings, seen = [], set()
    for key, kind, extra in kinds:
        locator = key.split(":")[-1]
        if (kind, locator) not in seen:
            seen.add((kind, locator))
            detail = {"kind": kind, **extra}
            findings.append(finding("trajectory_capture_mismatch", ev.subject, detail, {"call_id": locator}))
    for gap in _contradictions(ev.trajectory):
        kind, locator = _CONTRADICTIONS[gap["code"]], str(gap.get("detail") or "unknown").split(":")[-1]
        if (kind, locator) not in seen:
            detail = {"kind": kind, "observation_gap": gap["code"], "invocation_id": gap.get("invocation_id")}
            findings.append(finding("trajectory_capture_mismatch", ev.subject, detail, {"call_id": locator}))
    return findings


def _contradictions(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    gaps = trajectory.get("gaps") or []
    return [gap for gap in gaps if isinstance(gap, dict) and gap.get("code") in _CONTRADICTIONS]


def _failed_calls(ev: Evidence) -> list[dict]:
    indexes = [call["call_index"] for call in ev.owned.matched if type(call.get("call_index")) is int]
    last = max(indexes, default=None)
    return [
        finding(
            "model_call_failed",
            ev.subject,
            {
                "status": call.get("status_code"),
                "error_category": call.get("error_category"),
                "terminal": ev.owned.complete and last is not None and call.get("call_index") == last,
            },
            _locator(call, position),
        )
        for position, call in enumerate(ev.owned.matched)
        if failed(call)
    ]


def _token_count_mismatch(ev: Evidence) -> list[dict]:
    prompt, completion = usage_tokens(ev.record)
    calls = ev.turn_bindings.matched
    captured = sum(token_count(c, "tokens_in") for c in calls), sum(token_count(c, "tokens_out") for c in calls)
    if prompt is None or completion is None or (prompt, completion) == captured:
        return []
    detail = {
        "transcript_prompt": prompt,
        "transcript_completion": completion,
        "capture_prompt": captured[0],
        "capture_completion": captured[1],
    }
    return [finding("rollout_token_count_mismatch", ev.subject, detail)]


def _runaway(ev: Evidence) -> list[dict]:
    return [
        finding(
            "model_call_runaway_generation", ev.subject, {"finish_reason": call.get("finish_reason")}, _locator(call, i)
        )
        for i, call in enumerate(ev.owned.matched)
        if call.get("finish_reason") in _LENGTH_LIMITS and not answer_has_content(call.get("response"))
    ]


_RUN: dict[str, Callable[[Evidence], list[dict]]] = {
    "rollout_missing_agent_turns": _missing_agent_turns,
    "rollout_ended_on_failed_model_call": _ended_on_failed_call,
    "agent_turn_hollow": _hollow_turns,
    "model_call_zero_completion_tokens": _zero_completion,
    "model_call_missing_token_counts": _missing_token_counts,
    "trajectory_capture_mismatch": _capture_mismatch,
    "model_call_failed": _failed_calls,
    "rollout_token_count_mismatch": _token_count_mismatch,
    "model_call_runaway_generation": _runaway,
}


def _unobservable(check: Check, ev: Evidence) -> bool:
    """Whether the record lacks what `check` reads (then it is unobserved for this rollout, not run)."""
    reads = check.reads
    if ("trajectory" in reads and not ev.observed) or ("agent_turns" in reads and not ev.turns_observed):
        return True
    if "observed_model_calls" in reads and not (ev.calls_observed and ev.calls):
        return True
    bindings = ev.owned if "owned_model_calls" in reads else ev.turn_bindings
    if reads & {"owned_model_calls", "bound_calls"}:
        if not ev.calls_observed:
            return True
        if check.id == "trajectory_capture_mismatch":
            if not (bindings.references or _contradictions(ev.trajectory)):
                return True
        elif not bindings.matched:
            return True
    if check.id == "rollout_token_count_mismatch":
        counted = all(c.get("tokens_in") is not None and c.get("tokens_out") is not None for c in bindings.matched)
        return not (ev.turn_scope_complete and bindings.complete and None not in usage_tokens(ev.record) and counted)
    if check.id == "model_call_runaway_generation":
        return any(c.get("finish_reason") in _LENGTH_LIMITS and c.get("response") is None for c in bindings.matched)
    return False


@dataclass(frozen=True)
class Line:
    """One non-blank line of a rollouts file: its file, 1-based line number, position among all files' lines
    (`ordinal`), which file of the run (`source_index`), and where it is (`offset` and `length`, bytes; a worker
    reads it there, so a large file is never held whole)."""

    path: str
    line_number: int
    ordinal: int
    source_index: int
    offset: int
    length: int

    def text(self) -> bytes:
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            return handle.read(self.length)


@dataclass
class Digest:
    """One rollout's verdict, findings and unobserved checks, with the counts the run summary adds up."""

    task_index: Any
    rollout_index: Any
    stage_index: Any
    rollout_id: str
    verdict: Verdict
    findings: list[dict[str, Any]]
    unobserved: list[str]
    capture_observed: bool = False
    policy_calls_observed: bool = False
    model_calls: int = 0
    successful_model_calls: int = 0
    model_call_errors: int = 0
    errors_by_status: dict[str, int] = field(default_factory=dict)
    ended_on_error: bool = False
    duplicated_calls: int = 0
    transcript_prompt_tokens: int = 0
    transcript_completion_tokens: int = 0
    capture_prompt_tokens: int = 0
    capture_completion_tokens: int = 0


def _parse(line: Line) -> tuple[dict[str, Any], str | None]:
    try:
        record = orjson.loads(line.text().strip())
    except orjson.JSONDecodeError as exc:
        return {}, type(exc).__name__
    return (record, None) if isinstance(record, dict) else ({}, "ValueError")


def _canonical(record: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The record's `ng_trajectory` validated and normalized (None without one), or the error that refused it."""
    raw = record.get(NG_TRAJECTORY_KEY)
    if raw is None:
        return None, None
    try:
        return TrajectoryRecord.model_validate(raw).model_dump(mode="json"), None
    except Exception as exc:  # a record that does not validate is unreadable evidence, whatever refused it
        return None, type(exc).__name__


def _identity(call: dict[str, Any]) -> str | None:
    """A call's identity as a reference would name it (`ref_key`), else by its response id alone."""
    return ref_key(call) or (f"response::{call['response_id']}" if call.get("response_id") else None)


def _run_checks(
    ev: Evidence, line: Line, parse_error: str | None, trajectory_error: str | None, ignored: frozenset[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rollout checks of one record but `ignored`: their findings and the checks left unobserved. An unreadable
    line is a `record_unreadable` finding with every other check unobserved; a capture record that does not validate
    is one too (the checks that read it are then unobserved)."""
    subject = ev.subject
    findings: list[dict[str, Any]] = []
    unobserved: list[str] = []
    for check in ROLLOUT_CHECKS:
        if check.id in ignored:
            continue
        if parse_error or (trajectory_error and check.id == "record_unreadable"):
            if check.id != "record_unreadable":
                unobserved.append(check.id)
            elif parse_error:
                locator = {"source_file": line.path, "line": line.line_number}
                detail = {"reason": "rollout record is unreadable", "error": parse_error}
                findings.append(finding("record_unreadable", subject, detail, locator))
            else:
                detail = {"reason": "canonical trajectory is unreadable", "error": trajectory_error}
                findings.append(finding("record_unreadable", subject, detail))
            continue
        if _unobservable(check, ev):
            unobserved.append(check.id)
            continue
        try:
            findings.extend(_RUN[check.id](ev) if check.id in _RUN else [])
        except Exception as exc:  # a check that raised observed nothing; said as a finding, never as healthy
            unobserved.append(check.id)
            if "check_execution_error" not in ignored:
                detail = {"reason": "check raised an unexpected exception", "failed_check": check.id}
                findings.append(finding("check_execution_error", subject, {**detail, "error": type(exc).__name__}))
    return findings, unobserved


def digest(line: Line, ignored: frozenset[str]) -> Digest:
    """The verdict of one rollout line (module docstring), the checks in `ignored` left out."""
    record, parse_error = _parse(line)
    unreadable = f"__unreadable_record__:input-{line.source_index}:line-{line.line_number}"
    task_index = record.get(TASK_INDEX_KEY, unreadable if parse_error else line.ordinal)
    rollout_index = record.get(ROLLOUT_INDEX_KEY, 0)
    raw = record.get(NG_TRAJECTORY_KEY)
    rollout_id = record.get(ROLLOUT_ID_KEY) or (raw.get("rollout_id") if isinstance(raw, dict) else None)
    subject = subject_of(task_index, rollout_index)
    trajectory, trajectory_error = (None, None) if parse_error else _canonical(record)
    ev = Evidence.of(record, subject, trajectory)
    findings, unobserved = _run_checks(ev, line, parse_error, trajectory_error, ignored)
    failures = [call for call in ev.calls if failed(call)]
    identities = Counter(identity for call in ev.calls if (identity := _identity(call)) is not None)
    prompt, completion = usage_tokens(record)
    return Digest(
        task_index,
        rollout_index,
        record.get("stage_index"),
        str(rollout_id or f"{task_index}-{rollout_index}"),
        "unhealthy" if findings else "unobserved" if unobserved else "healthy",
        findings,
        unobserved,
        capture_observed=bool(ev.calls),
        policy_calls_observed=ev.turn_scope_complete and ev.turn_bindings.complete,
        model_calls=len(ev.calls),
        successful_model_calls=sum(succeeded(call) for call in ev.turn_bindings.matched),
        model_call_errors=len(failures),
        errors_by_status=dict(
            Counter(str(c["status_code"] if c.get("status_code") is not None else "unknown") for c in failures)
        ),
        ended_on_error=any(last_failed_call(chain) is not None for chain in by_model(ev.calls).values()),
        duplicated_calls=sum(count - 1 for count in identities.values() if count > 1),
        transcript_prompt_tokens=prompt or 0,
        transcript_completion_tokens=completion or 0,
        capture_prompt_tokens=sum(token_count(call, "tokens_in") for call in ev.calls),
        capture_completion_tokens=sum(token_count(call, "tokens_out") for call in ev.calls),
    )
