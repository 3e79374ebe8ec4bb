"""`ng_prefetch` (NeMo Gym 0.7.0's `gym env prefetch`): what `ng_run` builds for a config, built without starting a
server, so that a later `ng_run` of the same config (in a container image built with it, on a machine without a
network) starts without building anything.

What it prepares, in order:
1. every environment `ng_run` would build (`nemo_gym.orchestration.launch.build_environments`: one per distinct
   requirements set of our own servers, a NeMo Gym release's for NeMo Gym server folders), in parallel as ng_run does;
2. the `prefetch` hook of each of our own servers (`nemo_gym.serving.server.BaseServer.prefetch`), run in the server's
   own environment (`python -m nemo_gym.serving.entrypoint --prefetch`, the instance on stdin: its fields may hold
   secrets, which a command line would show to `ps`), one after another: `vllm_model` builds its engine's venv and
   converts the embedded model, as its start-up would. Instances with the same folder and fields run it once.
Servers named by `url:` need nothing. The config and options are ng_run's (`+skip_venv=true`: no environment; the
hooks run with this Python). Nothing is started: no head server, no port, no Ray. Logs: `$NEMO_GYM_HOME/logs/
prefetch-<time>-<pid>/` (`venvs.log`, `<instance>.log`). 0.7.0 builds the per-server venvs one after another and
prepares no model engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from nemo_gym.common.errors import ServerStartError
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.config import LoadedConfig, load_config
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.launch import build_environments
from nemo_gym.orchestration.launch_local import LocalLauncher, server_environment
from nemo_gym.orchestration.launch_upstream import NemoGymLauncher
from nemo_gym.orchestration.run import RunOptions, run_instances, run_options, split_instances
from nemo_gym.orchestration.server_processes import tail

__all__ = ["prefetch", "prefetch_main"]

LOG_LINES = 30  # of a failed hook's log, in its error


async def _run_hook(instance: ServerInstance, python: Path, log: Path) -> list[str]:
    """The `prefetch` hook of `instance` in `python`; returns the lines it printed.

    Raises:
        ServerStartError: the hook failed, named, with the last lines of its log.
    """
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            str(python),
            "-m",
            "nemo_gym.serving.entrypoint",
            "--prefetch",
            cwd=instance.implementation_dir,
            env={**server_environment(), "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=out,
        )
        stdout, _ = await process.communicate(json.dumps(asdict(instance)).encode())
        out.write(stdout)
    if process.returncode != 0:
        raise ServerStartError(
            f"server {instance.name!r} ({instance.implementation_dir}) could not be prefetched (exit"
            f" {process.returncode}; log: {log}):\n{tail(log, LOG_LINES)}"
        )
    return stdout.decode(errors="replace").splitlines()


async def prefetch(loaded: LoadedConfig, options: RunOptions, log_dir: Path) -> tuple[int, int]:
    """Build the environments of a config's servers and run their `prefetch` hooks (see the module docstring);
    prints each hook's lines. Returns (environments built or found, hooks run).

    Raises:
        ConfigError: the config has no server instance, or a bad one.
        ServerStartError: an environment does not build, or a hook fails (named, with its installer's or log's lines).
    """
    instances = run_instances(loaded)
    _, nemo_gym, own = split_instances(instances)
    local = LocalLauncher(own, skip_venv=options.skip_venv, allow_same_user=False)
    environments = local.environments()
    if nemo_gym:
        upstream = NemoGymLauncher(
            nemo_gym, everyone=instances, values=loaded.values, default_version=options.nemo_gym_version
        )
        environments += upstream.environments()
    pythons = await build_environments(environments, log_dir / "venvs.log")
    done: set[str] = set()
    for instance in own:
        key = json.dumps([str(instance.implementation_dir), instance.fields], sort_keys=True, default=str)
        if key in done:
            continue
        done.add(key)
        python = Path(sys.executable) if options.skip_venv else pythons[instance.name]
        for line in await _run_hook(instance, python, log_dir / f"{instance.name}.log"):
            print(f"{instance.name}: {line}", flush=True)
    return len(environments), len(done)


def prefetch_main(argv: list[str]) -> int:
    """`ng_prefetch`: the config's environments built and its servers' hooks run. Returns the exit status (1: a
    build or a hook failed, reported).

    Raises:
        ConfigError: a bad config (named by file and key) or ng_run option.
    """
    loaded = load_config(argv)
    options = run_options(loaded)
    log_dir = nemo_gym_home() / "logs" / f"prefetch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    log_dir.mkdir(parents=True)
    start = time.monotonic()
    try:
        environments, hooks = asyncio.run(prefetch(loaded, options, log_dir))
    except ServerStartError as exc:
        print(f"ng_prefetch: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        f"Prefetched in {time.monotonic() - start:.1f} s: {environments} environment(s), {hooks} server(s) prepared"
        f" (logs: {log_dir}). ng_run with the same config builds nothing of these.",
        flush=True,
    )
    return 0
