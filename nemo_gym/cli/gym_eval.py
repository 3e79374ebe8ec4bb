"""The `gym eval ...` routes of `nemo_gym.cli.gym_router`: collection (ng_e2e_collect_rollouts, ng_collect_rollouts),
aggregation, reward profiles, re-verification, ATIF export, rollout health checks (ng_health_check) and the comparison
of two runs (ng_eval)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_gym.cli.gym_flags import (
    ALLOW_UNSUPPORTED_PAIRING,
    CONFIG,
    JSON,
    MODEL_FLAGS,
    SEARCH_DIR,
    SELECTORS,
    Flag,
    GymUsageError,
    Route,
    bool_flag,
    quoted,
    refused,
    value_flag,
)

__all__ = ["EVAL_ROUTES", "NO_HEALTH"]

_REVERIFY_SERVERS = "ng_reverify verifies with the servers already running: start them with gym env start (ng_run)"
NO_HEALTH = (
    "ng_aggregate_rollouts runs no rollout health checks: run gym eval health-check RUN_DIR (ng_health_check) on the"
    " merged rollouts"
)
_NO_JUDGE_RECOVERY = "no judge-failure recovery: a failed re-verification is in the failures file; rerun it whole"
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


EVAL_RUN_FLAGS = (
    CONFIG,
    *SELECTORS,
    SEARCH_DIR,
    Flag(lambda p: p.add_argument("--no-serve", action="store_true", help="Collect against running servers.")),
    bool_flag("resume", "resume", "Resume from earlier rollouts (our default: +resume=true)."),
    value_flag("agent", "agent_name", "Agent to collect rollouts with.", aliases=("-a",)),
    value_flag("input", "input_jsonl_fpath", "Input tasks JSONL file.", aliases=("-i",)),
    value_flag("output", "output_jsonl_fpath", "Output JSONL file.", aliases=("-o",)),
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
    # the health checks run after a collection with +observability_enabled=true (they read its capture records)
    bool_flag("no-health-check", "disable_health_check", "No rollout health checks after the collection."),
    value_flag("health-check-workers", "health_check_workers", "Processes of the rollout health checks."),
    value_flag(
        "health-check-ignore",
        "health_check_ignored_checks",
        "Comma-separated health check ids to leave out of the verdicts.",
        quote=True,
    ),
)


def _health_check_files(args: argparse.Namespace) -> list[str]:
    """RUN_DIR and `--rollouts-file` (default rollouts.jsonl; a relative path is under RUN_DIR) -> the rollouts file,
    the reports into RUN_DIR (0.7.0's `health_check_run_dir`)."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise GymUsageError(f"run directory not found: {run_dir}")
    rollouts = run_dir / (args.rollouts_file or "rollouts.jsonl")  # an absolute --rollouts-file stays itself
    return [f"+rollouts_jsonl_fpath={quoted(str(rollouts))}", f"+output_dirpath={quoted(str(run_dir))}"]


HEALTH_CHECK_FLAGS = (
    Flag(
        lambda p: (
            p.add_argument("run_dir", metavar="RUN_DIR", help="Run directory: the reports are written there."),
            p.add_argument(
                "--rollouts-file", metavar="PATH", help="Rollouts JSONL, relative to RUN_DIR (rollouts.jsonl)."
            ),
        ),
        _health_check_files,
    ),
    value_flag("workers", "workers", "Number of worker processes."),
    value_flag(
        "ignore-checks",
        "ignored_checks",
        "Comma-separated check ids to leave out of the verdicts.",
        aliases=("--ignore",),
        quote=True,
    ),
    JSON,
)


def _eval_run_command(args: argparse.Namespace) -> str:
    if args.no_serve:
        if args.split is not None or any(getattr(args, f.replace("-", "_")) for f in ("config", "benchmark")):
            raise GymUsageError("--no-serve collects --input through running servers: --split/--config do not apply")
        return "collect_rollouts"
    return "e2e_collect_rollouts"


EVAL_ROUTES: dict[str, Route] = {
    "eval prepare": Route(
        "Prepare benchmark data: run the prepare.py of each dataset of the config that has one (ng_prepare_benchmark).",
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
            refused("no-health-check", NO_HEALTH, takes_value=False),
            refused("health-check-workers", NO_HEALTH),
            refused("health-check-ignore", NO_HEALTH),
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
    "eval health-check": Route(
        "Rollout health checks of a run directory's rollouts: a verdict per rollout from its capture record, the"
        " quality summary and verdicts files (ng_health_check).",
        "health_check",
        HEALTH_CHECK_FLAGS,
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
}
