"""Does an agent learn to use tools on 2 CPU cores? SmolLM2 on tool_calculator: baseline → SFT warm start → GRPO.

    .venv/bin/python benchmarks/learning_tool_agent.py [--budget-minutes 60]
    .venv/bin/python benchmarks/learning_tool_agent.py --report-only   # redo the figures from the last run

Environment: `resources_servers/tool_calculator` ("What is 347 * 29 + 518? Use the tools.": `multiply`, then `add`
on its result, then the number; half the tasks need only the product), 326 training and 74 held-out tasks with no
question in common. SmolLM2-135M-Instruct never calls a tool by itself (it writes `<tool_response>` blocks of its
own), so the pipeline is, every stage through the same servers and on the same 2 cores, within `--budget-minutes`:
  1. baseline: `ng_run` of tool_calculator + simple_agent + vllm_model (the embedded SmolLM2) + the scripted expert
     (`configs/tool_calculator_expert.yaml`); `ng_collect_rollouts` of the held-out tasks × `--eval-repeats`;
  2. expert: `ng_collect_rollouts` of `--sft-tasks` training tasks through the expert agent: scripted_model plays
     each row's script (`tasks.expert_row`) through simple_agent and the tool_calculator server;
  3. SFT: `ng_train` (configs/train/tool_agent_sft.yaml) on the expert rollouts with reward 1, tool calls in the
     Hermes format vllm_model renders and parses;
  4. RL: `ng_train` GRPO (configs/train/tool_agent_grpo.yaml) from the SFT model, vllm_model serving it, tools
     sampled freely (no tool_choice); held-out evaluation before the first step (= after SFT) and after the last;
     the steps stop once the budget left would not cover the last evaluation (`trainer.max_train_time_s`).
Sampling at temperature 1.0 everywhere, `--max-tokens` per model call.

Figures (printed, and in results/bench/tool_agent/summary.json): held-out mean reward and pass@1 before, after SFT and
after RL with 95 % intervals (percentile bootstrap over held-out tasks, 10,000 resamples; `learning_common`), the
paired gains (SFT over base, RL over SFT, RL over base) with theirs, tool calls and model turns per rollout at each
stage, the wall-time split and results/bench/tool_agent/reward_curve.png.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results/bench/tool_agent"
ENV = REPO / "resources_servers/tool_calculator"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning_common import compare, eval_files, format_comparison, plot_reward_curve, read_metrics  # noqa: E402

from nemo_gym.common.jsonl import read_jsonl, write_jsonl  # noqa: E402
from nemo_gym.env.trajectory import Trajectory  # noqa: E402

BIN = Path(sys.executable).parent
SERVERS = [
    ENV / "configs/tool_calculator_expert.yaml",
    REPO / "responses_api_models/vllm_model/configs/vllm_model.yaml",
]
POLICY_AGENT, EXPERT_AGENT = "tool_calculator_simple_agent", "tool_calculator_expert_agent"


def tasks_module() -> Any:
    from nemo_gym.serving.module_loading import import_file

    return import_file(ENV / "tasks.py")


# -- the pipeline ----------------------------------------------------------------------------------------------
class Stopwatch:
    """Wall seconds per stage, written to `OUT/timings.json` after each stage (a crashed run keeps what it did)."""

    def __init__(self, path: Path):
        self.path, self.seconds, self.started = path, {}, time.monotonic()

    def run(self, stage: str, work: Any) -> Any:
        began = time.monotonic()
        print(f"== {stage}", flush=True)
        try:
            return work()
        finally:
            self.seconds[stage] = time.monotonic() - began
            self.path.write_text(json.dumps(self.seconds, indent=2))

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


def collect(head_url: str, agent: str, rows: Path, out: Path, repeats: int, args: argparse.Namespace) -> None:
    command = [
        str(BIN / "ng_collect_rollouts"),
        f"+head_server_url={head_url}",
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={out}",
        f"+num_repeats={repeats}",
        f"+num_samples_in_parallel={args.parallel}",
        "+progress=false",
        "+resume=false",
        f"+responses_create_params={{temperature: 1.0, max_output_tokens: {args.max_tokens}}}",
    ]
    if subprocess.run(command, cwd=REPO).returncode != 0:
        raise SystemExit(f"ng_collect_rollouts failed ({agent})")


def ng_train(config: str, overrides: list[str]) -> None:
    command = [str(BIN / "ng_train"), f"+config_paths=[{config}]", *overrides]
    print("$ " + " ".join(command), flush=True)
    if subprocess.run(command, cwd=REPO).returncode != 0:
        raise SystemExit(f"ng_train failed ({config})")


def prepare_data(args: argparse.Namespace) -> None:
    tasks = tasks_module()
    train = read_jsonl(ENV / "data/train.jsonl")
    heldout = read_jsonl(ENV / "data/heldout.jsonl")[: args.heldout_limit]
    write_jsonl(OUT / "heldout.jsonl", heldout)
    write_jsonl(OUT / "expert_tasks.jsonl", [tasks.expert_row(row) for row in train[: args.sft_tasks]])
    print(
        f"{len(train)} training tasks ({args.sft_tasks} for the expert), {len(heldout)} held-out tasks (disjoint"
        " questions)",
        flush=True,
    )


def baseline_and_expert(args: argparse.Namespace, clock: Stopwatch) -> None:
    from nemo_gym.orchestration.server_processes import NgRunProcess

    servers = clock.run(
        "servers_start",
        lambda: NgRunProcess(
            [f"+config_paths=[{','.join(map(str, SERVERS))}]"], None, OUT / "ng_run.log", caller="benchmark"
        ),
    )
    try:
        clock.run(
            "baseline_eval",
            lambda: collect(
                servers.head_url, POLICY_AGENT, OUT / "heldout.jsonl", OUT / "baseline.jsonl", args.eval_repeats, args
            ),
        )
        clock.run(
            "expert_collection",
            lambda: collect(servers.head_url, EXPERT_AGENT, OUT / "expert_tasks.jsonl", OUT / "expert.jsonl", 1, args),
        )
    finally:
        clock.run("servers_stop", servers.stop)


def sft(args: argparse.Namespace) -> None:
    steps = max(1, args.sft_epochs * args.sft_tasks // args.sft_batch_size)
    ng_train(
        "configs/train/tool_agent_sft.yaml",
        [
            f"++trainer.input_jsonl_fpath={OUT / 'expert.jsonl'}",
            f"++trainer.output_dir={OUT / 'sft'}",
            "+overwrite=true",
            f"++trainer.num_steps={steps}",
            f"++trainer.batch_size={args.sft_batch_size}",
            f"++trainer.engine.learning_rate={args.sft_learning_rate}",
        ],
    )


def rl(args: argparse.Namespace, clock: Stopwatch) -> None:
    # Left for the steps: the budget minus what ran, the RL run's start-up (~the first ng_run's, plus the engine), its
    # two evaluations (the trained agent makes ~3 model calls per rollout where the base model makes 1, so ~2 baseline
    # evaluations each), the step that ends past the deadline (the loop stops after it: `max_train_time_s`) and a
    # margin.
    evaluation_s = max(2 * clock.seconds.get("baseline_eval", 60.0), 90.0)
    startup_s = clock.seconds.get("servers_start", 60.0) + 30
    left_s = args.budget_minutes * 60 - clock.elapsed_s() - startup_s - 2 * evaluation_s - args.step_reserve_s - 60
    if left_s < 60:
        raise SystemExit(f"--budget-minutes {args.budget_minutes}: only {left_s:.0f} s left for the RL steps")
    print(f"RL steps get at most {left_s / 60:.1f} min", flush=True)
    final = OUT / "sft" / "final"
    ng_train(
        "configs/train/tool_agent_grpo.yaml",
        [
            f"++trainer.output_dir={OUT / 'rl'}",
            "+overwrite=true",
            f"++trainer.engine.model_path={final}",
            f"++policy_model.responses_api_models.vllm_model.model={final}",
            f"++trainer.eval.input_jsonl_fpath={OUT / 'heldout.jsonl'}",
            f"++trainer.num_steps={args.steps}",
            f"++trainer.max_train_time_s={left_s}",
            f"++trainer.batch_size={args.tasks_per_step}",
            f"++trainer.group_size={args.group_size}",
            f"++trainer.num_samples_in_parallel={args.parallel}",
            f"++trainer.engine.learning_rate={args.learning_rate}",
            f"++trainer.eval.interval={args.eval_interval}",
            f"++trainer.eval.num_repeats={args.eval_repeats}",
            f"++trainer.responses_create_params.max_output_tokens={args.max_tokens}",
            f"++trainer.eval.responses_create_params.max_output_tokens={args.max_tokens}",
        ],
    )


def train(args: argparse.Namespace) -> None:
    subprocess.run(["rm", "-rf", str(OUT)], check=True)
    OUT.mkdir(parents=True)
    clock = Stopwatch(OUT / "timings.json")
    clock.run("data", lambda: prepare_data(args))
    baseline_and_expert(args, clock)
    clock.run("sft", lambda: sft(args))
    clock.run("rl", lambda: rl(args, clock))
    print(f"pipeline: {clock.elapsed_s() / 60:.1f} min", flush=True)


# -- the figures -----------------------------------------------------------------------------------------------
def model_turns(output: list[dict[str, Any]]) -> int:
    """Model calls of a trajectory (`response.output`): its runs of model items (`Trajectory.model_turns`)."""
    return Trajectory.of({"output": output}).model_turns


def behaviour(rollouts_file: Path) -> dict[str, Any]:
    """Per rollout means: tool calls, model turns; share of rollouts with a tool call; stop and failure reasons."""
    rows = read_jsonl(rollouts_file)
    views = [Trajectory.of(row["response"]) for row in rows]
    calls = [len(view.function_calls) for view in views]
    return {
        "rollouts": len(rows),
        "mean_reward": sum(float(r["reward"]) for r in rows) / max(1, len(rows)),
        "tool_calls_per_rollout": sum(calls) / max(1, len(rows)),
        "turns_per_rollout": sum(view.model_turns for view in views) / max(1, len(rows)),
        "share_with_tool_call": sum(c > 0 for c in calls) / max(1, len(rows)),
        "stop_reasons": dict(Counter(r.get("stop_reason") for r in rows)),
        "failure_reasons": dict(Counter(r.get("failure_reason") for r in rows)),
    }


def _duration_s(first: Path, last: Path) -> float:
    return last.stat().st_mtime - first.stat().st_mtime


def time_split(timings: dict[str, float], metrics: list[dict[str, Any]], run_dir: Path) -> dict[str, float]:
    """Minutes per part of the pipeline. The RL run's evaluations are timed by their files (the tasks file is
    written when one starts, the rollouts file when it ends); its start-up is the rest of the RL stage."""
    rl_evals_s = sum(_duration_s(path.with_name(path.stem + "_tasks.jsonl"), path) for path in eval_files(run_dir))
    steps = {k: sum(m.get(f"time_{k}_s", 0.0) for m in metrics) for k in ("generation", "training", "sync")}
    split = {
        "baseline servers start + stop": timings.get("servers_start", 0) + timings.get("servers_stop", 0),
        "baseline evaluation": timings.get("baseline_eval", 0),
        "expert collection": timings.get("expert_collection", 0),
        "SFT (ng_train, model load included)": timings.get("sft", 0),
        "RL evaluations (after SFT, during, after RL)": rl_evals_s,
        "RL generation": steps["generation"],
        "RL training": steps["training"],
        "RL weight sync": steps["sync"],
    }
    split["RL start-up and rest (servers, engine, final save)"] = (
        timings.get("rl", 0) - rl_evals_s - sum(steps.values())
    )
    split = {k: v / 60 for k, v in split.items()}
    split["total"] = sum(timings.values()) / 60
    return split


def report() -> dict[str, Any]:
    run_dir = OUT / "rl"
    if not (run_dir / "metrics.jsonl").is_file():
        raise SystemExit(
            f"--report-only: no finished run in {OUT} (no rl/metrics.jsonl); run the benchmark without --report-only"
            " first"
        )
    metrics = read_metrics(run_dir)
    evals = eval_files(run_dir)
    base, after_sft, after_rl = OUT / "baseline.jsonl", evals[0], evals[-1]
    rng = random.Random(0)
    summary: dict[str, Any] = {
        "steps": max(m.get("step", 0) for m in metrics),
        "trained_steps": sum(bool(m.get("trained")) for m in metrics),
        "sft_over_base": compare(base, after_sft, rng),
        "rl_over_sft": compare(after_sft, after_rl, rng),
        "rl_over_base": compare(base, after_rl, rng),
        "behaviour": {
            "base": behaviour(base),
            "after_sft": behaviour(after_sft),
            "after_rl": behaviour(after_rl),
            "expert": behaviour(OUT / "expert.jsonl"),
        },
        "minutes": time_split(json.loads((OUT / "timings.json").read_text()), metrics, run_dir),
    }
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
    references = {"held-out, base model (before SFT)": summary["sft_over_base"]["mean_reward"]["before"]}
    plot_reward_curve(
        metrics,
        OUT / "reward_curve.png",
        "SmolLM2-135M on tool_calculator: SFT warm start, then GRPO (CPU)",
        references,
    )
    for title, key in (
        ("SFT over base", "sft_over_base"),
        ("RL over SFT", "rl_over_sft"),
        ("RL over base", "rl_over_base"),
    ):
        print(f"{title}: held-out " + format_comparison("mean_reward", summary[key]["mean_reward"]))
    for stage, b in summary["behaviour"].items():
        print(
            f"{stage}: {b['tool_calls_per_rollout']:.2f} tool calls and {b['turns_per_rollout']:.2f} turns per rollout,"
            f" {b['share_with_tool_call']:.0%} with a tool call; stops {b['stop_reasons']}"
        )
    print("minutes: " + ", ".join(f"{k} {v:.1f}" for k, v in summary["minutes"].items()))
    print(f"{summary['steps']} RL steps ({summary['trained_steps']} trained); curve: {OUT / 'reward_curve.png'}")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=60.0,
        help="the whole pipeline's wall time; the RL steps get what is left",
    )
    parser.add_argument("--sft-tasks", type=int, default=64, help="training tasks the expert solves (SFT rows)")
    parser.add_argument("--sft-epochs", type=int, default=1)
    parser.add_argument("--sft-batch-size", type=int, default=8)
    parser.add_argument("--sft-learning-rate", type=float, default=5e-5)
    parser.add_argument("--steps", type=int, default=40, help="most GRPO steps (the budget may stop them earlier)")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per model call")
    parser.add_argument(
        "--eval-interval",
        type=int,
        default=100,
        help="held-out evaluation every N steps (and always after SFT and after RL)",
    )
    parser.add_argument("--eval-repeats", type=int, default=4, help="samples per held-out task")
    parser.add_argument(
        "--step-reserve-s", type=float, default=180.0, help="seconds kept for the GRPO step that ends past the deadline"
    )
    parser.add_argument("--heldout-limit", type=int, default=None, help="first N held-out tasks (default: all 74)")
    parser.add_argument("--parallel", type=int, default=32, help="rollouts in flight")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if not args.report_only:
        train(args)
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
