"""`ng_runs`' main: the run server's runs when logged in to one (`nemo_gym.team.remote_runs`), else this machine's
background runs (`nemo_gym.runs.command`); `+local=true` / `+remote=true` choose."""

from __future__ import annotations

from nemo_gym.runs.command import RunsOptions, runs_main
from nemo_gym.team.remote_runs import remote_runs_main, wants_remote

__all__ = ["main"]


def main(options: RunsOptions) -> int:
    """`ng_runs <verb> [<id>]`. Returns the exit status.

    Raises:
        ConfigError: contradicting flags, a verb without its run id, an unknown id (see `runs_main`).
        TeamServerError: the run server refused or failed.
    """
    if wants_remote(options.remote, options.local):
        return remote_runs_main(options)
    return runs_main(options)
