"""Train SmolLM2 on arithmetic in ART's style: an async rollout function with the OpenAI client, no server to write.

    python examples/art_style_train.py --steps 3          # first run: starts vLLM (CPU), trains 3 steps
    python examples/art_style_train.py --steps 5          # resumes at step 3 from .art/arithmetic/models/...

What it shows (nemo_gym.art): `TrainableModel` + `LocalBackend` (vllm_model serves the policy with token ids
and log-probs; each `train` call is one GRPO step, after which the server serves the new weights), a rollout
function returning a `Trajectory` with the `Choice` the client got, `TrajectoryGroup` + `gather_trajectory_groups`
(concurrent rollouts, progress bar, tolerated failures), `iterate_dataset` resumed from `model.get_step()`,
`retry` around the rollout, and optionally (`--ruler`) the group judge rescoring each group, with the
policy itself as the judge (SmolLM2 is a weak judge: this shows the plumbing, not a better reward).

Task: the 100 reasoning_gym problems of data/quickstart/reasoning_gym_tasks.jsonl (arithmetic, equations, counting).
Reward: 1 for the right number in the last \\boxed{}, 0.1 for a boxed wrong answer; without a box, 0.5 when the
last number of the reply is the right one (SmolLM2 rarely boxes: the partial credit is the signal it starts from), else
0. `--seed` makes the sampling reproducible (one vLLM seed per step, task and rollout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
from pathlib import Path

import openai

import nemo_gym.art as art

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "data" / "quickstart" / "reasoning_gym_tasks.jsonl"
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def load_tasks(path: Path) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"question": row["question"], "answer": str(row["answer"])} for row in rows]


def same_answer(found: str, answer: str) -> bool:
    """`found` equals `answer` as a number (commas ignored), else as text."""
    try:
        return math.isclose(float(found.replace(",", "").strip()), float(answer), abs_tol=1e-6)
    except ValueError:
        return found.strip() == answer


def score(text: str, answer: str) -> tuple[float, dict[str, bool]]:
    """(reward in {0, 0.1, 0.5, 1}, metrics): the last \\boxed{} compared with the answer (1 right, 0.1 wrong);
    without a box, the last number of the text (0.5 right, 0 otherwise)."""
    boxed = BOXED.findall(text)
    if boxed:
        correct = same_answer(boxed[-1], answer)
        return (1.0 if correct else 0.1), {"boxed": True, "correct": correct}
    numbers = NUMBER.findall(text)
    correct = bool(numbers) and same_answer(numbers[-1], answer)
    return (0.5 if correct else 0.0), {"boxed": False, "correct": correct}


@art.retry(max_attempts=3, exceptions=(openai.APIConnectionError, openai.APITimeoutError))
async def rollout(
    model: art.TrainableModel, task: dict[str, str], *, max_tokens: int, temperature: float, seed: int | None = None
) -> art.Trajectory:
    """One episode: ask, score the answer. The `Choice` goes into the trajectory: it carries the token ids."""
    messages = [{"role": "user", "content": f"{task['question']}\n\nPut your final answer inside \\boxed{{}}."}]
    completion = await model.openai_client().chat.completions.create(
        model=model.inference_model_name, messages=messages, max_tokens=max_tokens, temperature=temperature, seed=seed
    )
    choice = completion.choices[0]
    reward, metrics = score(choice.message.content or "", task["answer"])
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=reward,
        metrics=metrics,
        metadata={"question": task["question"]},
    )


def sample_seed(seed: int | None, step: int, task: int, rollout: int) -> int | None:
    """The vLLM sampling seed of one rollout (distinct per step, task and rollout), or None without `--seed`."""
    return None if seed is None else (seed * 1_000_003 + step * 10_007 + task * 101 + rollout) % 2**31


async def train(args: argparse.Namespace) -> None:
    tasks = load_tasks(TASKS)
    server = {
        "dtype": "float32",
        "max_model_len": 2048,
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }  # float32: as the trainer
    backend = art.LocalBackend(args.path, server=server)
    model = art.TrainableModel(
        name=args.name,
        project="arithmetic",
        base_model=args.base_model,
        engine={"micro_batch_size": 8, "temperature": args.temperature},
    )
    await model.register(backend)
    try:
        start = await model.get_step()
        print(f"{model.name}: at step {start}; serving at {model.inference_base_url}", flush=True)
        num_epochs = max(1, math.ceil(args.steps * args.groups_per_step / len(tasks)))

        async def judged(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
            # The reply is constrained to the scores JSON (explanations <= 200 characters each), so it ends by itself
            # within ~70 tokens per trajectory: keep the default max_tokens (1024), a lower cap truncates the JSON.
            return await art.ruler_score_group(
                group, model, reference=str(group.metadata["answer"]), swallow_exceptions=True
            )

        for batch in art.iterate_dataset(
            tasks, groups_per_step=args.groups_per_step, num_epochs=num_epochs, initial_step=start
        ):
            if batch.step >= args.steps:
                break
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        (
                            rollout(
                                model,
                                task,
                                max_tokens=args.max_tokens,
                                temperature=args.temperature,
                                seed=sample_seed(args.seed, batch.step, t, i),
                            )
                            for i in range(args.group_size)
                        ),
                        metadata={"answer": task["answer"]},
                    )
                    for t, task in enumerate(batch.items)
                ),
                pbar_desc=f"step {batch.step + 1} rollouts",
                max_exceptions=args.group_size,  # tolerate a few failed rollouts per step
                after_each=judged if args.ruler else None,
            )
            metrics = await model.train(groups, learning_rate=args.learning_rate)
            shown = {
                key: metrics.get(key)
                for key in (
                    "step",
                    "reward_mean",
                    "metric_correct",
                    "metric_boxed",
                    "trained",
                    "loss",
                    "grad_norm",
                    "num_tokens",
                    "time_step_s",
                )
            }
            print(json.dumps(shown), flush=True)
    finally:
        await backend.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=".art", help="the backend's folder (checkpoints, weights, history)")
    parser.add_argument(
        "--name", default="smollm2-arithmetic", help="the model's name (its folder; rerun with the same name to resume)"
    )
    parser.add_argument("--base-model", default="embedded:smollm2", help="HF folder or embedded:smollm2")
    parser.add_argument("--steps", type=int, default=3, help="train until the model has done this many steps")
    parser.add_argument("--groups-per-step", type=int, default=4, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=6, help="rollouts per task")
    parser.add_argument("--learning-rate", type=float, default=5e-6)
    parser.add_argument("--max-tokens", type=int, default=128, help="max generated tokens per answer")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--seed", type=int, default=None, help="reproducible sampling (a vLLM seed per rollout); default: none"
    )
    parser.add_argument(
        "--ruler", action="store_true", help="rescore each group with the group judge (the policy judges)"
    )
    asyncio.run(train(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
