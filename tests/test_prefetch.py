"""`ng_prefetch` (0.7.0's `gym env prefetch`): what ng_run of a config builds, built without starting a server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from ng_process import BIN, REPO, NgRun

from nemo_gym.cli import gym_router as gym

# a resources server whose start-up would fetch its tasks: its prefetch hook does it instead (a counter: how often)
FETCHING_SERVER = """
from pathlib import Path

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session


class FetchingConfig(ServerConfig):
    tasks_file: str
    offline: bool = False


class Fetching(ResourcesServer):
    Config = FetchingConfig

    def prefetch(self) -> list[str]:
        if self.config.offline:
            raise RuntimeError("no network: cannot fetch the tasks")
        path = Path(self.config.tasks_file)
        path.write_text(str(int(path.read_text()) + 1 if path.exists() else 1))
        return [f"tasks: {path}"]

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        return VerifyResult(reward=1.0)
"""


def _project(tmp_path: Path, **instances: dict) -> Path:
    """A config of `fetching` servers (a folder of the user's) named as `instances` says, with those fields."""
    folder = tmp_path / "fetching"
    folder.mkdir(exist_ok=True)
    (folder / "app.py").write_text(FETCHING_SERVER)
    config = {
        name: {"resources_servers": {"fetching": {"implementation_dir": str(folder), "entrypoint": "app.py", **fields}}}
        for name, fields in instances.items()
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _prefetch(*args: str, home: Path, command: str = "ng_prefetch") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / command), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "NEMO_GYM_HOME": str(home)},
    )


@pytest.mark.integration
def test_prefetch_runs_each_servers_hook_once_and_names_one_that_fails(tmp_path):
    tasks = tmp_path / "tasks.txt"
    # two instances with the same folder and fields share one hook run; the third is another
    config = _project(
        tmp_path,
        a={"tasks_file": str(tasks)},
        b={"tasks_file": str(tasks)},
        c={"tasks_file": str(tmp_path / "other.txt")},
    )
    done = _prefetch(f"+config_paths=[{config}]", "+skip_venv=true", home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert f"a: tasks: {tasks}" in done.stdout and "b: tasks:" not in done.stdout
    assert tasks.read_text() == "1" and (tmp_path / "other.txt").read_text() == "1"
    assert "0 environment(s), 2 server(s) prepared" in done.stdout

    offline = _project(tmp_path, broken={"tasks_file": str(tasks), "offline": True})
    failed = _prefetch(f"+config_paths=[{offline}]", "+skip_venv=true", home=tmp_path / "home")
    assert failed.returncode == 1
    assert f"ng_prefetch: server 'broken' ({tmp_path / 'fetching'}) could not be prefetched (exit 1" in failed.stderr
    assert "RuntimeError: no network: cannot fetch the tasks" in failed.stderr  # its log's last lines

    typo = _project(tmp_path, bad={"tasks_fiel": str(tasks)})
    refused = _prefetch(f"+config_paths=[{typo}]", "+skip_venv=true", home=tmp_path / "home")
    assert (
        refused.returncode == 1 and "key 'bad.resources_servers.fetching.tasks_fiel' is not a field" in refused.stderr
    )
    assert tasks.read_text() == "1"


def test_gym_env_prefetch_runs_ng_prefetch_with_the_config(monkeypatch):
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(gym, "run_named", lambda name, argv: calls.append((name, argv)) or 0)
    assert gym.gym_main(["env", "prefetch", "--config", "a.yaml", "+skip_venv=true"]) == 0
    assert calls == [("prefetch", ["+config_paths=[a.yaml]", "+skip_venv=true"])]


@pytest.mark.long
def test_prefetch_builds_the_environments_ng_run_then_reuses(tmp_path):
    """In an empty NEMO_GYM_HOME, `gym env prefetch` builds the environment of each server of a config, its modules
    compiled to bytecode (and runs their hooks there); ng_run of the same config then starts without building any."""
    home, tasks = tmp_path / "home", tmp_path / "tasks.txt"
    config = _project(tmp_path, fetch={"tasks_file": str(tasks)})
    done = _prefetch("env", "prefetch", "--config", str(config), home=home, command="gym")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Preparing 1 environment(s) for 1 server(s)" in done.stdout and tasks.read_text() == "1"
    [venv] = [p for p in (home / "venvs").iterdir() if p.is_dir()]
    ready = (venv / ".ready").stat().st_mtime_ns
    # compiled at the build (venvs.COMPILE_BYTECODE), not by each server start: e.g. fastapi, which every server imports
    [fastapi] = venv.glob("lib/python3.*/site-packages/fastapi/__init__.py")
    assert list((fastapi.parent / "__pycache__").glob("__init__.cpython-*.pyc"))
    with NgRun(f"+config_paths=[{config}]", env={"NEMO_GYM_HOME": str(home)}) as run:
        run.wait_ready()
        [run_dir] = (home / "runs").iterdir()
        assert not (run_dir / "logs" / "venvs.log").exists()  # nothing was installed
    assert [p for p in (home / "venvs").iterdir() if p.is_dir()] == [venv]
    assert (venv / ".ready").stat().st_mtime_ns == ready


@pytest.mark.e2e
def test_prefetch_converts_the_embedded_model_for_vllm_model(tmp_path):
    """vllm_model's hook: its engine (that of the default NEMO_GYM_HOME, built there if missing) and the embedded
    SmolLM2 converted into an empty NEMO_GYM_HOME, where its start-up finds it (`embedded.ensure_converted`)."""
    from nemo_gym.model_servers.vllm_engine import engine_venv_dir, resolve_vllm_package

    engine = engine_venv_dir(resolve_vllm_package("auto"))
    home = tmp_path / "home"
    args = (
        "+config_paths=[responses_api_models/vllm_model/configs/vllm_model.yaml]",
        f"++policy_model.responses_api_models.vllm_model.engine_venv_dir={engine}",
        "+skip_venv=true",
    )
    done = _prefetch(*args, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    [model] = (home / "models").iterdir()
    assert (model / "config.json").is_file() and f"policy_model: model: {model}" in done.stdout
    assert f"policy_model: engine: {engine}/bin/python (vLLM " in done.stdout
