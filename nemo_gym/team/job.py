"""The entrypoint of a run submitted through `ng_serve`, and what the server does on the node that runs it.

Ray Jobs starts `python -m nemo_gym.team.job <train|collect> <run id> <argv...>` in the run's uploaded working
directory, on whichever node it placed the job. This wrapper gives the run a folder on that node,
`$NEMO_GYM_HOME/serve_jobs/<run id>/` (mode 0700), and runs the command in-process:

  train    ng_train <argv> ++trainer.output_dir=<run folder>/output           (final/ lands in output/final)
  collect  ng_collect_rollouts <argv> ++output_jsonl_fpath=<run folder>/output/rollouts.jsonl

The run folder is also `$NEMO_GYM_BACKGROUND_RUN_DIR`, so a stop works as for `ng_runs stop` of a local
background run (nemo_gym.train.stopping): the server first writes `stop.json` (`{"save_model": ...}`) into the
folder, then asks Ray to stop the job, which sends SIGTERM; the trainer turns that into "save final/, then stop".

The server reaches the run folder through Ray tasks pinned to the job's node (`node_task`), so the cluster needs
no shared filesystem and the nodes need not reach the server: `write_stop_request_on_node`, `pack_final_on_node`
(the final/ folder as tar bytes, copied into the server's storage) and `remove_run_dir_on_node`.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import sys
import tarfile
from pathlib import Path

from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.config import commands
from nemo_gym.runs.background import write_stop_request
from nemo_gym.train.stopping import BACKGROUND_RUN_DIR_ENV

__all__ = [
    "KIND_COMMANDS",
    "RUN_ID_PATTERN",
    "job_run_dir",
    "entrypoint",
    "write_stop_request_on_node",
    "pack_final_on_node",
    "remove_run_dir_on_node",
    "main",
]

KIND_COMMANDS = {"train": "train", "collect": "collect_rollouts"}
RUN_ID_PATTERN = re.compile(r"^[a-z_]+-\d{8}-\d{6}-[0-9a-f]{4}$")  # nemo_gym.runs.background.new_run_id


def job_run_dir(run_id: str) -> Path:
    """`$NEMO_GYM_HOME/serve_jobs/<run id>` on the node this runs on.

    Raises:
        ValueError: `run_id` is not a run id (it becomes a path: no separators, no `..`).
    """
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return nemo_gym_home() / "serve_jobs" / run_id


def entrypoint(python: str, kind: str, run_id: str, argv: list[str]) -> str:
    """The shell command Ray Jobs runs for a run (every part quoted)."""
    return shlex.join([python, "-m", "nemo_gym.team.job", kind, run_id, *argv])


def write_stop_request_on_node(run_id: str, save_model: bool) -> None:
    """`stop.json` in the run's folder (read by the trainer when the SIGTERM arrives)."""
    run_dir = job_run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_stop_request(run_dir, save_model=save_model)


def pack_final_on_node(run_id: str) -> bytes | None:
    """The run's `output/final` folder as an uncompressed tar (members under `final/`), or None when there is none
    (a run stopped without save_model, or a collection run)."""
    final = job_run_dir(run_id) / "output" / "final"
    if not final.is_dir():
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(final, arcname="final")
    return buffer.getvalue()


def remove_run_dir_on_node(run_id: str) -> None:
    shutil.rmtree(job_run_dir(run_id), ignore_errors=True)


def main(argv: list[str]) -> int:
    """`python -m nemo_gym.team.job <kind> <run id> <argv...>`: run the command; returns its exit status."""
    if len(argv) < 2 or argv[0] not in KIND_COMMANDS:
        print(
            f"usage: python -m nemo_gym.team.job {{{'|'.join(KIND_COMMANDS)}}} <run id> [ng_* arguments]",
            file=sys.stderr,
        )
        return 2
    kind, run_id, rest = argv[0], argv[1], list(argv[2:])

    run_dir = job_run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ[BACKGROUND_RUN_DIR_ENV] = str(run_dir)
    output = run_dir / "output"
    rest.append(
        f"++trainer.output_dir={output}" if kind == "train" else f"++output_jsonl_fpath={output / 'rollouts.jsonl'}"
    )
    command = KIND_COMMANDS[kind]
    print(f"nemo_gym run {run_id}: ng_{command} {shlex.join(rest)} (in {os.getcwd()})", flush=True)
    return commands.main(command, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
