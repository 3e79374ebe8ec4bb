"""Start `ng_run` as a real process for tests and stop it by PID (`NgRun` lives in
`nemo_gym.orchestration.folder_tests`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from nemo_gym.env.testing import NgRun

__all__ = ["BIN", "REPO", "NgRun", "LAUNCHER_ENV", "clean_env", "wait_for_output", "weather_agent", "weather_config"]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# the torch.distributed variables a one-rank engine of the test process sets (engine.set_single_process_env)
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env() -> dict[str, str]:
    """This process's environment without LAUNCHER_ENV, one OpenMP thread: for a child that starts its own ranks."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV} | {"OMP_NUM_THREADS": "1"}


def wait_for_output(path: Path, pattern: str, process: subprocess.Popen, name: str, timeout_s: float = 120) -> str:
    """The text of `path` once it matches the regex `pattern`, polled every 0.1 s; fails at once when `process`
    (named `name` in the messages) exits first, and after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if re.search(pattern, text):
            return text
        assert process.poll() is None, f"{name} exited with {process.returncode}:\n{text}"
        time.sleep(0.1)
    raise AssertionError(
        f"no {pattern!r} in {name}'s output after {timeout_s} s:\n{path.read_text() if path.exists() else ''}"
    )


def weather_agent(model_name: str = "policy_model") -> dict:
    """The config section of a simple_agent on the resources server `weather` (example_single_tool_call) calling the
    model server `model_name`, at most 4 model calls a rollout."""
    return {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {"type": "resources_servers", "name": "weather"},
                "model_server": {"type": "responses_api_models", "name": model_name},
                "max_steps": 4,
            }
        }
    }


def weather_config(path: Path, policy_url: str) -> Path:
    """Writes to `path` (and returns it) an ng_run config of the weather environment: example_single_tool_call as
    `weather`, simple_agent `weather_agent` (at most 4 model calls), and `policy_model`, an openai_model on
    `policy_url` (a scripted stand-in policy serving `/v1`)."""
    config = {
        "weather": {"resources_servers": {"example_single_tool_call": {"entrypoint": "app.py"}}},
        "weather_agent": weather_agent(),
        "policy_model": {
            "responses_api_models": {
                "openai_model": {
                    "entrypoint": "app.py",
                    "openai_base_url": f"{policy_url}/v1",
                    "openai_api_key": "unused",
                    "openai_model": "scripted",
                    "max_retries": 0,
                }
            }
        },
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
