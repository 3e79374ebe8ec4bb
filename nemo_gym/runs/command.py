"""`ng_runs <verb> [<run id>]`: the background runs of `ng_train +background=true` (and of
`nemo_gym.runs.background.detach`).

  ng_runs list [+json=true]                 id, status, step reached, reward, start time, output_dir
  ng_runs logs <id> [+follow=true]          the run's output; with follow, new lines until the run ends
  ng_runs stop <id> [+save_model=true]      SIGTERM to the run's process group (the trainer finishes or abandons
                                            the current step; with save_model it writes output_dir/final first)
  ng_runs delete <id> [+force=true] [+delete_outputs=true]
  ng_runs download <id> +output=DIR         copy the run's final/ model folder to DIR

When logged in to a run server (`ng_login +server=URL`), the verbs act on the server's runs of the active
organization (nemo_gym.team.remote_runs); `+local=true` keeps them on this machine, `+remote=true` insists on the
server.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config
from nemo_gym.runs.background import (
    RunRecord,
    detach,
    exit_info,
    list_records,
    load_record,
    run_status,
    signal_run,
    wait_until_ended,
    write_stop_request,
)

__all__ = ["RunsOptions", "runs_main", "train_in_background", "pop_flag", "run_summary", "print_training_runs"]

BACKGROUND_FLAG = "background"


class RunsOptions(BaseModel):
    """Parameters of `ng_runs` (verb and run id may be given as positional arguments: `ng_runs stop <id>`)."""

    model_config = ConfigDict(extra="forbid")
    verb: Literal["list", "logs", "stop", "delete", "download"] = Field(
        "list", description="list, logs, stop, delete or download"
    )
    id: str | None = Field(
        None, description="run id (from ng_runs list; a unique prefix is enough); needed by logs, stop and delete"
    )
    json_output: bool = Field(False, alias="json", description="list: print JSON instead of a table")
    follow: bool = Field(False, description="logs: keep printing new output until the run ends")
    lines: int | None = Field(
        None, ge=0, description="logs: start with the last `lines` lines only (default: the whole log)"
    )
    save_model: bool = Field(False, description="stop: the trainer saves output_dir/final before exiting")
    timeout_s: float = Field(300.0, gt=0, description="stop / delete +force: seconds to wait for the run to end")
    force: bool = Field(
        False, description="stop: SIGKILL the process group at once (nothing saved); delete: stop a running run first"
    )
    delete_outputs: bool = Field(False, description="delete: also remove the run's output_dir")
    output: str | None = Field(
        None, description="download: the folder to write the run's final/ model into (new or empty)"
    )
    remote: bool | None = Field(
        None, description="act on the run server's runs (default: when logged in with ng_login +server=...)"
    )
    local: bool = Field(False, description="act on this machine's background runs even when logged in to a run server")


# -- ng_train +background=true ------------------------------------------------------------------------------------
def pop_flag(argv: list[str], name: str) -> tuple[list[str], bool]:
    """Remove every `+name=<bool>` (also `++name=`, `name=`) from `argv`; returns the rest and the last value.

    Raises:
        ConfigError: a value that is not a boolean.
    """
    rest, value = [], False
    for arg in argv:
        key, sep, raw = arg.lstrip("+").partition("=")
        if not sep or key != name:
            rest.append(arg)
            continue
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"+{name} takes true or false, got {raw!r}")
        value = raw.lower() == "true"
    return rest, value


def train_in_background(argv: list[str]) -> int:
    """`ng_train +background=true ...`: check the config, start the same training detached, print the run id.

    Raises:
        ConfigError: the config has no valid `trainer:` section, a running background run writes the same
            output_dir, or the output_dir holds another run's outputs (`nemo_gym.train.output_dir`).
    """
    # the trainer's config imports openai's types: not for ng_runs and ng_status, which import this module too
    from nemo_gym.train.config import trainer_config
    from nemo_gym.train.output_dir import OVERWRITE_KEY, prepare_output_dir

    loaded = load_config(argv)
    cfg = trainer_config(loaded)
    output_dir = Path(cfg.output_dir).resolve()
    for other in list_records():
        if other.output_dir == str(output_dir) and run_status(other) == "running":
            raise ConfigError(
                f"background run {other.id} is still writing to {output_dir}; stop it (ng_runs stop {other.id}) or"
                " choose another +trainer.output_dir"
            )
    if (
        prepare_output_dir(cfg, overwrite=loaded.values.get(OVERWRITE_KEY) is True, dry_run=True)[1] == "finished"
    ):  # the run itself resumes or deletes
        return 0
    record = detach("train", argv, output_dir=output_dir, extra={"num_steps": cfg.num_steps})
    print(record.id)
    print(f"ng_train: training in the background (pid {record.pid}); output in {output_dir}", file=sys.stderr)
    print(
        f"  follow: ng_runs logs {record.id} +follow=true    stop: ng_runs stop {record.id} [+save_model=true]",
        file=sys.stderr,
    )
    return 0


# -- list ------------------------------------------------------------------------------------------------------
def _last_metrics(output_dir: str | None, tail_bytes: int = 65536) -> dict[str, Any]:
    """The last JSON line of `output_dir/metrics.jsonl` that has a `step` ({} when none)."""
    if not output_dir:
        return {}
    path = Path(output_dir) / "metrics.jsonl"
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - tail_bytes))
            lines = handle.read().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row:
            return row
    return {}


def run_summary(record: RunRecord) -> dict[str, Any]:
    """One run as listed: `{id, command, status, step, num_steps, reward, started, output_dir, pid, log, returncode}`;
    `reward` is the last step's `reward_mean` (None before the first step)."""
    metrics = _last_metrics(record.output_dir)
    exited = exit_info(record) or {}
    return {
        "id": record.id,
        "command": record.command,
        "status": run_status(record),
        "step": metrics.get("step"),
        "num_steps": record.extra.get("num_steps"),
        "reward": metrics.get("reward_mean"),
        "started": record.started,
        "output_dir": record.output_dir,
        "pid": record.pid,
        "log": record.log,
        "returncode": exited.get("returncode"),
    }


def _format_step(summary: dict[str, Any]) -> str:
    if summary["step"] is None:
        return "-"
    return f"{summary['step']}/{summary['num_steps']}" if summary["num_steps"] else str(summary["step"])


def _print_table(summaries: list[dict[str, Any]], indent: str = "") -> None:
    print(f"{indent}{'id':<32} {'status':<9} {'step':>9} {'reward':>8}  {'started':<25} output_dir")
    for s in summaries:
        reward = f"{s['reward']:.4g}" if isinstance(s["reward"], (int, float)) else "-"
        print(
            f"{indent}{s['id']:<32} {s['status']:<9} {_format_step(s):>9} {reward:>8}  {s['started']:<25}"
            f" {s['output_dir'] or '-'}"
        )


def _list(options: RunsOptions) -> int:
    summaries = [run_summary(r) for r in list_records()]
    if options.json_output:
        print(json.dumps(summaries, indent=2))
    elif not summaries:
        print("No background runs (start one with ng_train +background=true ...).")
    else:
        _print_table(summaries)
    return 0


def print_training_runs() -> None:
    """The `ng_status` section: running background runs, and a count of the ended ones."""
    summaries = [run_summary(r) for r in list_records()]
    running = [s for s in summaries if s["status"] == "running"]
    if not summaries:
        return
    print(f"Background runs: {len(running)} running, {len(summaries) - len(running)} ended (ng_runs list shows all)")
    if running:
        _print_table(running, indent="  ")


# -- logs ------------------------------------------------------------------------------------------------------
def _print_tail(path: Path, lines: int | None) -> int:
    """Print the log (its last `lines` lines when given); returns the byte offset reached."""
    data = path.read_bytes() if path.is_file() else b""
    shown = data if lines is None else b"".join(data.splitlines(keepends=True)[-lines:]) if lines else b""
    sys.stdout.buffer.write(shown)
    sys.stdout.flush()
    return len(data)


def _logs(record: RunRecord, options: RunsOptions, poll_s: float = 0.5) -> int:
    path = Path(record.log)
    offset = _print_tail(path, options.lines)
    while options.follow:
        running = run_status(record) == "running"  # read before the file, so the last output is not missed
        with path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        if chunk:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            offset += len(chunk)
        if not running:
            print(f"ng_runs: run {record.id} {run_status(record)}", file=sys.stderr)
            break
        time.sleep(poll_s)
    return 0


# -- stop / delete ---------------------------------------------------------------------------------------------
def _stop(record: RunRecord, options: RunsOptions) -> int:
    status = run_status(record)
    if status != "running":
        print(f"ng_runs: run {record.id} is not running ({status})")
        return 0
    write_stop_request(record.dir, save_model=options.save_model and not options.force)
    sig = signal.SIGKILL if options.force else signal.SIGTERM
    signal_run(record, sig)
    print(
        f"ng_runs: sent {signal.Signals(sig).name} to run {record.id} (process group {record.pgid}); waiting up to"
        f" {options.timeout_s:g} s",
        file=sys.stderr,
    )
    if not wait_until_ended(record, options.timeout_s):
        print(
            f"ng_runs: run {record.id} is still stopping; wait, or end it at once with ng_runs stop {record.id}"
            " +force=true",
            file=sys.stderr,
        )
        return 1
    final = Path(record.output_dir or ".") / "final"
    saved = f"; model in {final}" if options.save_model and record.output_dir and final.is_dir() else ""
    print(f"ng_runs: run {record.id} {run_status(record)}{saved}")
    return 0


def _safe_to_delete(path: Path) -> bool:
    path = path.resolve()
    return path != Path(path.anchor) and path != Path.home().resolve() and not Path.cwd().resolve().is_relative_to(path)


def _delete(record: RunRecord, options: RunsOptions) -> int:
    if run_status(record) == "running":
        if not options.force:
            raise ConfigError(
                f"run {record.id} is running; stop it first (ng_runs stop {record.id}) or pass +force=true"
            )
        write_stop_request(record.dir, save_model=False)
        signal_run(record, signal.SIGTERM)
        if not wait_until_ended(record, min(options.timeout_s, 30.0)):
            signal_run(record, signal.SIGKILL)
            wait_until_ended(record, 10.0)
    if options.delete_outputs and record.output_dir:
        output_dir = Path(record.output_dir)
        if not _safe_to_delete(output_dir):
            raise ConfigError(
                f"refusing to delete {output_dir} (the root, your home or a parent of the current folder)"
            )
        shutil.rmtree(output_dir, ignore_errors=True)
        print(f"ng_runs: deleted {output_dir}")
    shutil.rmtree(record.dir)
    print(f"ng_runs: deleted run {record.id}")
    return 0


def _download(record: RunRecord, options: RunsOptions) -> int:
    final = Path(record.output_dir or ".") / "final"
    if not options.output:
        raise ConfigError(f"ng_runs download needs +output=DIR: ng_runs download {record.id} +output=DIR")
    if not record.output_dir or not final.is_dir():
        raise ConfigError(
            f"run {record.id} has no final/ model in {record.output_dir or '-'} (stop it with +save_model=true, or let"
            " it finish)"
        )
    output = Path(options.output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"+output={output} exists and is not an empty folder; choose a new folder")
    shutil.copytree(final, output, dirs_exist_ok=True)
    print(f"ng_runs: model of run {record.id} in {output}")
    return 0


def runs_main(options: RunsOptions) -> int:
    """`ng_runs` on this machine's background runs: dispatch on the verb; returns the exit status (the command's main,
    which sends the verb to the run server instead when logged in, is `nemo_gym.cli.runs.main`).

    Raises:
        ConfigError: a verb that needs an id got none, an unknown or ambiguous id, deleting a running run
            without +force=true.
    """
    if options.verb == "list":
        return _list(options)
    if not options.id:
        raise ConfigError(
            f"ng_runs {options.verb} needs a run id: ng_runs {options.verb} <id> (ng_runs list shows them)"
        )
    record = load_record(options.id)
    if options.verb == "logs":
        return _logs(record, options)
    if options.verb == "stop":
        return _stop(record, options)
    if options.verb == "download":
        return _download(record, options)
    return _delete(record, options)
