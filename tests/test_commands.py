"""The command registry (`nemo_gym.config.commands`): each command declared once, its options and main loaded by
name, and the console scripts of pyproject.toml pointing at exactly its commands."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import BaseModel

import nemo_gym.cli
from nemo_gym.cli.legacy import LEGACY_COMMANDS
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config.commands import COMMANDS


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_options_and_main_load(name):
    command = COMMANDS[name]
    assert issubclass(command.options(), BaseModel)
    assert callable(command.main())


def test_console_scripts_are_the_registrys_commands():
    """`ng_<name>` and `nemo_gym_<name>` for every command and every NeMo Gym 0.7.0 command of
    `nemo_gym.cli.legacy` (and nothing else), plus `ng` / `nemo_gym` and 0.7.0's `gym`."""
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    names = [*COMMANDS, *LEGACY_COMMANDS]
    expected = {f"{prefix}{name}": f"nemo_gym.cli:ng_{name}" for name in names for prefix in ("ng_", "nemo_gym_")}
    assert scripts == {**expected, "ng": "nemo_gym.cli:ng", "nemo_gym": "nemo_gym.cli:ng", "gym": "nemo_gym.cli:gym"}


def test_console_script_entries_come_from_the_registry():
    assert nemo_gym.cli.ng_train.__name__ == "ng_train"
    with pytest.raises(AttributeError):
        nemo_gym.cli.ng_no_such_command  # noqa: B018
