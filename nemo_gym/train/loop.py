"""`ng_train`: GRPO through the gym's own servers (ARCHITECTURE §8).

Recipe (torchtune style: setup / train / save_checkpoint / cleanup). Per step:
  1. tasks: the next `batch_size` rows of a fixed per-epoch permutation of the (filtered) task file, so the
     batch of step k depends only on (seed, k) and a resumed run takes exactly the batch the uninterrupted run
     would have taken;
  2. rollouts: `group_size` per task through the agents (`nemo_gym.collect.collect_rollouts`, files under
     `output_dir/rollouts/`), sampled by vllm_model serving the current weights;
  3. advantages per group (`nemo_gym.rl.compute_advantages`); groups whose rewards do not vary and groups
     with failed rollouts are dropped and counted; a step with no group left is logged loudly (no update);
  4. one optimizer step on the trainer's own log-probs of the generated ids (`PolicyEngine.train_step`);
  5. weight sync to the policy server; a metrics line in `output_dir/metrics.jsonl`; evaluation every
     `eval.interval` steps; a checkpoint every `checkpoint_interval` steps and at the end.

Several ranks (`trainer.num_ranks`, or under torchrun / the deepspeed launcher; `nemo_gym.train.distributed`): rank 0
alone does steps 1-3, the evaluations, the logging and the writes to `output_dir`, inside `lead()`, which broadcasts
its result (the step's batch, whether to go on, checkpoint or stop) to the other ranks; step 4, the checkpoints and
the exports are collectives every rank takes part in.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from nemo_gym.client import ClientTimeouts, ServerClient
from nemo_gym.collect import TASK_INDEX_KEY, CollectConfig, collect_rollouts, load_tasks
from nemo_gym.config import mask_secrets
from nemo_gym.errors import ConfigError
from nemo_gym.head import run_token_for_url
from nemo_gym.jsonl import replace_atomically, write_jsonl
from nemo_gym.paths import check_name
from nemo_gym.rl import compute_advantages, zero_variance_groups
from nemo_gym.run import NgRunProcess
from nemo_gym.train import crash_points, distributed
from nemo_gym.train.batch import TrainingBatch, collate, rollout_to_sequence
from nemo_gym.train.config import EvalOptions, TaskFilter, TrainerConfig
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.reporting import MetricsReporter
from nemo_gym.train.stopping import StopRequested, StopSignal
from nemo_gym.train.weight_sync import make_weight_sync

__all__ = ["TaskSampler", "filter_tasks", "GroupedStep", "build_step", "value_stats", "GRPOTrainer"]

T = TypeVar("T")


# -- tasks ---------------------------------------------------------------------------------------------------
def filter_tasks(tasks: list[dict[str, Any]], task_filter: TaskFilter) -> list[dict[str, Any]]:
    """Tasks of a profiled JSONL inside the pass-rate / std bounds (rows without the field pass)."""

    def keep(task: dict[str, Any]) -> bool:
        pass_rate, std = task.get("pass_rate"), task.get("std_reward")
        if pass_rate is not None and task_filter.min_pass_rate is not None and pass_rate < task_filter.min_pass_rate:
            return False
        if pass_rate is not None and task_filter.max_pass_rate is not None and pass_rate > task_filter.max_pass_rate:
            return False
        return not (std is not None and task_filter.min_std_reward is not None and std < task_filter.min_std_reward)

    return [task for task in tasks if keep(task)]


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

    def batch(self, step: int) -> list[int]:
        """Task indices of step `step` (0-based); data position = step * batch_size."""
        start = step * self.batch_size
        return [self._order(p // self.num_tasks)[p % self.num_tasks] for p in range(start, start + self.batch_size)]


# -- rollouts → training batch ---------------------------------------------------------------------------------
@dataclass
class GroupedStep:
    """What one step's rollouts gave: the batch to train on (None when nothing is left) and counts."""

    batch: TrainingBatch | None
    rewards: list[float]
    groups_total: int
    groups_zero_variance: int
    groups_incomplete: int
    advantages: torch.Tensor


def build_step(rollouts: list[dict[str, Any]], num_tasks: int, group_size: int, estimator: str, pad_token_id: int) -> GroupedStep:
    """Group rollouts by task, drop incomplete and zero-variance groups, compute advantages, collate."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rollouts:
        groups[row[TASK_INDEX_KEY]].append(row)
    complete = [groups[t] for t in range(num_tasks) if len(groups.get(t, [])) == group_size]
    rewards = [float(row["reward"]) for row in rollouts]
    empty = torch.zeros(0)
    if not complete:
        return GroupedStep(None, rewards, num_tasks, 0, num_tasks, empty)
    rewards_G = torch.tensor([[float(row["reward"]) for row in group] for group in complete], dtype=torch.float32)
    zero_var = zero_variance_groups(rewards_G)
    kept = [group for group, drop in zip(complete, zero_var.tolist()) if not drop]
    counts = dict(groups_total=num_tasks, groups_zero_variance=int(zero_var.sum()), groups_incomplete=num_tasks - len(complete))
    if not kept:
        return GroupedStep(None, rewards, advantages=empty, **counts)
    advantages_G = compute_advantages(rewards_G[~zero_var], estimator=estimator)
    sequences = [rollout_to_sequence(row) for group in kept for row in group]
    batch = collate(sequences, advantages_G.reshape(-1), pad_token_id=pad_token_id)
    return GroupedStep(batch, rewards, advantages=advantages_G.reshape(-1), **counts)


def value_stats(prefix: str, values: list[float] | torch.Tensor) -> dict[str, float]:
    """`{prefix}_mean`, `_std` (population), `_min` and `_max` of `values: [n]`; {} when there are none."""
    tensor = torch.as_tensor(values, dtype=torch.float64)
    if tensor.numel() == 0:
        return {}
    return {f"{prefix}_mean": tensor.mean().item(), f"{prefix}_std": tensor.std(unbiased=False).item(), f"{prefix}_min": tensor.min().item(), f"{prefix}_max": tensor.max().item()}


# -- the trainer -----------------------------------------------------------------------------------------------
class GRPOTrainer:
    """setup → train → save_checkpoint → cleanup (see the module docstring)."""

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        self.cfg = cfg
        self.argv = argv
        self.out = Path(cfg.output_dir)
        self.step = 0
        self.stop = StopSignal()  # SIGTERM / SIGINT (ng_runs stop, Ctrl-C): see nemo_gym.train.stopping
        self.is_main = distributed.is_main()  # rank 0: the gym's client and the writer of output_dir
        self.servers: NgRunProcess | None = None
        self.reporter: MetricsReporter | None = None

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
        result, abandoned, signum, save_model = distributed.broadcast_from_main((result, abandoned, self.stop.signum, self.stop.save_model))
        if not self.is_main:
            self.stop.signum, self.stop.save_model = signum, save_model
        if abandoned:
            raise StopRequested()
        return result

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        if self.is_main:  # the other ranks neither read the tasks nor start servers
            self.out.mkdir(parents=True, exist_ok=True)
            self.tasks = filter_tasks(self._load(cfg.input_jsonl_fpath, None), cfg.filter)
            self.sampler = TaskSampler(len(self.tasks), cfg.batch_size, cfg.seed)
            self.eval_tasks = self._load(cfg.eval.input_jsonl_fpath, cfg.eval.limit) if cfg.eval.input_jsonl_fpath and cfg.eval.interval else []
            self.servers = NgRunProcess(self.argv, cfg.head_server_url, self.out / "ng_run.log", caller="ng_train")
        self.engine = self.make_engine()
        if self.is_main:
            policy_url = self.servers.server_url(cfg.policy_instance) if cfg.sync_weights else None
            self.sync = make_weight_sync(
                cfg.weight_sync, policy_url=policy_url, weights_dir=self.out / "weights", trainer_device=self.engine.device,
                host=cfg.weight_sync_host, run_token=run_token_for_url(self.servers.head_url) if policy_url else None,
            )  # fmt: skip
            self.reporter = MetricsReporter(cfg.logging, self.out, total_steps=cfg.num_steps, run_config=mask_secrets(cfg.model_dump(mode="json")))  # to TensorBoard and W&B
        if cfg.resume:
            self._resume()

    def make_engine(self) -> PolicyEngine:
        """The engine of this recipe: GRPO's PolicyEngine (other recipes return a subclass with their own loss)."""
        return PolicyEngine(self.cfg.engine, self.cfg.loss, total_steps=self.cfg.num_steps)

    def _load(self, path: str, limit: int | None) -> list[dict[str, Any]]:
        collect = CollectConfig(
            input_jsonl_fpath=path, output_jsonl_fpath=str(self.out / "unused.jsonl"), agent_name=self.cfg.agent_name, limit=limit, responses_create_params=self.cfg.responses_create_params
        )
        return load_tasks(collect)

    # -- rollouts ------------------------------------------------------------------------------------
    def collect(self, tasks: list[dict[str, Any]], num_repeats: int, name: str, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rollouts of `tasks` × `num_repeats` (rows of collect's output; failed rollouts are absent)."""
        folder = self.out / "rollouts"
        folder.mkdir(exist_ok=True)
        tasks_path = folder / f"{name}_tasks.jsonl"
        write_jsonl(tasks_path, tasks)
        collect = CollectConfig(
            input_jsonl_fpath=str(tasks_path), output_jsonl_fpath=str(folder / f"{name}.jsonl"), agent_name=self.cfg.agent_name,
            num_repeats=num_repeats, num_samples_in_parallel=self.cfg.num_samples_in_parallel, responses_create_params=overrides or {},
            resume=False, progress=False, request_timeout_s=self.cfg.request_timeout_s,
        )  # fmt: skip

        async def run() -> None:
            async with ServerClient(self.servers.head_url, timeouts=ClientTimeouts(read_s=self.cfg.request_timeout_s)) as client:
                await collect_rollouts(collect, client)

        asyncio.run(run())
        with open(collect.output_jsonl_fpath) as handle:
            return [json.loads(line) for line in handle if line.strip()]

    # -- train ---------------------------------------------------------------------------------------
    def train(self) -> None:
        cfg = self.cfg
        self.lead(self._evaluate_first)
        started = time.monotonic()
        while self.lead(lambda: self.step < cfg.num_steps and not self.stop.requested):
            metrics = self.train_one_step()
            self.step += 1
            last, out_of_time = self.lead(lambda: self._finish_step(metrics, started))
            if (cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0) or last:
                self.save_checkpoint()
            if out_of_time and self.step < cfg.num_steps:
                break
        if self.stop.requested:  # run_stoppable saves final/ when the stop asked for it
            return
        self.engine.save_hf(self.out / "final")
        if self.is_main:
            print(f"ng_train: done; final model in {self.out / 'final'} (servable by vllm_model: +policy_model.responses_api_models.vllm_model.model=...)", flush=True)

    def _evaluate_first(self) -> None:
        if self.cfg.eval.interval and self.eval_tasks and self.step == 0:
            self.log({"step": 0, **self.evaluate()})

    def _finish_step(self, metrics: dict[str, Any], started: float) -> tuple[bool, bool]:
        """Rank 0 after the optimizer step: evaluation when due, the metrics line; returns (last, out_of_time)."""
        cfg = self.cfg
        out_of_time = cfg.max_train_time_s is not None and time.monotonic() - started >= cfg.max_train_time_s
        last = self.step == cfg.num_steps or out_of_time
        if cfg.eval.interval and self.eval_tasks and (self.step % cfg.eval.interval == 0 or last):
            metrics.update(self.evaluate())
        self.log(metrics)
        if out_of_time and self.step < cfg.num_steps:
            print(f"ng_train: max_train_time_s={cfg.max_train_time_s:g} reached after step {self.step}; stopping", flush=True)
        return last, out_of_time

    def train_one_step(self) -> dict[str, Any]:
        """Rollouts and batch on rank 0, broadcast; the optimizer step on every rank; the weight sync."""
        cfg = self.cfg
        metrics, batch = self.lead(self._rollout_step)
        if batch is None:
            return metrics
        started = time.monotonic()
        metrics.update(self.engine.train_step(batch))
        metrics["time_training_s"] = time.monotonic() - started
        metrics["tokens_per_s"] = metrics["num_tokens"] / max(metrics["time_training_s"], 1e-9)
        started = time.monotonic()
        if cfg.sync_weights:
            self.push_weights(self.step + 1)
        metrics["time_sync_s"] = time.monotonic() - started
        metrics["trained"] = True
        return metrics

    def push_weights(self, step: int) -> None:
        """Rank 0 sends the weights to the policy server (`trainer.weight_sync`: a HF folder it reloads, or a broadcast);
        the other ranks only take part in the export (a collective under ZeRO-3)."""
        if self.is_main:
            self.sync.push(self.engine, step)
        else:
            self.engine.join_export()

    def _rollout_step(self) -> tuple[dict[str, Any], TrainingBatch | None]:
        """Rank 0: the step's rollouts, grouped; (metrics so far, the batch to train on or None)."""
        cfg = self.cfg
        indices = self.sampler.batch(self.step)
        started = time.monotonic()
        with self.stop.abandonable():
            rollouts = self.collect([self.tasks[i] for i in indices], cfg.group_size, f"step_{self.step + 1:06d}")
        generation_s = time.monotonic() - started
        grouped = build_step(rollouts, len(indices), cfg.group_size, cfg.advantage_estimator, self.engine.pad_token_id)
        metrics: dict[str, Any] = {
            "step": self.step + 1,
            "data_position": (self.step + 1) * cfg.batch_size,
            "rollouts": len(rollouts),
            "rollouts_failed": len(indices) * cfg.group_size - len(rollouts),
            "groups_total": grouped.groups_total,
            "groups_zero_variance": grouped.groups_zero_variance,
            "groups_incomplete": grouped.groups_incomplete,
            **value_stats("reward", grouped.rewards),
            "pass_rate": sum(r >= cfg.eval.pass_threshold for r in grouped.rewards) / max(1, len(grouped.rewards)),
            **value_stats("advantage", grouped.advantages),
            "time_generation_s": generation_s,
        }
        if grouped.batch is None:
            metrics["trained"] = False
            print(
                f"ng_train: WARNING step {self.step + 1}: no group left to train on ({grouped.groups_zero_variance} with equal rewards, "
                f"{grouped.groups_incomplete} with failed rollouts, of {grouped.groups_total}); no optimizer step. "
                "Filter the tasks (profile them, keep 0 < pass_rate < 1) or raise group_size",
                file=sys.stderr,
                flush=True,
            )
        return metrics, grouped.batch

    def evaluate(self) -> dict[str, float]:
        """Mean reward and pass@1 (share of rollouts with reward >= pass_threshold) on the validation tasks."""
        options: EvalOptions = self.cfg.eval
        if self.stop.requested:  # stopping: log the finished step without evaluating
            return {}
        with self.stop.abandonable():
            rows = self.collect(self.eval_tasks, options.num_repeats, f"eval_step_{self.step:06d}", options.responses_create_params)
        rewards = [float(r["reward"]) for r in rows]
        if not rewards:
            return {"eval_rollouts": 0}
        return {"eval_reward_mean": sum(rewards) / len(rewards), "eval_pass_at_1": sum(r >= options.pass_threshold for r in rewards) / len(rewards), "eval_rollouts": len(rewards)}

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
        engine = {**self.cfg.engine.model_dump(mode="json"), "model_path": str(Path(self.engine.model_path).resolve())}  # for ng_export
        state = {"step": self.step, "data_position": self.step * self.cfg.batch_size, "seed": self.cfg.seed, "engine": engine}
        replace_atomically(folder / tag / "trainer_state.json", json.dumps(state).encode())
        crash_points.reached("checkpoint_state", self.step)  # a test hook; nothing unless NEMO_GYM_CRASH_AT is set
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, folder / tag / "rng_state.pt")
        replace_atomically(folder / "latest_step", tag.encode())  # last, and whole: a resume never finds a partial checkpoint

    def _resume(self) -> None:
        folder = self.out / "checkpoints"
        if not (folder / "latest_step").is_file():
            print(f"ng_train: +trainer.resume=true but no checkpoint in {folder}; starting at step 0", file=sys.stderr)
            return
        tag = check_name((folder / "latest_step").read_text().strip(), what=f"{folder / 'latest_step'}: checkpoint tag")
        self.engine.load_checkpoint(folder, tag)
        self.step = json.loads((folder / tag / "trainer_state.json").read_text())["step"]
        rng = torch.load(folder / tag / "rng_state.pt", weights_only=True)  # tensors, ints and tuples only: no pickled code runs
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if self.cfg.sync_weights:
            self.push_weights(self.step)  # the policy server starts from the initial weights
        if self.is_main:
            print(f"ng_train: resumed from {folder / tag} at step {self.step}", flush=True)

    def cleanup(self) -> None:
        if hasattr(getattr(self, "sync", None), "close"):
            self.sync.close()
        if getattr(self, "reporter", None):
            self.reporter.close()
        if getattr(self, "servers", None):
            self.servers.stop()
