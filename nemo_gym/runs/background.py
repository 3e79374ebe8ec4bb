"""Background runs: any `ng_*` command detached from the terminal, with a record to list, follow, stop and delete.

`detach(command, argv)` starts `python -m nemo_gym.runs.background <record dir> <command> <argv...>` in a new session
(its own process group, stdin from /dev/null, stdout and stderr to `<record dir>/output.log`) and returns at once.
That wrapper runs the command in-process (so the recorded pid is the command's own) and, when it returns, writes
`exit.json` with the exit status.

Records live in `$NEMO_GYM_HOME/train_runs/<run id>/` (folder mode 0700), one JSON file each, written atomically:
  run.json   id, command, pid, pgid, process_create_time, argv, cwd, output_dir, log, started (ISO 8601),
             started_at (unix s), status (the last known one: "running" at launch, the final one written by the
             wrapper when the command returns; the live status is derived, see below), extra
  exit.json  {"returncode", "finished_at"}, written by the wrapper when the command returns
  stop.json  {"save_model", "requested_at"}, written by `ng_runs stop` before it signals the process group

Status (`run_status`): `running` while the recorded process is alive (same pid and creation time, not a zombie);
afterwards `stopped` when a stop was requested or the exit status is 130/143 (SIGINT/SIGTERM), `finished` on exit
status 0, else `failed` (a non-zero exit status, or the process died without writing one, e.g. SIGKILL).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import psutil

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import write_json
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.common.paths import PathEscapeError, check_name, resolve_inside
from nemo_gym.config import commands
from nemo_gym.train.stopping import BACKGROUND_RUN_DIR_ENV, STOP_REQUEST_FILE

__all__ = [
    "RunStatus",
    "RunRecord",
    "background_runs_dir",
    "new_run_id",
    "detach",
    "load_record",
    "list_records",
    "run_status",
    "exit_info",
    "write_stop_request",
    "signal_run",
    "wait_until_ended",
]

RunStatus = Literal["running", "finished", "failed", "stopped"]
RECORD_FILE, EXIT_FILE, LOG_FILE = "run.json", "exit.json", "output.log"
_STOP_EXIT_STATUSES = {128 + signal.SIGINT, 128 + signal.SIGTERM}


def background_runs_dir() -> Path:
    """`$NEMO_GYM_HOME/train_runs`, created readable by its owner only (0700)."""
    path = nemo_gym_home() / "train_runs"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


@dataclasses.dataclass
class RunRecord:
    """What `run.json` holds about one background run."""

    id: str
    command: str
    argv: list[str]
    cwd: str
    log: str
    started: str
    started_at: float
    pid: int | None = None
    pgid: int | None = None
    process_create_time: float | None = None
    output_dir: str | None = None
    status: str = "running"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dir(self) -> Path:
        """`$NEMO_GYM_HOME/train_runs/<id>`. Raises PathEscapeError when the (file-supplied) id is not a plain name."""
        return resolve_inside(background_runs_dir(), check_name(self.id, what="run id"), what="run id")

    def save(self) -> None:
        write_json(self.dir / RECORD_FILE, dataclasses.asdict(self))


def new_run_id(command: str) -> str:
    """`<command>-YYYYMMDD-HHMMSS-xxxx` (UTC time, 4 random hex digits), e.g. `train-20261122-041500-ab12`."""
    return f"{command}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def detach(
    command: str, argv: list[str], *, output_dir: str | Path | None = None, extra: dict[str, Any] | None = None
) -> RunRecord:
    """Start `ng_<command> <argv>` detached (see the module docstring) and return its record.

    Relative paths in `argv` keep working: the process starts in the current folder.

    Raises:
        ConfigError: `command` is not an ng_* command.
    """
    if command not in commands.COMMANDS:
        raise ConfigError(f"no command ng_{command}")
    run_id = new_run_id(command)
    run_dir = background_runs_dir() / run_id
    run_dir.mkdir(mode=0o700)
    now = time.time()
    record = RunRecord(
        id=run_id,
        command=command,
        argv=list(argv),
        cwd=os.getcwd(),
        log=str(run_dir / LOG_FILE),
        started=datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
        started_at=now,
        output_dir=str(Path(output_dir).resolve()) if output_dir else None,
        extra=dict(extra or {}),
    )
    record.save()  # before the start, so the wrapper always finds its folder complete
    env = {**os.environ, BACKGROUND_RUN_DIR_ENV: str(run_dir), "PYTHONUNBUFFERED": "1"}
    with open(record.log, "ab") as log, open(os.devnull, "rb") as stdin:
        process = subprocess.Popen(
            [sys.executable, "-m", "nemo_gym.runs.background", str(run_dir), command, *argv],
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    record.pid = record.pgid = process.pid  # a new session: the process leads its own group
    try:
        record.process_create_time = psutil.Process(process.pid).create_time()
    except psutil.Error:  # already gone: the status comes from exit.json
        pass
    record.save()
    return record


def load_record(run_id: str) -> RunRecord:
    """The record of `run_id`; a unique prefix of an id is enough.

    Raises:
        ConfigError: no such run, or the prefix matches several.
    """
    runs_dir = background_runs_dir()
    try:
        check_name(run_id, what="run id")
    except PathEscapeError as exc:
        raise ConfigError(f"{exc} (ng_runs list shows the ids)") from None
    if (runs_dir / run_id / RECORD_FILE).is_file():
        return _read_record(runs_dir / run_id)
    matches = [p for p in runs_dir.glob(f"{glob.escape(run_id)}*/{RECORD_FILE}")]
    if len(matches) == 1:
        return _read_record(matches[0].parent)
    if matches:
        raise ConfigError(f"run id {run_id!r} is ambiguous: {', '.join(sorted(m.parent.name for m in matches))}")
    raise ConfigError(f"no background run {run_id!r} (ng_runs list shows them)")


def list_records() -> list[RunRecord]:
    """Every readable record, newest first."""
    records = []
    for path in background_runs_dir().glob(f"*/{RECORD_FILE}"):
        try:
            records.append(_read_record(path.parent))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(records, key=lambda r: r.started_at, reverse=True)


def _read_record(run_dir: Path) -> RunRecord:
    """The record in `run_dir`. Raises ValueError (a PathEscapeError) when its id is not the folder's name."""
    record = RunRecord(**json.loads((run_dir / RECORD_FILE).read_text()))
    if (
        record.id != run_dir.name
    ):  # a hand-edited id such as "../x" would make `dir` (and ng_runs delete) leave train_runs/
        raise PathEscapeError(
            f"{run_dir / RECORD_FILE}: id {record.id!r} is not the name of its folder {run_dir.name!r}"
        )
    return record


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def exit_info(record: RunRecord) -> dict[str, Any] | None:
    """`exit.json` (`{"returncode", "finished_at"}`) once the command has returned, else None."""
    return _read_json(record.dir / EXIT_FILE)


def is_alive(record: RunRecord) -> bool:
    """The recorded process still runs (same pid and creation time, not a zombie)."""
    if not record.pid:
        return False
    try:
        process = psutil.Process(record.pid)
        if record.process_create_time is not None and abs(process.create_time() - record.process_create_time) > 1.0:
            return False  # the pid was reused
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_status(record: RunRecord) -> RunStatus:
    """running / finished / failed / stopped, as the module docstring says."""
    exited = exit_info(record)
    if exited is None and is_alive(record):
        return "running"
    return _ended_status(record.dir, exited.get("returncode") if exited else None)


def _ended_status(run_dir: Path, returncode: int | None) -> RunStatus:
    """The status of an ended run from its exit status (None: it died without writing one)."""
    if (run_dir / STOP_REQUEST_FILE).is_file() or returncode in _STOP_EXIT_STATUSES:
        return "stopped"
    return "finished" if returncode == 0 else "failed"


def write_stop_request(run_dir: Path, *, save_model: bool) -> None:
    """`stop.json` in a run's record folder (read by the stopping trainer, see nemo_gym.train.stopping)."""
    write_json(run_dir / STOP_REQUEST_FILE, {"save_model": save_model, "requested_at": time.time()})


def _descendant_groups(pid: int, own_group: int) -> set[int]:
    """Process groups of `pid`'s descendants other than `own_group` (e.g. the ng_run a trainer started in its own
    session, which a signal to the trainer's group does not reach)."""
    groups = set()
    try:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                groups.add(os.getpgid(child.pid))
            except ProcessLookupError:
                continue
    except psutil.Error:
        pass
    return groups - {own_group}


def signal_run(record: RunRecord, sig: int) -> bool:
    """Send `sig` to the run's process group if the run is alive; returns whether it was sent.

    With SIGKILL the run cannot clean up, so the process groups its descendants lead (an ng_run started by the
    trainer) get SIGTERM: they stop their own servers.
    """
    if not record.pgid or not is_alive(record):
        return False
    others = _descendant_groups(record.pid, record.pgid) if sig == signal.SIGKILL and record.pid else set()
    try:
        os.killpg(record.pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    for group in others:
        try:
            os.killpg(group, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            continue
    return True


def wait_until_ended(record: RunRecord, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Wait up to `timeout_s` for the run's process to end; returns whether it did."""
    deadline = time.monotonic() + timeout_s
    while is_alive(record):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _wrapper_main(argv: list[str]) -> int:
    """`python -m nemo_gym.runs.background <record dir> <command> <argv...>`: run the command, then write exit.json."""
    run_dir, command, rest = Path(argv[0]), argv[1], argv[2:]
    returncode = 1
    try:
        returncode = commands.main(command, rest)
    except SystemExit as exc:
        returncode = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        returncode = 130
    finally:
        write_json(run_dir / EXIT_FILE, {"returncode": returncode, "finished_at": time.time()})
        _record_final_status(run_dir, returncode)
    return returncode


def _record_final_status(run_dir: Path, returncode: int) -> None:
    """Write the final status into run.json (best effort: the live status never depends on it)."""
    try:
        record = _read_record(run_dir)
    except (OSError, ValueError, TypeError):
        return
    record.status = _ended_status(run_dir, returncode)
    write_json(run_dir / RECORD_FILE, dataclasses.asdict(record))


if __name__ == "__main__":
    sys.exit(_wrapper_main(sys.argv[1:]))
