"""`gym` and `ng`: NeMo Gym 0.7.0's command router (`gym <group> <action> [flags] [+key=value ...]`) over our
commands. Each supported subcommand runs the `ng_*` command 0.7.0's `nemo_gym/cli/legacy.py` maps to it, with
0.7.0's flags translated into our `+key=value` parameters (`nemo_gym.cli.gym_flags`) and any `+key=value` given
passed on as is. `gym --help` lists the supported subcommands and, below, those we do not support and why; running
one of them exits 2 with that reason. `ng <command> ...` (one of our own command names) still runs that command.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from nemo_gym.cli.gym_flags import (
    CATALOG_KIND,
    CONFIG,
    JSON,
    MODEL_FLAGS,
    SEARCH_DIR,
    SELECTORS,
    Flag,
    GymUsageError,
    Route,
    bool_flag,
    merge_config_paths,
    refused,
    value_flag,
)
from nemo_gym.cli.gym_listing import CATALOG_SEARCH, LISTING_ROUTES
from nemo_gym.cli.legacy import LEGACY_COMMANDS
from nemo_gym.cli.legacy import run as run_legacy_command
from nemo_gym.config.commands import dispatch
from nemo_gym.config.commands import main as run_command

__all__ = ["GROUPS", "ROUTES", "UNSUPPORTED", "gym_main", "ng_main"]


_REVERIFY_SERVERS = "ng_reverify verifies with the servers already running: start them with gym env start (ng_run)"
_NO_HEALTH = "nemo_gym has no rollout health checks (failed rollouts are in the _failures.jsonl side file)"
ALLOW_UNSUPPORTED_PAIRING = refused(
    "allow-unsupported-pairing", "nemo_gym has no agent/model pairing guards", takes_value=False
)
_NO_JUDGE_RECOVERY = "no judge-failure recovery: a failed re-verification is in the failures file; rerun it whole"
VERBOSE_HELP = "Set logging level to DEBUG (and $NEMO_GYM_LOG_LEVEL=debug for the servers it starts)."
LOG_LEVEL_ENV = "NEMO_GYM_LOG_LEVEL"  # the servers' log level (nemo_gym.serving.entrypoint)
_FROM_ROLLOUTS = "the runs are compared from their rollouts files, not their aggregate-metrics JSON"
_ALL_AGENTS = "the rollouts of every agent are compared, paired by task"


def _candidate(args: argparse.Namespace) -> list[str]:
    """`--candidates PATH`: the one candidate run (0.7.0 compares one too) -> `+from_rollouts=PATH`."""
    if args.candidates is None:
        return []
    paths = [path for path in args.candidates.split(",") if path]
    if len(paths) != 1:
        raise GymUsageError(f"--candidates names {len(paths)} runs; give a single candidate run (as 0.7.0)")
    return [f"+from_rollouts={paths[0]}"]


CANDIDATES = Flag(
    lambda p: p.add_argument("--candidates", metavar="PATH", help="Candidate run's rollouts JSONL (one)."), _candidate
)
# `-o DIR`: the report as DIR/compare_report.json (0.7.0's name); without it, ng_eval's <candidate stem>_eval.json
COMPARE_OUTPUT_DIR = Flag(
    lambda p: p.add_argument(
        "--output-dir", "-o", dest="output_dir", metavar="DIR", help="Where to write compare_report.json."
    ),
    lambda a: [f"+output_json_fpath={Path(a.output_dir) / 'compare_report.json'}"] if a.output_dir else [],
)
RESOURCES_SERVER = Flag(
    lambda p: p.add_argument("--resources-server", metavar="NAME", help="Name of the resources server."),
    lambda a: [f"+entrypoint=resources_servers/{a.resources_server}"] if a.resources_server else [],
)
STORAGE = Flag(lambda p: p.add_argument("--storage", choices=("hf", "gitlab"), default="hf", help="Storage backend."))
OUTPUT = value_flag("output", "output_jsonl_fpath", "Output JSONL file.", aliases=("-o",))


def _hf_only_refused(name: str) -> Flag:
    return refused(name, "nemo_gym's Hugging Face dataset commands upload/download one JSONL file of a repo")


EVAL_RUN_FLAGS = (
    CONFIG,
    *SELECTORS,
    SEARCH_DIR,
    Flag(lambda p: p.add_argument("--no-serve", action="store_true", help="Collect against running servers.")),
    bool_flag("resume", "resume", "Resume from earlier rollouts (our default: +resume=true)."),
    value_flag("agent", "agent_name", "Agent to collect rollouts with.", aliases=("-a",)),
    value_flag("input", "input_jsonl_fpath", "Input tasks JSONL file.", aliases=("-i",)),
    OUTPUT,
    value_flag("limit", "limit", "Maximum number of tasks to run."),
    value_flag("num-repeats", "num_repeats", "Number of rollouts per task."),
    value_flag("concurrency", "num_samples_in_parallel", "Maximum number of concurrent samples."),
    value_flag("split", "split", "Dataset split to use (train, validation, or benchmark)."),
    *MODEL_FLAGS,
    value_flag("temperature", "responses_create_params.temperature", "Sampling temperature."),
    value_flag("top-p", "responses_create_params.top_p", "Nucleus sampling top-p."),
    value_flag("max-output-tokens", "responses_create_params.max_output_tokens", "Maximum output tokens."),
    value_flag("prompt-config", "prompt_config", "Prompt template YAML to apply."),
    bool_flag("interleave-repeats", "interleave_repeats", "Start the repeats round by round (abcabc)."),
    refused("disable-aggregation", "our collector always writes the aggregate metrics", takes_value=False),
    ALLOW_UNSUPPORTED_PAIRING,
    refused("no-health-check", _NO_HEALTH, takes_value=False),
    refused("health-check-workers", _NO_HEALTH),
    refused("health-check-ignore", _NO_HEALTH),
)


def _eval_run_command(args: argparse.Namespace) -> str:
    if args.no_serve:
        if args.split is not None or any(getattr(args, f.replace("-", "_")) for f in ("config", "benchmark")):
            raise GymUsageError("--no-serve collects --input through running servers: --split/--config do not apply")
        return "collect_rollouts"
    return "e2e_collect_rollouts"


def _storage(hf: str, gitlab: str) -> Callable[[argparse.Namespace], str]:
    return lambda args: hf if args.storage == "hf" else gitlab


def _env_init_command(args: argparse.Namespace) -> str:
    if args.environment and args.resources_server:
        raise GymUsageError(
            "--environment scaffolds its own resources server: give --environment or --resources-server"
        )
    if not args.environment and (args.profile or args.reward_range or args.higher_is_better is not None):
        raise GymUsageError("--profile and the reward options require --environment")  # 0.7.0's rule
    return "init_environment" if args.environment else "init_resources_server"


def _profile(args: argparse.Namespace) -> list[str]:
    """`--profile`: the one integration profile our scaffold writes, `custom-gym-verifier` (nothing to translate)."""
    if args.profile not in (None, "custom-gym-verifier"):
        raise GymUsageError(
            f"--profile {args.profile} is not supported: the scaffold is a resources server whose /verify scores"
            " simple_agent's rollouts (custom-gym-verifier)"
        )
    return []


PROFILE = Flag(
    lambda p: p.add_argument(
        "--profile",
        choices=("custom-gym-verifier", "custom-gym-agent-loop", "external-agent-loop", "external-rollout-driver"),
        help="Integration profile of the manifest-backed scaffold (custom-gym-verifier only).",
    ),
    _profile,
)
REWARD_RANGE = Flag(
    lambda p: p.add_argument(
        "--reward-range", nargs=2, type=float, metavar=("LOW", "HIGH"), help="Declared inclusive reward range."
    ),
    lambda a: [f"+reward_range=[{a.reward_range[0]},{a.reward_range[1]}]"] if a.reward_range else [],
)


def _register_reward_direction(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--higher-is-better", dest="higher_is_better", action="store_true", default=None)
    group.add_argument("--lower-is-better", dest="higher_is_better", action="store_false")


REWARD_DIRECTION = Flag(
    _register_reward_direction,
    lambda a: [f"+higher_is_better={str(a.higher_is_better).lower()}"] if a.higher_is_better is not None else [],
)


def _env_test_command(args: argparse.Namespace) -> str:
    if args.onboarding_name and (args.all or args.resources_server):
        raise GymUsageError("a workload name tests its own resources server: no --all or --resources-server with it")
    if args.onboarding_name:
        return "test"
    if args.all and args.resources_server:
        raise GymUsageError("--all tests every resources server, so it cannot be combined with a named target")
    if not (args.all or args.resources_server):
        raise GymUsageError("requires a target: --resources-server NAME, or --all to test every resources server")
    return "test_all" if args.all else "test"


def _workload_server(args: argparse.Namespace) -> list[str]:
    """`gym env test NAME`: the manifest of catalog entry NAME checked (as `gym env validate NAME`), then the tests,
    verifier cases and conformance checks of its resources server (ng_test of that folder)."""
    if not args.onboarding_name:
        return []
    from nemo_gym.cli.validate import catalog_manifest  # the catalog and the config loader: not at gym's start-up
    from nemo_gym.common.errors import ConfigError, DataError
    from nemo_gym.datasets.manifest_checks import validate_manifest

    try:
        report = validate_manifest(catalog_manifest(args.onboarding_name, args.kind))
    except (ConfigError, DataError) as exc:
        raise GymUsageError(str(exc)) from None
    if report.resources_server_dir is None:
        raise GymUsageError(f"{args.onboarding_name!r}: its composition has no resources server to test")
    return [f"+entrypoint={report.resources_server_dir}"]


_VALIDATE_NAME = Flag(
    lambda p: p.add_argument(
        "onboarding_name", nargs="?", metavar="NAME", help="Catalog entry whose manifest to check."
    ),
    lambda a: (
        []
        if not a.onboarding_name
        else [a.onboarding_name if "=" in a.onboarding_name else f"+onboarding_name={a.onboarding_name}"]
    ),
)

# the flags of `dataset upload` and `dataset migrate` (an upload to HF of a file GitLab holds)
_UPLOAD_FLAGS = (
    value_flag("input", "input_jsonl_fpath", "Local JSONL file to upload.", aliases=("-i",)),
    value_flag("name", "dataset_name", "Dataset name."),
    value_flag("revision", "version", "Dataset version (GitLab)."),
    _hf_only_refused("split"),
    refused("create-pr", "nemo_gym's upload commits directly", takes_value=False),
)

ROUTES: dict[str, Route] = {
    **LISTING_ROUTES,
    "dataset upload": Route(
        "Upload a JSONL dataset to HF (default) or GitLab (ng_upload_dataset_to_hf / _gitlab).",
        _storage("upload_dataset_to_hf", "upload_dataset_to_gitlab"),
        (STORAGE, *_UPLOAD_FLAGS),
    ),
    "dataset download": Route(
        "Download a dataset file from HF (default) or GitLab (ng_download_dataset_from_hf / _gitlab).",
        _storage("download_dataset_from_hf", "download_dataset_from_gitlab"),
        (
            STORAGE,
            value_flag("repo-id", "repo_id", "HF repo id, e.g. org/dataset (HF only)."),
            value_flag("name", "dataset_name", "Dataset name (GitLab only)."),
            value_flag("revision", "version", "Dataset version (GitLab only)."),
            value_flag("artifact", "artifact_fpath", "Remote file to fetch."),
            value_flag("output", "output_fpath", "Local destination file.", aliases=("-o",)),
            _hf_only_refused("output-dir"),
            _hf_only_refused("split"),
        ),
    ),
    "dataset rm": Route(
        "Delete a dataset from GitLab (ng_delete_dataset_from_gitlab).",
        "delete_dataset_from_gitlab",
        (value_flag("name", "dataset_name", "Name of the dataset to delete."),),
    ),
    "dataset migrate": Route(
        "Move a dataset from GitLab to HF (ng_gitlab_to_hf_dataset).",
        "gitlab_to_hf_dataset",
        _UPLOAD_FLAGS,
    ),
    "dataset render": Route(
        "Apply a prompt template to raw JSONL (ng_materialize_prompts).",
        "materialize_prompts",
        (
            value_flag("input", "input_jsonl_fpath", "Raw input JSONL file.", aliases=("-i",)),
            value_flag("prompt-config", "prompt_config", "Prompt template YAML to apply."),
            OUTPUT,
            SEARCH_DIR,
        ),
    ),
    "dataset collate": Route(
        "Validate and collate the datasets of a config (ng_prepare_data).",
        "prepare_data",
        (
            CONFIG,
            SELECTORS[2],
            SELECTORS[3],
            SEARCH_DIR,
            value_flag("mode", "mode", "Data preparation mode.", choices=("train_preparation", "example_validation")),
            value_flag("output-dir", "output_dirpath", "Output directory for the prepared data."),
            bool_flag("download", "should_download", "Download source datasets before collating."),
        ),
    ),
    "env init": Route(
        "Scaffold a resources server (ng_init_resources_server), or a manifest-backed environment and its server"
        " (--environment: ng_init_environment).",
        _env_init_command,
        (
            RESOURCES_SERVER,
            value_flag("environment", "name", "Scaffold environments/NAME/ (manifest, config, data) and its server."),
            refused("benchmark", "benchmark scaffolds (a prepare script, a canonical split) are not offered"),
            PROFILE,
            refused(
                "reuse-verifier",
                "the scaffold writes its own resources server; to reuse one, name it in the config's resources_server",
            ),
            REWARD_RANGE,
            REWARD_DIRECTION,
        ),
    ),
    "env publish": Route(
        "The local checks before publishing a catalog entry: manifest, server tests and verifier cases, placeholders,"
        " catalog (ng_publish_environment).",
        "publish_environment",
        (
            Flag(
                lambda p: p.add_argument("onboarding_name", metavar="NAME", help="Catalog entry to check."),
                lambda a: [f"+onboarding_name={a.onboarding_name}"],
            ),
            CATALOG_KIND,
            JSON,
            SEARCH_DIR,
        ),
    ),
    "env resolve": Route("Print the resolved config (ng_dump_config).", "dump_config", (CONFIG, SEARCH_DIR)),
    "env validate": Route(
        "Check a config without starting servers (ng_validate).",
        "validate",
        (
            _VALIDATE_NAME,
            CATALOG_KIND,
            value_flag("manifest", "manifest_path", "Manifest to check (instead of a catalog name)."),
            bool_flag("sync", "sync", "Rewrite a stale manifest's mirrored fields from its config."),
            JSON,
            bool_flag("strict", "strict", "Fail instead of warning on values left undefined."),
            CONFIG,
            *SELECTORS,
            SEARCH_DIR,
            *MODEL_FLAGS,
            ALLOW_UNSUPPORTED_PAIRING,
        ),
    ),
    "env packages": Route(
        "List the packages of a resources server's environment (ng_pip_list).",
        "pip_list",
        (
            RESOURCES_SERVER,
            SEARCH_DIR,
            bool_flag("outdated", "outdated", "List only outdated packages."),
            Flag(
                lambda p: p.add_argument(
                    "--json", action="store_true", default=argparse.SUPPRESS, help="Output the package list as JSON."
                ),
                lambda a: ["+format=json"] if getattr(a, "json", False) else [],
            ),
        ),
    ),
    "env test": Route(
        "Test a resources server, or all of them (ng_test / ng_test_all).",
        _env_test_command,
        (
            Flag(
                lambda p: p.add_argument(
                    "onboarding_name", nargs="?", metavar="NAME", help="Catalog entry (manifest) whose server to test."
                ),
                _workload_server,
            ),
            Flag(lambda p: p.add_argument("--kind", choices=("environment", "benchmark"), help="Workload kind.")),
            refused(
                "update-expected",
                "verifier cases' expected rewards are their author's: edit tests/verifier_cases.jsonl",
                takes_value=False,
            ),
            RESOURCES_SERVER,
            Flag(lambda p: p.add_argument("--all", action="store_true", help="Test every resources server.")),
            SEARCH_DIR,
            refused("json", "the tests' own pytest output is the report", takes_value=False),
        ),
    ),
    "env schema": Route(
        "Print a resources server's dataset-row schema as JSON Schema (ng_row_schema).",
        "row_schema",
        (RESOURCES_SERVER, SEARCH_DIR),
    ),
    "env start": Route(
        "Start the servers (ng_run).", "run", (CONFIG, *SELECTORS, SEARCH_DIR, *MODEL_FLAGS, ALLOW_UNSUPPORTED_PAIRING)
    ),
    "env prefetch": Route(
        "Build every server's environment (and vllm_model's engine and model) without starting any (ng_prefetch).",
        "prefetch",
        (CONFIG, *SELECTORS, SEARCH_DIR, *MODEL_FLAGS, ALLOW_UNSUPPORTED_PAIRING),
    ),
    "env status": Route("Print the server status (ng_status).", "status", (JSON,)),
    "eval prepare": Route(
        "Prepare benchmark data: not supported, says why (ng_prepare_benchmark).",
        "prepare_benchmark",
        (CONFIG, SELECTORS[0], SEARCH_DIR),
    ),
    "eval run": Route(
        "Prepare data, start servers and collect rollouts (ng_e2e_collect_rollouts); --no-serve: collect only"
        " (ng_collect_rollouts).",
        _eval_run_command,
        EVAL_RUN_FLAGS,
    ),
    "eval aggregate": Route(
        "Merge rollout shards and write their aggregate metrics (ng_aggregate_rollouts).",
        "aggregate_rollouts",
        (
            refused("config", "the metrics come from the running ng_run's agents (or local statistics), not a config"),
            value_flag("input-glob", "input_glob", "Glob(s) of the rollout shards.", aliases=("-i",)),
            value_flag("output", "output_jsonl_fpath", "Merged rollouts file.", aliases=("-o",)),
            refused("no-health-check", _NO_HEALTH, takes_value=False),
            refused("health-check-workers", _NO_HEALTH),
            refused("health-check-ignore", _NO_HEALTH),
        ),
    ),
    "eval profile": Route(
        "Reward profile from rollouts (ng_reward_profile).",
        "reward_profile",
        (
            value_flag("inputs", "materialized_inputs_jsonl_fpath", "Materialized inputs JSONL."),
            value_flag("rollouts", "rollouts_jsonl_fpath", "Rollouts JSONL."),
        ),
    ),
    "eval reverify": Route(
        "Score rollouts again with the running resources servers (ng_reverify; start them first: gym env start).",
        "reverify",
        (
            value_flag("rollouts", "rollouts_jsonl_fpath", "Rollouts JSONL to re-verify."),
            value_flag("output", "output_jsonl_fpath", "Output JSONL with recomputed rewards.", aliases=("-o",)),
            value_flag("concurrency", "num_samples_in_parallel", "Maximum number of concurrent samples."),
            value_flag("limit", "limit", "Maximum number of rollouts to re-verify."),
            bool_flag("overwrite", "overwrite", "Replace an existing output file."),
            *(refused(flag, _REVERIFY_SERVERS) for flag in ("config", "benchmark", "environment", "model-type")),
            *(refused(flag, _REVERIFY_SERVERS) for flag in ("resources-server", "search-dir")),
            value_flag("inputs", "materialized_inputs_jsonl_fpath", "Materialized inputs JSONL."),
            value_flag("input-format", "input_format", "Reverification input format.", choices=("gym", "atif")),
            value_flag(
                "atif-manifest",
                "atif_manifest_jsonl_fpath",
                "Manifest joining ATIF trajectories to materialized inputs.",
            ),
            refused(
                "force",
                "no reverify-mode guard to override: a stateful server scores the replayed session",
                takes_value=False,
            ),
            refused("resume", "a re-verification is rerun whole (--overwrite replaces its output)", takes_value=False),
            refused("disable-aggregation", "ng_reverify writes no aggregate metrics", takes_value=False),
            *(refused(flag, _NO_JUDGE_RECOVERY, takes_value=False) for flag in ("judge-failed-only", "append")),
        ),
    ),
    "eval export": Route(
        "Export rollouts as ATIF trajectories, a JSON file each and a manifest in a new folder (ng_export_atif).",
        "export_atif",
        (
            value_flag("format", "format", "Output trajectory format.", choices=("atif",)),
            value_flag("rollouts", "rollouts_jsonl_fpath", "Rollouts JSONL to export."),
            value_flag("output-dir", "output_dirpath", "New directory for the exported trajectories."),
            value_flag("session-id", "session_id", "Stable identifier of the run the rollouts come from.", quote=True),
            value_flag(
                "agent-version", "agent_version", "Version of the agent that produced the rollouts.", quote=True
            ),
        ),
    ),
    "eval compare": Route(
        "Compare a candidate run's rollouts with a baseline run's, task by task: pass@k and mean reward side by side,"
        " the paired difference with its bootstrap interval, per-task changes (ng_eval +from_rollouts"
        " +baseline_rollouts).",
        "eval",
        (
            value_flag("baseline", "baseline_rollouts", "Baseline run's rollouts JSONL."),
            CANDIDATES,
            COMPARE_OUTPUT_DIR,
            refused("baseline-agg-metrics", _FROM_ROLLOUTS),
            refused("candidates-agg-metrics", _FROM_ROLLOUTS),
            refused("agent", _ALL_AGENTS),
            refused("baseline-agent", _ALL_AGENTS),
            refused("candidate-agents", _ALL_AGENTS),
            refused("report-format", "the report is ng_eval's JSON, and its table on the console"),
        ),
    ),
    "dev test": Route("Run the core tests with coverage (ng_dev_test).", "dev_test"),
}

UNSUPPORTED: dict[str, str] = {
    "eval health-check": _NO_HEALTH,
    "eval submit": "Slurm job submission is not implemented (ng_serve runs jobs on Ray)",
}
GROUPS = {
    "list": "List available components (benchmarks, environments, agents, models, resources-servers).",
    "dataset": "Manage datasets.",
    "env": "Develop and run environments.",
    "eval": "Run evaluations.",
    "dev": "Contributor helpers.",
    "search": "Search available components (environments, benchmarks, resources-servers, agents, models).",
}


class _Parser(argparse.ArgumentParser):
    """exit status 2 with the message, as argparse, for our own usage errors too."""


def build_parser(prog: str = "gym") -> argparse.ArgumentParser:
    """0.7.0's parser, with the supported subcommands only (the others are listed in the epilog)."""
    epilog = "not supported (exit 2):\n" + "\n".join(f"  {prog} {k}: {why}" for k, why in UNSUPPORTED.items())
    parser = _Parser(prog=prog, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="Show the nemo_gym version and exit (ng_version).")
    parser.add_argument("--json", action="store_true", help="With --version: output JSON.")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.set_defaults(_parser=parser, _route=None)
    top = parser.add_subparsers(metavar="{" + ",".join(GROUPS) + "}")
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, route in ROUTES.items():
        group, action = name.split()
        if group not in groups:
            group_parser = top.add_parser(group, help=GROUPS[group], description=GROUPS[group])
            group_parser.set_defaults(_parser=group_parser)
            groups[group] = group_parser.add_subparsers(metavar="ACTION")
        leaf = groups[group].add_parser(action, help=route.summary, description=route.summary)
        leaf.set_defaults(_route=route, _parser=leaf)
        # SUPPRESS: a `-v` given before the subcommand is kept (0.7.0's rule)
        leaf.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        for flag in route.flags:
            flag.register(leaf)
    return parser


# the kinds `gym search` names, supported or not (0.7.0's `gym search [<kind>] <query>`)
SEARCH_KINDS = frozenset(key.split()[1] for key in [*ROUTES, *UNSUPPORTED] if key.startswith("search "))


def _with_search_kind(argv: list[str]) -> list[str]:
    """`gym search QUERY` (no kind) as `gym search catalog QUERY`: 0.7.0 searches its whole catalog."""
    words = [i for i, a in enumerate(argv) if not a.startswith("-")]
    if len(words) > 1 and argv[words[0]] == "search" and argv[words[1]] not in SEARCH_KINDS:
        return [*argv[: words[0] + 1], CATALOG_SEARCH.split()[1], *argv[words[0] + 1 :]]
    return argv


def _unsupported(argv: list[str], prog: str) -> str | None:
    words = [a for a in argv if not a.startswith("-")][:2]
    for key in (" ".join(words), words[0] if words else ""):
        if key in UNSUPPORTED:
            return f"{prog}: `{prog} {key}` is not supported: {UNSUPPORTED[key]}"
    return None


@contextmanager
def _log_level(verbose: bool):
    """`-v`: DEBUG logging in this process and `$NEMO_GYM_LOG_LEVEL=debug` for the servers and engines it starts, while
    the command runs."""
    before, root = os.environ.get(LOG_LEVEL_ENV), logging.getLogger()
    level = root.level
    if verbose:
        logging.basicConfig()  # a stderr handler, unless the root logger has one
        root.setLevel(logging.DEBUG)
        os.environ[LOG_LEVEL_ENV] = "debug"
    try:
        yield
    finally:
        root.setLevel(level)
        if verbose and before is None:
            del os.environ[LOG_LEVEL_ENV]
        elif verbose:
            os.environ[LOG_LEVEL_ENV] = before


@contextmanager
def _extra_roots(search_dirs: list[str] | None):
    """`--search-dir`s first in `$NEMO_GYM_EXTRA_ROOTS` while the command runs (as 0.7.0 passes them on)."""
    before = os.environ.get("NEMO_GYM_EXTRA_ROOTS")
    if search_dirs:
        os.environ["NEMO_GYM_EXTRA_ROOTS"] = os.pathsep.join([*search_dirs, *([before] if before else [])])
    try:
        yield
    finally:
        if search_dirs and before is None:
            del os.environ["NEMO_GYM_EXTRA_ROOTS"]
        elif search_dirs:
            os.environ["NEMO_GYM_EXTRA_ROOTS"] = before


def run_named(name: str, argv: list[str]) -> int:
    """Run our command `name` (one of COMMANDS or the legacy ones) with `argv`."""
    return run_legacy_command(name, argv) if name in LEGACY_COMMANDS else run_command(name, argv)


def gym_main(argv: list[str], prog: str = "gym") -> int:
    """`gym <group> <action> [flags] [+key=value ...]`. Returns the exit status (2: a usage error or a subcommand
    we do not support)."""
    argv = _with_search_kind(argv)
    message = _unsupported(argv, prog)
    if message:
        print(message, file=sys.stderr)
        return 2
    parser = build_parser(prog)
    try:
        args, overrides = parser.parse_known_args(argv)
        unknown = [token for token in overrides if token.startswith("-")]
        if unknown:
            args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.version:
            return run_command("version", ["+json=true"] if args.json else [])
        route: Route | None = args._route
        if route is None:
            args._parser.print_help()
            return 1
        if args.json and not any("--json" in a.option_strings for a in args._parser._actions):
            args._parser.error("--json applies to --version and to reporting commands (list benchmarks, env status)")
        translated = [token for flag in route.flags for token in flag.translate(args)]
        name = route.command(args) if callable(route.command) else route.command
    except GymUsageError as exc:
        args._parser.print_usage(sys.stderr)
        print(f"{args._parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse's own exit (--help: 0, a usage error: 2)
        return int(exc.code or 0)
    with _extra_roots(getattr(args, "search_dir", None)), _log_level(args.verbose):
        return run_named(name, merge_config_paths(translated + overrides))


def ng_main(argv: list[str]) -> int:
    """`ng`: 0.7.0's `gym` subcommands (`ng eval run ...`), or one of our commands by name (`ng run ...`,
    `ng_run`, `nemo_gym_run`) as before; with no arguments or `--help`, our command list, then `gym --help`'s
    pointer."""
    first = argv[0] if argv else "--help"
    if first in GROUPS or first in UNSUPPORTED or first in ("--version", "--json"):
        return gym_main(argv, prog="ng")
    name = first.removeprefix("nemo_gym_").removeprefix("ng_")
    if name in LEGACY_COMMANDS:
        return run_legacy_command(name, argv[1:])
    status = dispatch(argv)
    if first in ("--help", "-h") or not argv:
        for command in LEGACY_COMMANDS.values():
            print(f"  ng_{command.name:<22} {command.summary}")
        print("NeMo Gym 0.7.0's subcommands (ng eval run, ng env start, ...): see gym --help")
    return status
