"""The `ng_*` commands of NeMo Gym 0.7.0 that have no twin in `nemo_gym.config.commands.COMMANDS`, declared the same way
(`Command`: name, summary, options model, main; `+help=true` prints the parameters) and run by `run`:

| command | 0.7.0's `gym` form | here |
|---|---|---|
| ng_aggregate_rollouts | eval aggregate | `nemo_gym.collect.aggregate_rollouts` |
| ng_e2e_collect_rollouts | eval run | `nemo_gym.cli.e2e` |
| ng_list_benchmarks | list benchmarks | `nemo_gym.datasets.catalog` (its benchmarks) |
| ng_list_environments | list environments, search | `nemo_gym.datasets.catalog` |
| ng_publish_environment | env publish | `nemo_gym.cli.publish` |
| ng_materialize_prompts | dataset render | `nemo_gym.datasets.prompts` |
| ng_prepare_benchmark | eval prepare | runs the config's prepare scripts (`nemo_gym.datasets.benchmarks`) |
| ng_reinstall | (none) | `uv sync --extra dev`, as 0.7.0 runs it |
| ng_validate | env validate | `nemo_gym.cli.validate` |

They live in the cli package (not in `nemo_gym.config.commands`) because they join core commands to the extras
(datasets, prompts) or exist only for NeMo Gym 0.7.0's users; background runs and team jobs do not run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from nemo_gym.common.errors import ConfigError
from nemo_gym.config.commands import Command, NoOptions, main

__all__ = ["LEGACY_COMMANDS", "reinstall_main", "run"]

LEGACY_COMMANDS: dict[str, Command] = {
    c.name: c
    for c in [
        Command(
            "aggregate_rollouts",
            "merge rollout shards (a glob) into one rollouts file and write its aggregate metrics (0.7.0's gym eval"
            " aggregate)",
            "nemo_gym.collect.aggregate_rollouts:AggregateRolloutsOptions",
            "nemo_gym.collect.aggregate_rollouts:aggregate_rollouts_main",
        ),
        Command(
            "e2e_collect_rollouts",
            "prepare a split of the config's datasets, start its servers, collect rollouts, stop them (0.7.0's gym eval"
            " run)",
            "nemo_gym.collect.command:CollectConfig",
            "nemo_gym.cli.e2e:e2e_main",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "list_benchmarks",
            "list the benchmarks of the catalog (benchmarks/ with or without a manifest, benchmark configs of"
            " resources servers) under the search roots; +name=<name> shows one (0.7.0's gym list benchmarks)",
            "nemo_gym.datasets.catalog:ListBenchmarksOptions",
            "nemo_gym.datasets.catalog:list_environments_main",
        ),
        Command(
            "list_environments",
            "list the catalog of environments and benchmarks (environments/ and benchmarks/ folders, runnable"
            " resources server configs) under the search roots, filtered by +query, +domain, +catalog_kind, ...;"
            " +name=<name> shows one (0.7.0's gym list environments)",
            "nemo_gym.datasets.catalog:ListEnvironmentsOptions",
            "nemo_gym.datasets.catalog:list_environments_main",
        ),
        Command(
            "publish_environment",
            "the local checks before a catalog entry is published: its manifest, its server's tests and verifier"
            " cases, no scaffold placeholder left, the catalog finds it (0.7.0's gym env publish)",
            "nemo_gym.cli.publish:PublishOptions",
            "nemo_gym.cli.publish:publish_main",
        ),
        Command(
            "materialize_prompts",
            "apply a prompt template YAML to raw JSONL rows (0.7.0's gym dataset render)",
            "nemo_gym.datasets.prompts:MaterializePromptsOptions",
            "nemo_gym.datasets.prompts:materialize_main",
        ),
        Command(
            "prepare_benchmark",
            "run the prepare() of each dataset of a config with a prepare_script (a benchmark's prepare.py), as"
            " 0.7.0's gym eval prepare",
            "nemo_gym.datasets.benchmarks:PrepareBenchmarkOptions",
            "nemo_gym.datasets.benchmarks:prepare_benchmark_main",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "reinstall",
            "reinstall the project of the current directory with its dev extra: `uv sync --extra dev`, as 0.7.0 does",
            "nemo_gym.config.commands:NoOptions",
            "nemo_gym.cli.legacy:reinstall_main",
        ),
        Command(
            "validate",
            "check a config as ng_run would, without starting anything (0.7.0's gym env validate)",
            "nemo_gym.orchestration.run:RunOptions",
            "nemo_gym.cli.validate:validate_main",
            strict=False,
            takes_argv=True,
        ),
    ]
}


def reinstall_main(options: NoOptions) -> int:
    """`ng_reinstall`: `uv sync --extra dev` in the current directory (NeMo Gym 0.7.0's command, run without a shell).
    Returns uv's exit status.

    Raises:
        ConfigError: no pyproject.toml here, or no uv.
    """
    if not Path("pyproject.toml").is_file():
        raise ConfigError(f"no pyproject.toml in {os.getcwd()}: run ng_reinstall in the project's folder")
    uv = shutil.which("uv", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if uv is None:
        raise ConfigError("uv not found (next to this Python or on PATH): install it (pip install uv)")
    print("ng_reinstall: uv sync --extra dev", file=sys.stderr)
    return subprocess.run([uv, "sync", "--extra", "dev"], check=False).returncode


def run(name: str, argv: list[str] | None = None) -> int:
    """Run legacy command `name` with `argv` (default sys.argv[1:]) as `nemo_gym.config.commands.main` runs the others:
    `+help=true` prints the parameters, a `NemoGymError` is one line on stderr and exit status 2, Ctrl-C is 130."""
    return main(name, argv, LEGACY_COMMANDS)
