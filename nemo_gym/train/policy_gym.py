"""The gym side of the on-policy recipes (GRPO `nemo_gym.train.grpo`, on-policy distillation `nemo_gym.train.distill`),
on rank 0: the training and evaluation tasks, the servers (`ng_run` started or attached), rollouts through the
in-memory collector (`nemo_gym.collect_core.collect`) and the weight sync to the policy server.

Rollouts never make a disk round trip: the rows go to the collector and its rollouts come back in memory. The
files a collection leaves under `output_dir/rollouts/` (for the viewer, `ng_eval`, debugging) are written from
memory as it runs: `<name>_tasks.jsonl` (the tasks sent), `<name>.jsonl` (the rollouts, in completion order) and
the side files of `ng_collect_rollouts` (`_materialized_inputs`, `_failures`, `_aggregate_metrics`, `_state`;
`nemo_gym.collect_sink.RolloutFiles`), with `<name>` = `step_<k>` (k 1-based, 6 digits) or `eval_step_<k>`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from nemo_gym.client import ClientTimeouts, ServerClient
from nemo_gym.collect import CollectConfig, RolloutFiles, collect, read_tasks
from nemo_gym.head import run_token_for_url
from nemo_gym.jsonl import write_jsonl
from nemo_gym.run import NgRunProcess
from nemo_gym.train.config import TaskFilter, TrainerConfig
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.loop import TaskSampler
from nemo_gym.train.weight_sync import make_weight_sync

__all__ = ["PolicyGym", "eval_metrics", "filter_tasks", "publish_weights"]

WATCHDOG_S = CollectConfig.model_fields["watchdog_s"].default  # ng_collect_rollouts' stall report, also in training


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


def eval_metrics(rollouts: list[dict[str, Any]], pass_threshold: float) -> dict[str, float]:
    """Mean reward and pass@1 (share of rollouts with reward >= pass_threshold) of evaluation rollouts."""
    rewards = [float(r["reward"]) for r in rollouts]
    if not rewards:
        return {"eval_rollouts": 0}
    return {"eval_reward_mean": sum(rewards) / len(rewards), "eval_pass_at_1": sum(r >= pass_threshold for r in rewards) / len(rewards), "eval_rollouts": len(rewards)}


def publish_weights(gym: PolicyGym | None, engine: PolicyEngine, step: int, *, sync_weights: bool) -> dict[str, Any]:
    """An on-policy recipe's `publish_weights`: with `sync_weights`, rank 0 (the one with a `gym`) sends the weights of
    `step` to the policy server and the other ranks only take part in the export (a collective under ZeRO-3);
    returns `{"time_sync_s": seconds}` for the step's metrics."""
    started = time.monotonic()
    if sync_weights:
        if gym is not None:
            gym.push(engine, step)
        else:
            engine.join_export()
    return {"time_sync_s": time.monotonic() - started}


class PolicyGym:
    """Rank 0's gym for an on-policy recipe: tasks (`tasks`, `eval_tasks`, the step's `batch`), servers, rollouts
    (`collect`), weight sync (`connect`, `push`). Made in the recipe's setup; `close` stops what it started.

    Raises (on construction):
        DataError: a bad task row (`file:line`). ConfigError: no task left after `trainer.filter`.
        NemoGymError: the servers cannot be started or reached (`nemo_gym.run.NgRunProcess`).
    """

    def __init__(self, cfg: TrainerConfig, argv: list[str], out: Path):
        self.cfg, self.out = cfg, out
        self.tasks = filter_tasks(self._read(cfg.input_jsonl_fpath, None), cfg.filter)
        self.sampler = TaskSampler(len(self.tasks), cfg.batch_size, cfg.seed)
        self.eval_tasks = self._read(cfg.eval.input_jsonl_fpath, cfg.eval.limit) if cfg.eval.input_jsonl_fpath and cfg.eval.interval else []
        self.servers: NgRunProcess | None = NgRunProcess(argv, cfg.head_server_url, out / "ng_run.log", caller="ng_train")
        self.sync: Any = None

    def _read(self, path: str, limit: int | None) -> list[dict[str, Any]]:
        return read_tasks(path, agent_name=self.cfg.agent_name, limit=limit, responses_create_params=self.cfg.responses_create_params)

    def batch(self, step: int) -> list[dict[str, Any]]:
        """The tasks of step `step` (0-based; `TaskSampler`)."""
        return [self.tasks[i] for i in self.sampler.batch(step)]

    def connect(self, engine: PolicyEngine) -> None:
        """The weight sync to the policy server (`trainer.weight_sync`), once the engine exists."""
        cfg = self.cfg
        policy_url = self.servers.server_url(cfg.policy_instance) if cfg.sync_weights else None
        self.sync = make_weight_sync(
            cfg.weight_sync, policy_url=policy_url, weights_dir=self.out / "weights", trainer_device=engine.device,
            host=cfg.weight_sync_host, run_token=run_token_for_url(self.servers.head_url) if policy_url else None,
        )  # fmt: skip

    def push(self, engine: PolicyEngine, step: int) -> None:
        """Send the weights of `step` to the policy server (a HF folder it reloads, or a broadcast)."""
        self.sync.push(engine, step)

    def collect(self, tasks: list[dict[str, Any]], num_repeats: int, name: str, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rollouts of `tasks` × `num_repeats`, in completion order (failed rollouts are absent: their records are in
        `rollouts/<name>_failures.jsonl`); `overrides` are merged over each task's `responses_create_params`.

        Raises:
            DataError: a task its environment's row schema refuses. ServerError: an unknown agent.
        """
        folder = self.out / "rollouts"
        folder.mkdir(exist_ok=True)
        tasks_path = folder / f"{name}_tasks.jsonl"
        write_jsonl(tasks_path, tasks)  # for the reader of output_dir: the collector takes the rows from memory
        files = RolloutFiles(folder / f"{name}.jsonl", resume=False, input_jsonl_fpath=str(tasks_path))

        async def run() -> list[dict[str, Any]]:
            async with ServerClient(self.servers.head_url, timeouts=ClientTimeouts(read_s=self.cfg.request_timeout_s)) as client:
                result = await collect(
                    tasks, client, num_repeats=num_repeats, concurrency=self.cfg.num_samples_in_parallel, agent_name=self.cfg.agent_name,
                    responses_create_params=overrides or {}, sinks=[files], where=lambda i: f"{tasks_path}:{i + 1}", watchdog_s=WATCHDOG_S,
                )  # fmt: skip
            return result.rollouts

        return asyncio.run(run())

    def close(self) -> None:
        """Close the weight sync, stop the servers this run started."""
        if hasattr(self.sync, "close"):
            self.sync.close()
        if self.servers is not None:
            self.servers.stop()


class GymRecipe:
    """What the recipes that train on rollouts of the policy (GRPO, on-policy distillation) share: rollouts of the
    step's tasks, weight publishing, evaluation and cleanup through `self.gym`. A subclass sets `cfg`, `engine`,
    `gym` (rank 0 only) and `loop` in its `setup`."""

    cfg: TrainerConfig
    engine: PolicyEngine
    gym: PolicyGym | None
    loop: Any

    def collect(self, tasks: list[dict[str, Any]], num_repeats: int, name: str, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rollouts of `tasks` × `num_repeats` (`PolicyGym.collect`; failed rollouts are absent)."""
        return self.gym.collect(tasks, num_repeats, name, overrides)

    def step_rollouts(self, step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
        """Rank 0: (the step's tasks, their `group_size` rollouts each, seconds the collection took)."""
        tasks = self.gym.batch(step)
        started = time.monotonic()
        with self.loop.stop.abandonable():
            rollouts = self.collect(tasks, self.cfg.group_size, f"step_{step + 1:06d}")
        return tasks, rollouts, time.monotonic() - started

    def publish_weights(self, step: int) -> dict[str, Any]:
        """With `sync_weights`: rank 0 sends the weights to the policy server; the other ranks only take part in the
        export (a collective under ZeRO-3). `time_sync_s` in the step's metrics."""
        return publish_weights(self.gym, self.engine, step, sync_weights=self.cfg.sync_weights)

    def evaluate(self, step: int) -> dict[str, Any]:
        """Mean reward and pass@1 of the policy's rollouts of the evaluation tasks (`rollouts/eval_step_<step>.jsonl`)."""
        options = self.cfg.eval
        if self.loop.stop.requested:  # stopping: log the finished step without evaluating
            return {}
        with self.loop.stop.abandonable():
            rows = self.collect(self.gym.eval_tasks, options.num_repeats, f"eval_step_{step:06d}", options.responses_create_params)
        return eval_metrics(rows, options.pass_threshold)

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the loop's state: the batch of a step is a function of (seed, step)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see `state_dict`)."""

    def cleanup(self) -> None:
        if self.gym is not None:
            self.gym.close()
