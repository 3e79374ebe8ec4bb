"""The command line: the console scripts `ng_<name>` and `nemo_gym_<name>` of every command in
`nemo_gym.config.commands.COMMANDS` (both names run the same command), `ng <name>`, and (in this package's modules) the
mains of the commands that join a core command to the extras that feed it: `ng_run` and `ng_train` read
ReinforceNow projects and Prime-style TOML, `ng_train` and `ng_collect_rollouts` also run in the background or on
the run server, `ng_status` also lists background runs and the run server's.

This package is the top layer (see `nemo_gym.common.layout.LAYERS`): nothing in nemo_gym imports it; a command is run
by name through `nemo_gym.config.commands.main`.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from nemo_gym.config.commands import COMMANDS, dispatch, main, unknown_command

__all__ = ["COMMANDS", "main", "dispatch", "gym", "ng", "unknown_command"]


def _entry(name: str) -> Callable[[], None]:
    def entry() -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started as a background job of a non-interactive shell (`ng_... &` in a script, a CI harness), which
            # ignores SIGINT: every ng_ command documents Ctrl-C / SIGINT as its stop, so it gets KeyboardInterrupt
            # back.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if name in COMMANDS:
            sys.exit(main(name))
        from nemo_gym.cli.legacy import run  # NeMo Gym 0.7.0's commands that are not in COMMANDS

        sys.exit(run(name))

    entry.__name__ = f"ng_{name}"
    return entry


def __getattr__(name: str) -> Callable[[], None]:
    """`ng_<command>`: the console-script entry of a command of COMMANDS (`from nemo_gym.cli import ng_run`)."""
    from nemo_gym.cli.legacy import LEGACY_COMMANDS

    if name.startswith("ng_") and (name.removeprefix("ng_") in COMMANDS or name.removeprefix("ng_") in LEGACY_COMMANDS):
        return _entry(name.removeprefix("ng_"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ng() -> None:
    """`ng <command> +key=value ...`: any ng_* command by name, with a suggestion for an unknown one; or NeMo Gym
    0.7.0's `ng <group> <action> ...` (`nemo_gym.cli.gym_router`)."""
    from nemo_gym.cli.gym_router import ng_main

    sys.exit(ng_main(sys.argv[1:]))


def gym() -> None:
    """`gym <group> <action> [flags] [+key=value ...]`: NeMo Gym 0.7.0's command router over our commands."""
    from nemo_gym.cli.gym_router import gym_main

    sys.exit(gym_main(sys.argv[1:]))
