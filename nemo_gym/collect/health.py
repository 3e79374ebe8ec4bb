"""`ng_health_check` (NeMo Gym 0.7.0's `gym eval health-check RUN_DIR`): the rollout health checks of a collection.

Each rollout line gets a verdict from its `ng_trajectory` capture record (`ng_collect_rollouts
+observability_enabled=true` writes one): `healthy`, `unhealthy` (a check found a problem) or `unobserved` (a check
lacked its evidence, e.g. a rollout collected without capture); the checks and their rules are 0.7.0's
(`nemo_gym.collect.health_checks`). Over the run: two lines of one (stage, task, rollout) are both unhealthy
(`rollout_duplicate_identity`); a task whose computable repeats (at least two) are all unhealthy is
`task_consistently_unhealthy`, and one whose repeats' policy calls were all observed and none succeeded is
`task_no_successful_model_calls`.

Two reports, as 0.7.0 writes them, into `+output_dirpath` (default: the rollouts' folder): `quality_summary.json`
(per check: rollouts evaluated, unobserved, ignored; verdict counts; findings by check; model call errors, replayed
calls, token totals; per task: repeats by verdict and its task findings) and `rollout_verdicts.jsonl` (per rollout,
in task and rollout order: its verdict, findings and unobserved checks), and beside them
`rollout_verdicts.sources.json`, which 0.7.0 does not write: the rollouts files the verdicts are of (name, path, bytes,
sha256) and the verdicts file's sha256, so that a reader (`ng_viewer`) shows a rollout's verdict only when the
verdicts are of its file as it is now (`verdict_sources`); a check that replaces another file's verdicts says so. It
prints
`Rollout health: N checked, H healthy, U unhealthy, O unobserved` (`+json=true`: the summary as JSON). A bad line
is a finding (`record_unreadable`, naming the file and line), never a crash; the exit status is 0 as in 0.7.0.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.health_checks import CHECKS, ROLLOUT_CHECKS, Digest, Line, digest, known_checks, subject_of
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, replace_atomically

__all__ = [
    "HealthCheckOptions",
    "HealthReport",
    "file_source",
    "health_check_main",
    "run_health_checks",
    "verdict_sources",
    "VERDICTS",
]

SUMMARY_FILE = "quality_summary.json"
VERDICTS_FILE = "rollout_verdicts.jsonl"
SOURCES_FILE = "rollout_verdicts.sources.json"
VERDICTS = ("healthy", "unhealthy", "unobserved")  # a rollout's, as 0.7.0 names them
TASK_CHECKS = [check.id for check in CHECKS if check.scope == "task"]


class HealthCheckOptions(BaseModel):
    """Parameters of `ng_health_check` (0.7.0's `gym eval health-check` flags: RUN_DIR, --rollouts-file, --workers,
    --ignore-checks, --json)."""

    model_config = ConfigDict(extra="forbid")
    rollouts_jsonl_fpath: str | list[str] = Field(description="rollouts JSONL (ng_collect_rollouts' output), or a list")
    output_dirpath: str | None = Field(None, description="folder for the two reports (default: the rollouts' folder)")
    workers: int | None = Field(None, ge=1, description="processes checking lines (default: CPUs, at most 8)")
    ignored_checks: list[str] | str = Field(
        default_factory=list, description="check ids left out of the verdicts (a list, or comma-separated)"
    )
    json_output: bool = Field(False, alias="json", description="print the summary as JSON")


@dataclass
class HealthReport:
    """A health check's result: the summary (as written), each rollout's digest, where the reports are."""

    summary: dict[str, Any]
    rollouts: list[Digest]
    summary_path: Path
    verdicts_path: Path
    replaced: list[str] = field(default_factory=list)  # the other rollouts files whose verdicts these replaced

    def text(self) -> str:
        verdicts, ignored = self.summary["run"]["verdicts"], self.summary["run"]["ignored_checks"]
        note = f" (ignored: {', '.join(ignored)})" if ignored else ""
        artifacts = self.summary["run"]["artifacts"]
        hint = ""
        if artifacts["records"] and not artifacts["captures"]:
            hint = (
                "\nNo rollout's ng_trajectory capture record holds a model call (rollouts carry one when collected "
                "with +observability_enabled=true; simple_agent and gymnasium_agent write it)"
            )
        if self.replaced:
            hint += (
                f"\nReplaced the verdicts of {', '.join(self.replaced)} in {self.verdicts_path.parent} (a folder holds "
                "one check's verdicts: to keep both, give each rollouts file a folder of its own)"
            )
        return (
            f"Rollout health: {sum(verdicts.values())} checked, {verdicts['healthy']} healthy, "
            f"{verdicts['unhealthy']} unhealthy, {verdicts['unobserved']} unobserved{note}{hint}\n"
            f"Quality summary: {self.summary_path}"
        )


def _lines(paths: Sequence[Path]) -> list[Line]:
    lines, ordinal = [], 0
    for source_index, path in enumerate(paths):
        with path.open("rb") as handle:
            offset = 0
            for line_number, text in enumerate(handle, start=1):
                if text.strip():
                    lines.append(Line(str(path), line_number, ordinal, source_index, offset, len(text)))
                    ordinal += 1
                offset += len(text)
    return lines


def _digest_one(item: tuple[Line, frozenset[str]]) -> Digest:
    return digest(*item)


def _digests(lines: list[Line], ignored: frozenset[str], workers: int) -> list[Digest]:
    """Each line's digest, in a pool of `workers` processes when there is more than one line and worker (serially
    when the pool breaks)."""
    items = [(line, ignored) for line in lines]
    if len(items) > 1 and workers > 1:
        chunk = max(1, min(128, -(-len(items) // (workers * 4))))
        try:
            with ProcessPoolExecutor(workers) as pool:
                return list(pool.map(_digest_one, items, chunksize=chunk))
        except (BrokenProcessPool, OSError):
            pass
    return [_digest_one(item) for item in items]


def _mark_duplicates(digests: list[Digest], ignored: frozenset[str]) -> None:
    if "rollout_duplicate_identity" in ignored:
        return
    copies: dict[tuple[Any, Any, Any], list[Digest]] = defaultdict(list)
    for d in digests:
        copies[(d.stage_index, d.task_index, d.rollout_index)].append(d)
    for group in copies.values():
        for d in group if len(group) > 1 else []:
            subject = subject_of(d.task_index, d.rollout_index)
            d.findings.append(
                {
                    "check": "rollout_duplicate_identity",
                    "subject": subject,
                    "locator": None,
                    "detail": {"duplicate_count": len(group)},
                }
            )
            d.verdict = "unhealthy"


@dataclass
class _Repeat:
    """One repeat of a task (its lines of one rollout index folded: a verdict they disagree on is unobserved)."""

    verdict: str
    policy_calls_observed: bool
    successful_model_calls: int


@dataclass
class _Tasks:
    """The task checks over every task's repeats: findings per task and each check's coverage."""

    repeats: dict[Any, list[_Repeat]]
    ignored: frozenset[str]
    findings: dict[Any, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    coverage: dict[str, dict[str, int]] = field(
        default_factory=lambda: {check: {"evaluated": 0, "unobserved": 0, "ignored": 0} for check in TASK_CHECKS}
    )

    @classmethod
    def of(cls, digests: list[Digest], ignored: frozenset[str]) -> _Tasks:
        by_task: dict[Any, dict[Any, list[Digest]]] = defaultdict(lambda: defaultdict(list))
        for d in digests:
            by_task[d.task_index][d.rollout_index].append(d)
        repeats = {
            task: [
                _Repeat(
                    lines[0].verdict if len({d.verdict for d in lines}) == 1 else "unobserved",
                    all(d.policy_calls_observed for d in lines),
                    max(d.successful_model_calls for d in lines),
                )
                for lines in by_repeat.values()
            ]
            for task, by_repeat in by_task.items()
        }
        tasks = cls(repeats, ignored)
        for task, task_repeats in repeats.items():
            tasks._check(task, task_repeats)
        return tasks

    def _count(self, check: str, outcome: str) -> None:
        self.coverage[check][outcome] += 1

    def _check(self, task: Any, repeats: list[_Repeat]) -> None:
        subject = subject_of(task)
        if "task_consistently_unhealthy" in self.ignored:
            self._count("task_consistently_unhealthy", "ignored")
        elif len(computable := [r for r in repeats if r.verdict != "unobserved"]) >= 2:
            self._count("task_consistently_unhealthy", "evaluated")
            if all(r.verdict == "unhealthy" for r in computable):
                detail = {"computable_repeats": len(computable)}
                self.findings[task].append(
                    {"check": "task_consistently_unhealthy", "subject": subject, "locator": None, "detail": detail}
                )
        else:
            self._count("task_consistently_unhealthy", "unobserved")
        if "task_no_successful_model_calls" in self.ignored:
            self._count("task_no_successful_model_calls", "ignored")
        elif repeats and all(r.policy_calls_observed for r in repeats):
            self._count("task_no_successful_model_calls", "evaluated")
            if not any(r.successful_model_calls for r in repeats):
                detail = {"repeats": len(repeats)}
                self.findings[task].append(
                    {"check": "task_no_successful_model_calls", "subject": subject, "locator": None, "detail": detail}
                )
        else:
            self._count("task_no_successful_model_calls", "unobserved")


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) else (1, str(value))


def summarize(digests: list[Digest], ignored: frozenset[str]) -> dict[str, Any]:
    """The run's summary (`quality_summary.json`), from the rollouts' digests and the task checks."""
    tasks = _Tasks.of(digests, ignored)
    coverage = {check.id: {"evaluated": 0, "unobserved": 0, "ignored": 0} for check in CHECKS}
    for d in digests:
        for check in ROLLOUT_CHECKS:
            outcome = "ignored" if check.id in ignored else "unobserved" if check.id in d.unobserved else "evaluated"
            coverage[check.id][outcome] += 1
    coverage.update(tasks.coverage)
    issues = Counter(f["check"] for d in digests for f in d.findings)
    issues.update(f["check"] for found in tasks.findings.values() for f in found)
    verdicts, statuses = Counter(d.verdict for d in digests), Counter()
    for d in digests:
        statuses.update(d.errors_by_status)
    per_task = {}
    for task in sorted(tasks.repeats, key=lambda value: (isinstance(value, str), str(value))):
        counted = Counter(r.verdict for r in tasks.repeats[task])
        per_task[str(task)] = {"repeats": len(tasks.repeats[task])} | {v: counted[v] for v in VERDICTS}
        per_task[str(task)]["flags"] = [f["check"] for f in tasks.findings[task]]
    errors = {
        "total": sum(d.model_call_errors for d in digests),
        "by_status": dict(sorted(statuses.items())),
        "rollouts_affected": sum(bool(d.model_call_errors) for d in digests),
        "ended_on_error": sum(d.ended_on_error for d in digests),
    }
    tokens = {
        "prompt": sum(d.transcript_prompt_tokens for d in digests),
        "completion": sum(d.transcript_completion_tokens for d in digests),
        "capture_prompt": sum(d.capture_prompt_tokens for d in digests),
        "capture_completion": sum(d.capture_completion_tokens for d in digests),
    }
    replayed = {
        "replayed": sum(d.duplicated_calls for d in digests),
        "rollouts": sum(bool(d.duplicated_calls) for d in digests),
    }
    artifacts = {"records": len(digests), "captures": sum(d.capture_observed for d in digests), "coverage": coverage}
    run = {
        "ignored_checks": sorted(ignored),
        "artifacts": artifacts,
        "verdicts": {v: verdicts[v] for v in VERDICTS},
        "issues": {check.id: issues[check.id] for check in CHECKS},
        "stats": {"model_call_errors": errors, "duplicated_calls": replayed, "tokens": tokens},
    }
    return {"run": run, "tasks": per_task}


def _verdict_rows(digests: list[Digest]) -> bytes:
    rows = []
    for d in sorted(digests, key=lambda d: (_order(d.task_index), _order(d.rollout_index), _order(d.stage_index))):
        # as 0.7.0 writes a finding: no subject, no locator when it has none (a detail's nulls are kept)
        findings = [{k: v for k, v in f.items() if k != "subject" and v is not None} for f in d.findings]
        row = {TASK_INDEX_KEY: d.task_index, ROLLOUT_INDEX_KEY: d.rollout_index, "rollout_id": d.rollout_id}
        row |= {"verdict": d.verdict, "findings": findings, "unobserved": d.unobserved}
        if d.stage_index is not None:
            row["stage_index"] = d.stage_index
        rows.append(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    return b"".join(rows)


def run_health_checks(
    paths: Path | Sequence[Path],
    output_dir: Path | None = None,
    *,
    workers: int | None = None,
    ignored_checks: Sequence[str] | str = (),
) -> HealthReport:
    """Check every rollout line of `paths` and write the two reports into `output_dir` (default: the first file's
    folder); see the module docstring.

    Raises:
        ConfigError: no file given, a file that does not exist, an unknown check id, `workers` below 1.
    """
    files = [paths] if isinstance(paths, Path) else list(paths)
    if not files:
        raise ConfigError("+rollouts_jsonl_fpath: give at least one rollouts file")
    for path in files:
        if not path.is_file():
            raise ConfigError(f"+rollouts_jsonl_fpath: no such file: {path}")
    try:
        ignored = known_checks(ignored_checks)
    except ValueError as exc:
        raise ConfigError(f"+ignored_checks: {exc}") from None
    if workers is not None and workers < 1:
        raise ConfigError("+workers: at least 1")
    digests = _digests(_lines(files), ignored, workers or min(os.cpu_count() or 1, 8))
    _mark_duplicates(digests, ignored)
    summary = summarize(digests, ignored)
    folder = output_dir or files[0].parent
    folder.mkdir(parents=True, exist_ok=True)
    sources = [file_source(path) for path in files]
    before = verdict_sources(folder)
    mine = {source["sha256"] for source in sources} | {source["path"] for source in sources}
    replaced = [source["name"] for source in before or [] if not {source["sha256"], source["path"]} & mine]
    replace_atomically(folder / SUMMARY_FILE, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    verdicts = _verdict_rows(digests)
    replace_atomically(folder / VERDICTS_FILE, verdicts)
    record = {"rollouts": sources, "verdicts_sha256": hashlib.sha256(verdicts).hexdigest()}
    replace_atomically(folder / SOURCES_FILE, orjson.dumps(record, option=orjson.OPT_INDENT_2))
    return HealthReport(summary, digests, folder / SUMMARY_FILE, folder / VERDICTS_FILE, replaced)


def file_source(path: Path) -> dict[str, Any]:
    """A rollouts file as a source of verdicts: its name, resolved path, size (bytes) and sha256 (of its content).

    Raises:
        OSError: the file cannot be read.
    """
    with path.open("rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return {"name": path.name, "path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha256}


def verdict_sources(folder: Path) -> list[dict[str, Any]] | None:
    """The rollouts files (`file_source`) that the `rollout_verdicts.jsonl` in `folder` is of, as the check that
    wrote it recorded them; None when nothing says so: no `rollout_verdicts.sources.json` (0.7.0's check, or none
    ran), one that does not parse, or one written for another verdicts file (its sha256 differs: a check that writes
    no sources, such as 0.7.0's, replaced the verdicts since)."""
    try:
        record = orjson.loads((folder / SOURCES_FILE).read_bytes())
        verdicts = (folder / VERDICTS_FILE).read_bytes()
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("verdicts_sha256") != hashlib.sha256(verdicts).hexdigest():
        return None
    sources = record.get("rollouts")
    keys = ("name", "path", "sha256")
    if not isinstance(sources, list) or not all(isinstance(s, dict) and all(k in s for k in keys) for s in sources):
        return None
    return sources


def health_check_main(options: HealthCheckOptions) -> int:
    """`ng_health_check`: check, print the verdict counts (or the summary as JSON). Returns 0."""
    paths = options.rollouts_jsonl_fpath
    files = [Path(p).expanduser() for p in ([paths] if isinstance(paths, str) else paths)]
    output = Path(options.output_dirpath).expanduser() if options.output_dirpath else None
    report = run_health_checks(files, output, workers=options.workers, ignored_checks=options.ignored_checks)
    print(orjson.dumps(report.summary).decode() if options.json_output else report.text())
    return 0
