"""`ng_status`'s main: the servers of every live `ng_run` (`nemo_gym.orchestration.status`), then the background
training runs
(`ng_runs list`) and the run server this user is logged in to."""

from __future__ import annotations

from nemo_gym.orchestration.status import StatusOptions, status_main
from nemo_gym.runs.command import print_training_runs
from nemo_gym.team.remote_runs import print_team_status

__all__ = ["main"]


def main(options: StatusOptions) -> int:
    """Print the status; exit status 0 when every listed server is healthy, 1 otherwise."""
    returncode = status_main(options.head_server_url, as_json=options.json_output)
    if not options.json_output:
        print_training_runs()  # ng_train +background=true: running ones, and how many ended
        print_team_status()  # ng_login +server=...: user, active organization, active runs
    return returncode
