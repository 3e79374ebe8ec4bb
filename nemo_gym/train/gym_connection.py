"""The trainer's connection to a running gym (`GymConnection`, rank 0): the training and evaluation tasks, the servers
(`ng_run` started or attached), rollouts through the in-memory collector (`nemo_gym.collect.engine.collect`) and the
weight sync to the policy server; and what the on-policy recipes (GRPO `nemo_gym.train.grpo`, on-policy distillation
`nemo_gym.train.distill`) share on top of it (`OnPolicyRecipe`).

Rollouts never make a disk round trip: the rows go to the collector and its rollouts come back in memory. The
files a collection leaves under `output_dir/rollouts/` (for the viewer, `ng_eval`, debugging) are written from
memory as it runs: `<name>_tasks.jsonl` (the tasks sent), `<name>.jsonl` (the rollouts, in completion order) and
the side files of `ng_collect_rollouts` (`_materialized_inputs`, `_failures`, `_aggregate_metrics`, `_state`;
`nemo_gym.collect.sink.RolloutFiles`), with `<name>` = `step_<k>` (k 1-based, 6 digits), `step_<k>_round_<r>` (the
refill rounds r >= 2 of GRPO's dynamic sampling) or `eval_step_<k>`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from nemo_gym.collect.engine import collect
from nemo_gym.collect.sink import RolloutFiles
from nemo_gym.collect.tasks import read_tasks
from nemo_gym.collect.watchdog import DEFAULT_WATCHDOG_S
from nemo_gym.common.jsonl import write_jsonl
from nemo_gym.orchestration.server_processes import NgRunProcess
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.head import run_token_for_url
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.train.config import TaskFilter, TrainerConfig
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.loop import TaskSampler, TrainingLoop, value_stats
from nemo_gym.train.weight_sync import make_weight_sync

__all__ = ["GymConnection", "eval_metrics", "filter_tasks", "publish_weights", "step_collection_name"]


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


def step_collection_name(step: int, sampling_round: int = 1) -> str:
    """The name of the files of step `step`'s (0-based) collection number `sampling_round` (1-based; > 1 only under
    GRPO's dynamic sampling): `step_<k>` for the first, `step_<k>_round_<r>` after it."""
    return f"step_{step + 1:06d}" + (f"_round_{sampling_round}" if sampling_round > 1 else "")


def eval_metrics(rollouts: list[dict[str, Any]], pass_threshold: float) -> dict[str, float]:
    """Mean reward and pass@1 (share of rollouts with reward >= pass_threshold) of evaluation rollouts."""
    rewards = [float(r["reward"]) for r in rollouts]
    if not rewards:
        return {"eval_rollouts": 0}
    return {
        "eval_reward_mean": sum(rewards) / len(rewards),
        "eval_pass_at_1": sum(r >= pass_threshold for r in rewards) / len(rewards),
        "eval_rollouts": len(rewards),
    }


def publish_weights(
    gym: GymConnection | None, engine: PolicyEngine, step: int, *, sync_weights: bool
) -> dict[str, Any]:
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


class GymConnection:
    """Rank 0's gym for an on-policy recipe: tasks (`tasks`, `eval_tasks`, the step's `batch`), servers, rollouts
    (`collect`), weight sync (`connect`, `push`). Made in the recipe's setup; `close` stops what it started.

    Raises (on construction):
        DataError: a bad task row (`file:line`). ConfigError: no task left after `trainer.filter`.
        NemoGymError: the servers cannot be started or reached (`nemo_gym.orchestration.run.NgRunProcess`).
    """

    def __init__(self, cfg: TrainerConfig, argv: list[str], out: Path):
        self.cfg, self.out = cfg, out
        self.tasks = filter_tasks(self._read(cfg.input_jsonl_fpath, None), cfg.filter)
        self.sampler = TaskSampler(len(self.tasks), cfg.batch_size, cfg.seed)
        self.eval_tasks = (
            self._read(cfg.eval.input_jsonl_fpath, cfg.eval.limit)
            if cfg.eval.input_jsonl_fpath and cfg.eval.interval
            else []
        )
        self.servers: NgRunProcess | None = NgRunProcess(
            argv, cfg.head_server_url, out / "ng_run.log", caller="ng_train"
        )
        self.sync: Any = None

    def _read(self, path: str, limit: int | None) -> list[dict[str, Any]]:
        return read_tasks(
            path, agent_name=self.cfg.agent_name, limit=limit, responses_create_params=self.cfg.responses_create_params
        )

    def batch(self, step: int) -> list[dict[str, Any]]:
        """The tasks of step `step` (0-based; `TaskSampler`)."""
        return [self.tasks[i] for i in self.sampler.batch(step)]

    def connect(self, engine: PolicyEngine) -> None:
        """The weight sync to the policy server (`trainer.weight_sync`), once the engine exists."""
        cfg = self.cfg
        policy_url = self.servers.server_url(cfg.policy_instance) if cfg.sync_weights else None
        self.sync = make_weight_sync(
            cfg.weight_sync,
            policy_url=policy_url,
            weights_dir=self.out / "weights",
            trainer_device=engine.device,
            host=cfg.weight_sync_host,
            run_token=run_token_for_url(self.servers.head_url) if policy_url else None,
        )

    def push(self, engine: PolicyEngine, step: int) -> None:
        """Send the weights of `step` to the policy server (a HF folder it reloads, or a broadcast)."""
        self.sync.push(engine, step)

    def collect(
        self, tasks: list[dict[str, Any]], num_repeats: int, name: str, overrides: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
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
            async with ServerClient(
                self.servers.head_url, timeouts=ClientTimeouts(read_s=self.cfg.request_timeout_s)
            ) as client:
                result = await collect(
                    tasks,
                    client,
                    num_repeats=num_repeats,
                    concurrency=self.cfg.num_samples_in_parallel,
                    agent_name=self.cfg.agent_name,
                    responses_create_params=overrides or {},
                    sinks=[files],
                    where=lambda i: f"{tasks_path}:{i + 1}",
                    watchdog_s=DEFAULT_WATCHDOG_S,
                )
            return result.rollouts

        return asyncio.run(run())

    def close(self) -> None:
        """Close the weight sync, stop the servers this run started."""
        if hasattr(self.sync, "close"):
            self.sync.close()
        if self.servers is not None:
            self.servers.stop()


class OnPolicyRecipe:
    """What the recipes that train on rollouts of the policy (GRPO, on-policy distillation) share: the set-up (rank 0:
    the gym's tasks and servers; every rank: the engine, of the recipe's `engine_class`; rank 0: the weight sync),
    rollouts of the step's tasks and the metrics every step reports of them (`rollout_metrics`), weight publishing,
    evaluation and cleanup through `self.gym`. A recipe writes its `prepare_step`, and adds to `__init__` and
    `setup` only what it has besides (distillation: its teacher's client)."""

    batch_on_main = True  # rank 0 alone talks to the gym; the loop broadcasts the batch
    engine_class: type[PolicyEngine] = PolicyEngine

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        self.cfg, self.argv = cfg, argv
        self.engine: PolicyEngine | None = None
        self.gym: GymConnection | None = None  # rank 0 only
        self.loop: TrainingLoop | None = None
        self.has_eval = False

    def setup(self, loop: TrainingLoop) -> None:
        """Rank 0: tasks and servers; every rank: the engine; rank 0: the weight sync."""
        self.loop = loop
        if loop.is_main:  # the other ranks neither read the tasks nor start servers
            self.gym = GymConnection(self.cfg, self.argv, loop.out)
            self.has_eval = bool(self.gym.eval_tasks)
        self.engine = self.engine_class(self.cfg.engine, self.cfg.loss, total_steps=self.cfg.num_steps)
        if loop.is_main:
            self.gym.connect(self.engine)

    def rollout_metrics(
        self, step: int, data_position: int, rewards: list[float], rollouts_expected: int, generation_s: float
    ) -> dict[str, Any]:
        """The metrics of step `step`'s (0-based) rollouts that every on-policy recipe reports: `step` (1-based),
        `data_position`, `rollouts` (finished), `rollouts_failed` (of `rollouts_expected`), `reward_*` (mean, std,
        min, max of `rewards`, one per finished rollout), `pass_rate` (share with reward >= eval.pass_threshold) and
        `time_generation_s` (seconds the collection took)."""
        return {
            "step": step + 1,
            "data_position": data_position,
            "rollouts": len(rewards),
            "rollouts_failed": rollouts_expected - len(rewards),
            **value_stats("reward", rewards),
            "pass_rate": sum(r >= self.cfg.eval.pass_threshold for r in rewards) / max(1, len(rewards)),
            "time_generation_s": generation_s,
        }

    def collect(
        self, tasks: list[dict[str, Any]], num_repeats: int, name: str, overrides: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Rollouts of `tasks` × `num_repeats` (`GymConnection.collect`; failed rollouts are absent)."""
        return self.gym.collect(tasks, num_repeats, name, overrides)

    def step_rollouts(self, step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
        """Rank 0: (the step's tasks, their `group_size` rollouts each, seconds the collection took)."""
        tasks = self.gym.batch(step)
        started = time.monotonic()
        rollouts = self.group_rollouts(tasks, step_collection_name(step))
        return tasks, rollouts, time.monotonic() - started

    def group_rollouts(self, tasks: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        """Rank 0: `group_size` rollouts of each of `tasks` (`collect`, files `rollouts/<name>*`); a stop abandons
        them."""
        with self.loop.stop.abandonable():
            return self.collect(tasks, self.cfg.group_size, name)

    def publish_weights(self, step: int) -> dict[str, Any]:
        """With `sync_weights`: rank 0 sends the weights to the policy server; the other ranks only take part in the
        export (a collective under ZeRO-3). `time_sync_s` in the step's metrics."""
        return publish_weights(self.gym, self.engine, step, sync_weights=self.cfg.sync_weights)

    def evaluate(self, step: int) -> dict[str, Any]:
        """Mean reward and pass@1 of the policy's rollouts of the evaluation tasks
        (`rollouts/eval_step_<step>.jsonl`)."""
        options = self.cfg.eval
        if self.loop.stop.requested:  # stopping: log the finished step without evaluating
            return {}
        with self.loop.stop.abandonable():
            rows = self.collect(
                self.gym.eval_tasks, options.num_repeats, f"eval_step_{step:06d}", options.responses_create_params
            )
        return eval_metrics(rows, options.pass_threshold)

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the loop's state: the batch of a step is a function of (seed, step)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see `state_dict`)."""

    def cleanup(self) -> None:
        if self.gym is not None:
            self.gym.close()
