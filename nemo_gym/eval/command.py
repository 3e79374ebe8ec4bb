"""`ng_eval`: collect `num_samples` rollouts of each task with the collector (`nemo_gym.collect.command`: same files,
resume and failures file) or read an earlier rollouts file (`+from_rollouts=`), score them
(`nemo_gym.eval.evaluation`: pass@k, pass^k, mean reward), print the table and write the JSON report.

With `+baseline_rollouts=<before.jsonl>` the report also scores that file (same ks and threshold) and compares the two
(`nemo_gym.eval.evaluation.compare`). With `+baseline_agent_name=<agent>` as well, ng_eval collects the baseline
itself: the same tasks, samples and sampling parameters through that agent (two policies served side by side in one
ng_run, each behind its own agent), then the candidate through `agent_name`; each file resumes.

`max_turns` is not sent: neither bundled agent takes a per-request turn limit (simple_agent reads `max_steps`,
gymnasium_agent `max_turns`, both from their config at `ng_run` time). It is recorded in the JSON with
`applied: false` and a warning says how to set it on the agent.

Exit status of `eval_main`: 0 every task scored, 1 some tasks excluded (the report is still written),
130 interrupted while collecting (rerun to resume). Configuration and data errors raise `NemoGymError`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import AGENT_REF_KEY, iter_jsonl, write_json
from nemo_gym.eval.bootstrap_ci import DEFAULT_RESAMPLES
from nemo_gym.eval.evaluation import compare, evaluate, load_task_results, resolve_both_ks, resolve_ks
from nemo_gym.eval.table import print_report
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import discover_head_url

__all__ = ["EvalConfig", "eval_main"]


class EvalConfig(BaseModel):
    """Parameters of `ng_eval`."""

    model_config = ConfigDict(extra="forbid")
    input_jsonl_fpath: str | None = Field(
        None,
        description=(
            "tasks to collect: one row a line with responses_create_params (and agent_ref); not with from_rollouts"
        ),
    )
    agent_name: str | None = Field(
        None, description="agent instance for rows without an agent_ref (a row's own agent_ref wins)"
    )
    num_samples: int = Field(8, ge=1, description="rollouts per task (n of pass@k); collection only")
    max_samples: int | None = Field(None, ge=1, description="evaluate only the first max_samples tasks")
    k: list[int] | None = Field(
        None, description="the k of pass@k and pass^k, each 1 <= k <= n; default [1, 4, 8] without those above n"
    )
    temperature: float | None = Field(
        None,
        ge=0,
        description="sampling temperature sent to the model (responses_create_params.temperature); default: the row's",
    )
    max_output_tokens: int | None = Field(
        None, ge=1, description="output token limit per model call (responses_create_params.max_output_tokens)"
    )
    max_turns: int | None = Field(
        None,
        ge=1,
        description=(
            "NOT sent: the bundled agents take their turn limit from their config (simple_agent max_steps); recorded"
            " with applied: false"
        ),
    )
    pass_threshold: float = Field(1.0, description="a sample passes when reward >= pass_threshold")
    head_server_url: str | None = Field(
        None, description="head server URL; default $NEMO_GYM_HEAD_URL or the only running ng_run"
    )
    output_json_fpath: str | None = Field(
        None, description="the report (JSON); default <rollouts stem>_eval.json next to the rollouts"
    )
    rollouts_jsonl_fpath: str | None = Field(
        None,
        description=(
            "where collected rollouts go (collector files and resume); default <output_json stem>_rollouts.jsonl"
        ),
    )
    from_rollouts: str | None = Field(None, description="evaluate this existing rollouts JSONL instead of collecting")
    baseline_rollouts: str | None = Field(
        None,
        description=(
            "also score this rollouts JSONL (e.g. the model before training) and compare: both side by side and the"
            " paired difference"
        ),
    )
    baseline_agent_name: str | None = Field(
        None,
        description=(
            "collect the baseline too: the same tasks through this agent (e.g. one whose model serves the policy before"
            " training) into baseline_rollouts (default <output_json stem>_baseline_rollouts.jsonl); the rows must"
            " carry no agent_ref"
        ),
    )
    bootstrap_resamples: int = Field(
        DEFAULT_RESAMPLES, ge=1, description="bootstrap resamples of the paired mean reward difference's 95 % interval"
    )
    num_samples_in_parallel: int = Field(32, ge=1, description="most rollouts in flight at once")
    resume: bool = Field(
        True, description="keep rollouts of an earlier run of the same command and collect only the missing ones"
    )
    progress: bool = Field(True, description="show a progress bar while collecting")


def _paths(cfg: EvalConfig) -> tuple[str, str, str | None]:
    """(rollouts JSONL, report JSON, baseline rollouts JSONL or None) of `cfg`, with defaults filled in.

    Raises:
        ConfigError: neither input_jsonl_fpath nor from_rollouts, or both; no path to write to; baseline_agent_name
            without input_jsonl_fpath.
    """
    if (cfg.input_jsonl_fpath is None) == (cfg.from_rollouts is None):
        raise ConfigError(
            "ng_eval: pass +input_jsonl_fpath=<tasks> to collect rollouts, or +from_rollouts=<rollouts.jsonl> to"
            " evaluate existing ones (not both)"
        )
    rollouts = cfg.from_rollouts or cfg.rollouts_jsonl_fpath
    if rollouts is None:
        if cfg.output_json_fpath is None:
            raise ConfigError(
                "ng_eval: pass +output_json_fpath=<report.json> (or +rollouts_jsonl_fpath=<rollouts.jsonl>)"
            )
        out = Path(cfg.output_json_fpath)
        rollouts = str(out.with_name(f"{out.stem}_rollouts.jsonl"))
    report = cfg.output_json_fpath or str(Path(rollouts).with_name(f"{Path(rollouts).stem}_eval.json"))
    baseline = cfg.baseline_rollouts
    if cfg.baseline_agent_name:
        if cfg.input_jsonl_fpath is None:
            raise ConfigError(
                "ng_eval: +baseline_agent_name collects the baseline from +input_jsonl_fpath=<tasks>; to compare two"
                " existing files pass +from_rollouts= and +baseline_rollouts="
            )
        baseline = baseline or str(Path(report).with_name(f"{Path(report).stem}_baseline_rollouts.jsonl"))
    return rollouts, report, baseline


def _check_rows_name_no_agent(cfg: EvalConfig) -> None:
    """With two agents chosen by name, a row's own agent_ref would send both collections to one agent.

    Raises:
        ConfigError: a row (of the first max_samples) has an agent_ref.
    """
    for line_no, row in iter_jsonl(cfg.input_jsonl_fpath, limit=cfg.max_samples):  # type: ignore[arg-type]  # set: _paths checked
        if row.get(AGENT_REF_KEY) is not None:
            raise ConfigError(
                f"{cfg.input_jsonl_fpath}:{line_no}: the row names its agent (agent_ref), so +agent_name and"
                " +baseline_agent_name would not choose the agents; remove agent_ref from the rows"
            )


def _collect(cfg: EvalConfig, rollouts_jsonl_fpath: str, agent_name: str | None) -> str:
    """Collect with the collector through `agent_name`; returns its summary text. Raises what `collect_rollouts`
    raises."""
    overrides = {key: value for key in ("temperature", "max_output_tokens") if (value := getattr(cfg, key)) is not None}
    collect_cfg = CollectConfig(
        agent_name=agent_name,
        input_jsonl_fpath=cfg.input_jsonl_fpath,
        output_jsonl_fpath=rollouts_jsonl_fpath,
        limit=cfg.max_samples,
        num_repeats=cfg.num_samples,
        num_samples_in_parallel=cfg.num_samples_in_parallel,
        responses_create_params=overrides,
        head_server_url=cfg.head_server_url,
        resume=cfg.resume,
        progress=cfg.progress,
    )
    head_url = discover_head_url(cfg.head_server_url)

    async def run() -> str:
        async with ServerClient(head_url, max_connections=max(64, 2 * cfg.num_samples_in_parallel)) as client:
            return (await collect_rollouts(collect_cfg, client)).format()

    return asyncio.run(run())


def eval_main(cfg: EvalConfig) -> int:
    """`ng_eval`: collect (or read) rollouts, print the table, write the JSON report; returns 0, 1 or 130."""
    rollouts, report_path, baseline_path = _paths(cfg)
    if cfg.from_rollouts is None and cfg.k is not None:
        resolve_ks(cfg.k, cfg.num_samples)  # a k above num_samples is an error before collecting anything
    if cfg.max_turns is not None:
        print(
            f"ng_eval: +max_turns={cfg.max_turns} is not applied: the agents take their turn limit from their config;"
            f" set it at ng_run, e.g. +<agent>.responses_api_agents.simple_agent.max_steps={cfg.max_turns}",
            file=sys.stderr,
        )
    if cfg.baseline_agent_name:
        _check_rows_name_no_agent(cfg)
    elif baseline_path:
        load_task_results(baseline_path, cfg.max_samples)  # a bad baseline file fails before collecting
    if cfg.from_rollouts is None:
        try:
            if cfg.baseline_agent_name:
                print(_collect(cfg, baseline_path, cfg.baseline_agent_name))  # type: ignore[arg-type]  # set with baseline_agent_name
            print(_collect(cfg, rollouts, cfg.agent_name))
        except KeyboardInterrupt:
            saved = f"{baseline_path} and {rollouts}" if cfg.baseline_agent_name else rollouts
            print(
                f"\nInterrupted: finished rollouts are saved in {saved}. Rerun the same command to resume.",
                file=sys.stderr,
            )
            return 130
    candidate = load_task_results(rollouts, cfg.max_samples)
    baseline = load_task_results(baseline_path, cfg.max_samples) if baseline_path else []
    ks = resolve_both_ks(candidate, baseline, cfg.k, baseline_path) if baseline_path else cfg.k
    report = evaluate(candidate, ks, cfg.pass_threshold)
    report = {
        **report,
        "rollouts_jsonl_fpath": rollouts,
        "max_turns": {"requested": cfg.max_turns, "applied": False},
        "config": cfg.model_dump(),
    }
    if baseline_path:
        report["comparison"] = {
            "baseline_rollouts_jsonl_fpath": baseline_path,
            "baseline_agent_name": cfg.baseline_agent_name,
            "baseline": evaluate(baseline, report["k"], cfg.pass_threshold),
            "paired": compare(candidate, baseline, report["k"], cfg.pass_threshold, cfg.bootstrap_resamples),
        }
    write_json(report_path, report)
    return print_report(report, report_path)
