"""One rank of the multi-rank training tests (tests/test_train_distributed.py), run as
`python -m torch.distributed.run --nproc_per_node=2 tests/train_distributed_worker.py <model_dir> <out_dir>` (or by
`deepspeed --num_gpus 2 --no_local_rank ...`; one launch for both parts: each new process spends seconds importing
transformers and DeepSpeed).

First one `PolicyEngine.train_step` per case of `CASES`; rank 0 saves the metrics and the updated weights to
`<out_dir>/<case>.pt`. Then `LocalTrainer` (the real training loop and GRPO recipe, rollouts sampled from the tiny model
on rank 0) runs `LOOP_STEPS` steps into `<out_dir>/loop`. The test runs the same on one rank in its own process and
compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from nemo_gym.train.batch import TrainingBatch, TrainingSequence, collate
from nemo_gym.train.config import EngineConfig, LoggingOptions, LossOptions, TrainerConfig
from nemo_gym.train.grpo import GRPORecipe
from nemo_gym.train.loop import TrainingLoop

LOOP_STEPS = 2


def uneven_batch(num_sequences: int) -> TrainingBatch:
    """`num_sequences` sequences of 5 to 12 tokens (prompt 2 or 3, the rest generated), sampler log-probs spread so
    that some truncated-importance weights are capped, advantages of both signs."""
    generator = torch.Generator().manual_seed(11)
    sequences, advantages = [], []
    for i in range(num_sequences):
        length = int(torch.randint(5, 13, (1,), generator=generator))
        prompt = 2 + i % 2
        ids = torch.randint(3, 500, (length,), generator=generator).tolist()
        mask = [0] * prompt + [1] * (length - prompt)
        log_probs = [0.0] * prompt + (-torch.rand(length - prompt, generator=generator) * 9).tolist()
        sequences.append(TrainingSequence(ids, mask, log_probs))
        advantages.append(float(torch.randn(1, generator=generator)))
    return collate(sequences, advantages)


CASES: dict[str, tuple[int, LossOptions]] = {
    "token": (5, LossOptions(normalization="token")),  # 5 rows over 2 ranks: 3 + 2, micro-batches of 2: 2 + 1 per rank
    "sequence": (5, LossOptions(normalization="sequence")),
    "one_row": (1, LossOptions(normalization="token")),  # rank 1 has no row: it pads with a zero-weight micro-batch
}


def engine_config(model_dir: str | Path) -> EngineConfig:
    return EngineConfig(model_path=str(model_dir), learning_rate=1e-2, micro_batch_size=2, seed=0)


def run_case(model_dir: str | Path, case: str) -> dict:
    """One optimizer step of `case` on the ranks of this process: metrics and the updated weights."""
    from nemo_gym.train.engine import PolicyEngine

    num_sequences, loss = CASES[case]
    engine = PolicyEngine(engine_config(model_dir), loss)
    metrics = engine.train_step(uneven_batch(num_sequences))
    return {"metrics": metrics, "weights": {name: p.detach().clone() for name, p in engine.module.named_parameters()}}


class LocalGRPO(GRPORecipe):
    """The GRPO recipe with rollouts sampled from the tiny model itself (no servers, no vLLM); every call of
    `collect` leaves `collect_rank<r>_<name>` in the output folder, so the test sees which ranks collected."""

    def collect(self, tasks, num_repeats, name, overrides=None):
        from test_train_loop import sampled_rollouts

        from nemo_gym.train import distributed

        (self.loop.out / f"collect_rank{distributed.rank()}_{name}").touch()
        return sampled_rollouts(self.engine.module, len(tasks), num_repeats, self.loop.step)


class LocalTrainer(TrainingLoop):
    """The training loop running `LocalGRPO`."""

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        super().__init__(LocalGRPO(cfg, argv))


def write_tasks(model_dir: str | Path) -> None:
    """The loop's 3 tasks, next to the model (written once by the test, before the ranks start)."""
    (Path(model_dir).parent / "tasks.jsonl").write_text(
        "".join('{"responses_create_params": {"input": "task %d"}}\n' % i for i in range(3))
    )


def loop_config(model_dir: str | Path, out_dir: str | Path) -> TrainerConfig:
    tasks = Path(model_dir).parent / "tasks.jsonl"
    return TrainerConfig(
        input_jsonl_fpath=str(tasks),
        agent_name="agent",
        output_dir=str(out_dir),
        num_steps=LOOP_STEPS,
        batch_size=3,
        group_size=3,
        engine=EngineConfig(model_path=str(model_dir), learning_rate=1e-2, micro_batch_size=2),
        sync_weights=False,
        head_server_url="http://127.0.0.1:9",
        checkpoint_interval=1,
        logging=LoggingOptions(console=False, tensorboard=False),
    )


def run_loop(model_dir: str | Path, out_dir: str | Path) -> int:
    from nemo_gym.train.stopping import run_stoppable

    return run_stoppable(LocalTrainer(loop_config(model_dir, out_dir), []))


def main(model_dir: str, out_dir: str) -> int:
    from nemo_gym.train import distributed

    for case in CASES:
        result = run_case(model_dir, case)
        if distributed.is_main():
            torch.save(result, Path(out_dir) / f"{case}.pt")
    status = run_loop(model_dir, Path(out_dir) / "loop")
    distributed.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
