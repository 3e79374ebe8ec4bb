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

from nemo_gym.cli.gym_eval import EVAL_ROUTES
from nemo_gym.cli.gym_flags import (
    ALLOW_UNSUPPORTED_PAIRING,
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


VERBOSE_HELP = "Set logging level to DEBUG (and $NEMO_GYM_LOG_LEVEL=debug for the servers it starts)."
LOG_LEVEL_ENV = "NEMO_GYM_LOG_LEVEL"  # the servers' log level (nemo_gym.serving.entrypoint)
RESOURCES_SERVER = Flag(
    lambda p: p.add_argument("--resources-server", metavar="NAME", help="Name of the resources server."),
    lambda a: [f"+entrypoint=resources_servers/{a.resources_server}"] if a.resources_server else [],
)
STORAGE = Flag(lambda p: p.add_argument("--storage", choices=("hf", "gitlab"), default="hf", help="Storage backend."))
OUTPUT = value_flag("output", "output_jsonl_fpath", "Output JSONL file.", aliases=("-o",))


def _hf_only_refused(name: str) -> Flag:
    return refused(name, "nemo_gym's Hugging Face dataset commands upload/download one JSONL file of a repo")


def _storage(hf: str, gitlab: str) -> Callable[[argparse.Namespace], str]:
    return lambda args: hf if args.storage == "hf" else gitlab


def _env_init_command(args: argparse.Namespace) -> str:
    chosen = [
        f"--{flag}" for flag in ("environment", "benchmark", "resources-server") if vars(args)[flag.replace("-", "_")]
    ]
    if len(chosen) > 1:
        raise GymUsageError(
            f"{' and '.join(chosen)}: each scaffolds its own resources server: give one of --environment, --benchmark"
            " or --resources-server"
        )
    manifest = args.environment or args.benchmark
    if not manifest and (args.profile or args.reward_range or args.higher_is_better is not None or args.reuse_verifier):
        raise GymUsageError(  # 0.7.0's rule
            "--profile, --reuse-verifier and the reward options require --environment or --benchmark"
        )
    return "init_benchmark" if args.benchmark else "init_environment" if args.environment else "init_resources_server"


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
    from nemo_gym.common.errors import ConfigError, DataError  # the catalog and the config loader: not at start-up
    from nemo_gym.datasets.catalog import manifest_entry
    from nemo_gym.datasets.manifest_checks import validate_manifest

    try:
        report = validate_manifest(manifest_entry(args.onboarding_name, args.kind).manifest_path)
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
        " (--environment: ng_init_environment), or a benchmark and its exact-answer server (--benchmark:"
        " ng_init_benchmark).",
        _env_init_command,
        (
            RESOURCES_SERVER,
            value_flag("environment", "name", "Scaffold environments/NAME/ (manifest, config, data) and its server."),
            value_flag(
                "benchmark",
                "name",
                "Scaffold benchmarks/NAME/ (manifest, config, prompt, prepare.py, data), its server.",
            ),
            PROFILE,
            value_flag(
                "reuse-verifier",
                "reuse_verifier",
                "Grade it with this existing resources server (resources_servers/NAME/) instead of a new one.",
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
    **EVAL_ROUTES,
    "dev test": Route("Run the core tests with coverage (ng_dev_test).", "dev_test"),
}

UNSUPPORTED: dict[str, str] = {
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
def _environ(name: str, value: str | None):
    """`$name` set to `value` while the block runs, then as it was (nothing is changed for a `value` of None)."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None and before is None:
            del os.environ[name]
        elif value is not None:
            os.environ[name] = before


@contextmanager
def _log_level(verbose: bool):
    """`-v`: DEBUG logging in this process and `$NEMO_GYM_LOG_LEVEL=debug` for the servers and engines it starts, while
    the command runs."""
    root = logging.getLogger()
    level = root.level
    if verbose:
        logging.basicConfig()  # a stderr handler, unless the root logger has one
        root.setLevel(logging.DEBUG)
    try:
        with _environ(LOG_LEVEL_ENV, "debug" if verbose else None):
            yield
    finally:
        root.setLevel(level)


def _extra_roots(search_dirs: list[str] | None):
    """`--search-dir`s first in `$NEMO_GYM_EXTRA_ROOTS` while the command runs (as 0.7.0 passes them on)."""
    before = os.environ.get("NEMO_GYM_EXTRA_ROOTS")
    roots = os.pathsep.join([*search_dirs, *([before] if before else [])]) if search_dirs else None
    return _environ("NEMO_GYM_EXTRA_ROOTS", roots)


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
