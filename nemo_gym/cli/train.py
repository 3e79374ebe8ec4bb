"""`ng_train`'s main: the training loop (`nemo_gym.train.loop`) fed by a Prime-style TOML (`@config.toml`, `+init=true`
prints one) or a ReinforceNow project (`+rnow_project=DIR`: one run per model.path), here, in the background
(`+background=true`) or on the run server (`+remote=true`)."""

from __future__ import annotations

from nemo_gym.config import load_config
from nemo_gym.prime import config as prime_config
from nemo_gym.rnow.project import expand_rnow_args
from nemo_gym.runs.command import BACKGROUND_FLAG, pop_flag, train_in_background
from nemo_gym.team.remote_runs import submit_remote

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Train as `argv` says. Returns the exit status (the first non-zero one of several runs)."""
    if prime_config.init_requested(argv):
        print(prime_config.TEMPLATE, end="")
        return 0
    argv = prime_config.expand_toml_args(argv)  # `@config.toml` (Prime-style TOML) → +config_paths=[translated config]
    argv, remote = pop_flag(argv, "remote")
    if remote:  # ng_train +remote=true: submit this folder as a run of the logged-in run server
        return submit_remote("train", argv)
    status = 0
    for run_argv in expand_rnow_args(argv, mode="train"):  # +rnow_project=DIR: one run per model.path (else argv as is)
        argv, background = pop_flag(run_argv, BACKGROUND_FLAG)
        if background:
            status = status or train_in_background(argv)
            continue
        from nemo_gym.train.recipes import train_main  # imports torch: not for +init, +remote or +background runs

        status = status or train_main(load_config(argv), argv)
    return status
