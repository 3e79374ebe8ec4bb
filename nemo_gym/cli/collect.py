"""`ng_collect_rollouts`'s main: rollouts collected here, or as a collection run on the run server (`+remote=true`)."""

from __future__ import annotations

from nemo_gym.collect.command import collect_main
from nemo_gym.config.commands import COMMANDS, parse_options
from nemo_gym.runs.command import pop_flag
from nemo_gym.team.remote_runs import submit_remote

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Collect as `argv` says. Returns the exit status."""
    argv, remote = pop_flag(argv, "remote")
    options = parse_options(COMMANDS["collect_rollouts"], argv)  # checked here even when the run server collects
    if remote:  # ng_collect_rollouts +remote=true: a collection run on the run server
        return submit_remote("collect", argv)
    return collect_main(options)
