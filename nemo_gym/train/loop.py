"""`ng_train`'s training loop (docs/architecture.md, Training), one for every recipe: GRPO (`nemo_gym.train.grpo`),
sft / pretrain (`nemo_gym.train.supervised`) and on-policy distillation (`nemo_gym.train.distill`).

The loop owns what every recipe shares (torchtune style: setup / train / save_checkpoint / cleanup):
  - the steps: step k (0-based) trains on the batch the recipe prepares for k (`Recipe.prepare_step`: each recipe
    takes the next `batch_size` rows of a fixed per-epoch permutation, `TaskSampler`, so the batch of step k
    depends only on (seed, k) and a resumed run takes exactly the batch the uninterrupted run would have taken; GRPO
    with `dynamic_sampling` reads on from the data position its last step reached, saved in the checkpoint);
    one optimizer step of the recipe's engine (`PolicyEngine.train_step`, whose loss the recipe chose); then the
    recipe publishes the new weights (`Recipe.publish_weights`: the weight sync to the policy server, or nothing);
  - stop handling (`nemo_gym.train.stopping`): a stop abandons the rollouts it interrupts, or ends the loop after the
    step; `max_train_time_s`;
  - evaluation every `eval.interval` steps, at step 0 and at the end (`Recipe.evaluate`);
  - a metrics line per step in `output_dir/metrics.jsonl` (and TensorBoard, W&B: `nemo_gym.train.reporting`);
  - checkpoints every `checkpoint_interval` steps and at the end (DeepSpeed's, `trainer_state.json`, RNG states,
    `latest_step`), resume from the latest one, and `final/`.

Several ranks (`trainer.num_ranks`, or under torchrun / the deepspeed launcher; `nemo_gym.train.distributed`): rank 0
alone evaluates, logs and writes to `output_dir`, inside `lead()`, which broadcasts its result (the step's batch when
the recipe prepares it on rank 0, `Recipe.batch_on_main`; whether to go on, checkpoint or stop) to the other ranks;
the optimizer step, the checkpoints and the exports are collectives every rank takes part in.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import replace_atomically
from nemo_gym.common.paths import check_name
from nemo_gym.config import mask_secrets
from nemo_gym.train import crash_points, distributed
from nemo_gym.train.batch import TrainingBatch
from nemo_gym.train.config import TrainerConfig
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.reporting import MetricsReporter
from nemo_gym.train.stopping import StopRequested, StopSignal

__all__ = ["Recipe", "TaskSampler", "TrainingLoop", "value_stats"]

T = TypeVar("T")


class TaskSampler:
    """Batches of tasks from a fixed permutation per epoch: the batch of step k depends only on (seed, k)."""

    def __init__(self, num_tasks: int, batch_size: int, seed: int):
        if num_tasks < 1:
            raise ConfigError("no training tasks left after the filters; loosen +trainer.filter.*")
        self.num_tasks, self.batch_size, self.seed = num_tasks, batch_size, seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(self.num_tasks))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    def index(self, position: int) -> int:
        """The task at data position `position` (0-based over the epochs: epoch `position // num_tasks`)."""
        return self._order(position // self.num_tasks)[position % self.num_tasks]

    def batch(self, step: int) -> list[int]:
        """Task indices of step `step` (0-based); data position = step * batch_size."""
        start = step * self.batch_size
        return [self.index(p) for p in range(start, start + self.batch_size)]

    def draw(self, position: int, count: int, exclude: set[int]) -> tuple[list[int], int]:
        """Up to `count` distinct task indices not in `exclude`, read in order from data position `position` on (GRPO's
        dynamic sampling: a step never holds a task twice); returns (them, the position after the last one read).

        A position whose task is excluded (or already drawn) is read and passed over: the next epoch then skips that
        task, which the step has. Fewer than `count` only when fewer tasks are left outside `exclude` (none: `[]`). The
        scan ends: a task not yet taken shows up within the next 2 * num_tasks positions, which hold a whole epoch.
        """
        taken: dict[int, None] = {}  # insertion-ordered set
        wanted = min(count, self.num_tasks - len(exclude))  # exclude holds task indices (< num_tasks)
        while len(taken) < wanted:
            task = self.index(position)
            position += 1
            if task not in exclude:
                taken.setdefault(task)
        return list(taken), position


def value_stats(prefix: str, values: list[float] | torch.Tensor) -> dict[str, float]:
    """`{prefix}_mean`, `_std` (population), `_min` and `_max` of `values: [n]`; {} when there are none."""
    tensor = torch.as_tensor(values, dtype=torch.float64)
    if tensor.numel() == 0:
        return {}
    return {
        f"{prefix}_mean": tensor.mean().item(),
        f"{prefix}_std": tensor.std(unbiased=False).item(),
        f"{prefix}_min": tensor.min().item(),
        f"{prefix}_max": tensor.max().item(),
    }


class Recipe(Protocol):
    """A training method the loop runs. Attributes: `cfg` (the recipe's config: it may set its own defaults, e.g.
    num_steps from epochs, by `setup`'s end), `engine` (its `PolicyEngine`, made by `setup`; None before),
    `batch_on_main` (True: rank 0 alone prepares each step's batch and the loop broadcasts it; False: every rank
    prepares the same batch itself), `has_eval` (whether `evaluate` has data, known on rank 0 after `setup`)."""

    cfg: TrainerConfig
    engine: PolicyEngine | None
    batch_on_main: bool
    has_eval: bool

    def setup(self, loop: TrainingLoop) -> None:
        """Data, servers and the engine, on every rank (rank 0 alone talks to the gym and writes); may raise
        `StopRequested` (a stop while waiting for servers)."""
        ...

    def prepare_step(self, step: int) -> tuple[dict[str, Any], TrainingBatch | None]:
        """The metrics so far of step `step` (0-based; `step` is `step + 1` in them) and its batch, or None for no
        optimizer step (nothing to train on: logged as `trained: false`)."""
        ...

    def publish_weights(self, step: int) -> dict[str, Any]:
        """After the optimizer step of `step` (1-based) and after a resume, on every rank: hand the weights to whoever
        samples with them; returns metrics for the step's line."""
        ...

    def evaluate(self, step: int) -> dict[str, Any]:
        """Rank 0: the evaluation metrics after `step` steps ({} when stopping)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the recipe keeps in a checkpoint's `trainer_state.json` beside the loop's own fields."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """On resume: the `trainer_state.json` of the checkpoint."""
        ...

    def cleanup(self) -> None:
        """Stop what `setup` started (also after a failed or stopped setup)."""
        ...


class TrainingLoop:
    """setup → train → save_checkpoint → cleanup of a `Recipe` (see the module docstring); run by
    `nemo_gym.train.stopping.run_stoppable`."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.cfg = recipe.cfg
        self.out = Path(self.cfg.output_dir)
        self.step = 0
        self.stop = StopSignal()  # SIGTERM / SIGINT (ng_runs stop, Ctrl-C): see nemo_gym.train.stopping
        self.is_main = distributed.is_main()  # rank 0: the gym's client and the writer of output_dir
        self.reporter: MetricsReporter | None = None

    @property
    def engine(self) -> PolicyEngine | None:
        """The recipe's engine (None before its setup)."""
        return getattr(self.recipe, "engine", None)

    def lead(self, work: Callable[[], T]) -> T:
        """`work()` on rank 0, its result on every rank (rank 0 decides, the other ranks follow).

        The other ranks also take rank 0's stop state, and a stop that abandons `work` (`StopRequested`) is raised on
        every rank: all ranks leave the loop at the same point, none waits alone in a collective. An error on rank 0
        ends its process; the launcher then stops the other ranks. With one rank: `work()`.
        """
        result, abandoned = None, False
        if self.is_main:
            try:
                result = work()
            except StopRequested:
                abandoned = True
        result, abandoned, signum, save_model = distributed.broadcast_from_main(
            (result, abandoned, self.stop.signum, self.stop.save_model)
        )
        if not self.is_main:
            self.stop.signum, self.stop.save_model = signum, save_model
        if abandoned:
            raise StopRequested()
        return result

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        """The output folder, the recipe's setup, the metrics reporter; the latest checkpoint with `resume`."""
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        self.recipe.setup(self)
        self.cfg = cfg = self.recipe.cfg  # the recipe's own defaults (e.g. num_steps from supervised.num_epochs)
        if self.is_main:
            self.reporter = MetricsReporter(
                cfg.logging, self.out, total_steps=cfg.num_steps, run_config=mask_secrets(cfg.model_dump(mode="json"))
            )  # to TensorBoard and W&B
        if cfg.resume:
            self.resume()

    # -- train ---------------------------------------------------------------------------------------
    def train(self) -> None:
        """Steps until `num_steps`, a stop or `max_train_time_s`; checkpoints; `final/` unless stopped."""
        cfg = self.cfg
        self.lead(self._evaluate_first)
        started = time.monotonic()
        while self.lead(lambda: self.step < cfg.num_steps and not self.stop.requested):
            metrics = self.train_one_step()
            self.step += 1
            last, out_of_time = self.lead(lambda: self._finish_step(metrics, started))  # noqa: B023 (called at once)
            if (cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0) or last:
                self.save_checkpoint()
            if out_of_time and self.step < cfg.num_steps:
                break
        if self.stop.requested:  # run_stoppable saves final/ when the stop asked for it
            return
        self.engine.save_hf(self.out / "final")
        if self.is_main:
            print(
                f"ng_train: done; final model in {self.out / 'final'} (servable by vllm_model:"
                " +policy_model.responses_api_models.vllm_model.model=...)",
                flush=True,
            )

    def _evaluates(self) -> bool:
        return bool(self.cfg.eval.interval and self.recipe.has_eval)

    def _evaluate_first(self) -> None:
        if self._evaluates() and self.step == 0:
            self.log({"step": 0, **self.evaluate()})

    def _finish_step(self, metrics: dict[str, Any], started: float) -> tuple[bool, bool]:
        """Rank 0 after the optimizer step: evaluation when due, the metrics line; returns (last, out_of_time)."""
        cfg = self.cfg
        out_of_time = cfg.max_train_time_s is not None and time.monotonic() - started >= cfg.max_train_time_s
        last = self.step == cfg.num_steps or out_of_time
        if self._evaluates() and (self.step % cfg.eval.interval == 0 or last):
            metrics.update(self.evaluate())
        self.log(metrics)
        if out_of_time and self.step < cfg.num_steps:
            print(
                f"ng_train: max_train_time_s={cfg.max_train_time_s:g} reached after step {self.step}; stopping",
                flush=True,
            )
        return last, out_of_time

    def train_one_step(self) -> dict[str, Any]:
        """The recipe's batch (prepared on rank 0 and broadcast, or on every rank), the optimizer step on every rank,
        the recipe's weight publication; the step's metrics."""

        def prepare() -> tuple[dict[str, Any], TrainingBatch | None]:
            return self.recipe.prepare_step(self.step)

        metrics, batch = self.lead(prepare) if self.recipe.batch_on_main else prepare()
        if batch is None:
            return metrics
        started = time.monotonic()
        metrics.update(self.engine.train_step(batch))
        metrics["time_training_s"] = time.monotonic() - started
        metrics["tokens_per_s"] = metrics["num_tokens"] / max(metrics["time_training_s"], 1e-9)
        metrics.update(self.recipe.publish_weights(self.step + 1))
        metrics["trained"] = True
        return metrics

    def evaluate(self) -> dict[str, Any]:
        """Rank 0: the recipe's evaluation after `self.step` steps."""
        return self.recipe.evaluate(self.step)

    def log(self, metrics: dict[str, Any]) -> None:
        """metrics.jsonl, console, TensorBoard and W&B (trainer.logging) via nemo_gym.train.reporting."""
        self.reporter.log(int(metrics["step"]), metrics)

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Every rank: the DeepSpeed checkpoint (a collective); rank 0: trainer state, RNG states, `latest_step`."""
        folder = self.out / "checkpoints"
        tag = f"step_{self.step:06d}"
        self.engine.save_checkpoint(folder, tag)
        if not self.is_main:
            return
        engine = {
            **self.cfg.engine.model_dump(mode="json"),
            "model_path": str(Path(self.engine.model_path).resolve()),
        }  # for ng_export
        state = {
            "step": self.step,
            "data_position": self.step * self.cfg.batch_size,
            "seed": self.cfg.seed,
            "engine": engine,
            **self.recipe.state_dict(),
        }  # a recipe may say its own data_position
        replace_atomically(folder / tag / "trainer_state.json", json.dumps(state).encode())
        crash_points.reached("checkpoint_state", self.step)  # a test hook; nothing unless NEMO_GYM_CRASH_AT is set
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, folder / tag / "rng_state.pt")
        replace_atomically(
            folder / "latest_step", tag.encode()
        )  # last, and whole: a resume never finds a partial checkpoint

    def resume(self) -> None:
        """Load the latest checkpoint (engine, step, RNG states, the recipe's state) and publish its weights; none: step
        0.

        Raises:
            PathEscapeError: `latest_step` names no plain checkpoint tag (checked before anything is loaded).
        """
        folder = self.out / "checkpoints"
        if not (folder / "latest_step").is_file():
            print(f"ng_train: +trainer.resume=true but no checkpoint in {folder}; starting at step 0", file=sys.stderr)
            return
        tag = check_name((folder / "latest_step").read_text().strip(), what=f"{folder / 'latest_step'}: checkpoint tag")
        self.engine.load_checkpoint(folder, tag)
        state = json.loads((folder / tag / "trainer_state.json").read_text())
        self.step = state["step"]
        rng = torch.load(
            folder / tag / "rng_state.pt", weights_only=True
        )  # tensors, ints and tuples only: no pickled code runs
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        self.recipe.load_state_dict(state)
        self.recipe.publish_weights(self.step)  # the policy server starts from the initial weights
        if self.is_main:
            print(f"ng_train: resumed from {folder / tag} at step {self.step}", flush=True)

    def cleanup(self) -> None:
        """The recipe's cleanup (servers, weight sync), then the reporter's."""
        try:
            self.recipe.cleanup()
        finally:
            if self.reporter is not None:
                self.reporter.close()
