"""`LocalBackend`: serve a `TrainableModel` with vllm_model and train it with the GRPO engine, on this machine.

Per model, under `<path>/<project>/models/<name>/`:
    state.json          {"step", "checkpoint", "weights"}: written last in a step, so it always names a
                        complete checkpoint; a new process resumes from it
    checkpoints/step_N  DeepSpeed checkpoint (weights, optimizer, LR schedule) of the last `keep_checkpoints` steps
    weights/step_N      HF folder of the weights vllm_model serves (the server reloads it after each step)
    history.jsonl       one line of metrics per train (and log) call
    trajectories/<split>/<step>.jsonl   the groups given to train / log
    logs/               the inference server's and vLLM's logs

Inference: a vllm_model server (its `app.py`, in a child process of ours: `server_process.ServerProcess`) on
127.0.0.1, named after the model, serving the last step's weights. Training: `PolicyEngine` (DeepSpeed),
built at the first train call and kept; its work runs in one worker thread so that the event loop (and
running rollouts) stay responsive. One step: groups → batch (`tokens.groups_to_batch`) → `train_step` →
`save_hf` + `POST /reload_weights` (`FilesystemWeightSync`) → checkpoint → state.json → history.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_gym.art.model import TrainableModel, TrainConfig
from nemo_gym.art.server_process import ServerProcess
from nemo_gym.art.tokens import GroupsBatch, groups_to_batch, mean_metrics
from nemo_gym.art.trajectories import TrajectoryGroup
from nemo_gym.common.jsonl import replace_atomically
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.train.engine import PolicyEngine
from nemo_gym.train.weight_sync import FilesystemWeightSync, http_reloader

__all__ = ["VLLM_MODEL_APP", "LocalBackend"]

VLLM_MODEL_APP = REPO_ROOT / "responses_api_models" / "vllm_model" / "app.py"


@dataclass
class ModelState:
    """What `state.json` holds: the step count and where the last step's checkpoint and weights are."""

    step: int = 0
    checkpoint: str | None = None  # tag under checkpoints/
    weights: str | None = None  # folder under weights/

    @classmethod
    def load(cls, path: Path) -> ModelState:
        return cls(**json.loads(path.read_text())) if path.is_file() else cls()

    def save(self, path: Path) -> None:
        replace_atomically(path, json.dumps(asdict(self)).encode())


@dataclass
class _Run:
    """One registered model: its folder, state, server, and (after the first train call) engine."""

    model: TrainableModel
    folder: Path
    state: ModelState
    server: ServerProcess | None = None
    engine: PolicyEngine | None = None
    sync: FilesystemWeightSync | None = None


class LocalBackend:
    """Runs inference servers and trainers of `TrainableModel`s on this machine.

    Args:
        path: root folder of the projects (default `./.art`, as ART).
        start_server: start a vllm_model server per registered model (False: training only, no
            `openai_client()`; for tests and for trajectories made elsewhere).
        server: extra vllm_model config fields, e.g. `{"dtype": "float32", "max_model_len": 2048,
            "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}`.
        startup_timeout_s: how long to wait for the server (the first start builds vLLM's venv).
        keep_checkpoints: DeepSpeed checkpoints kept per model (the newest).
    """

    def __init__(
        self,
        path: str | Path = ".art",
        *,
        start_server: bool = True,
        server: dict[str, Any] | None = None,
        startup_timeout_s: float = 1800.0,
        keep_checkpoints: int = 1,
    ):
        self.path = Path(path).expanduser().resolve()
        self.start_server = start_server
        self.server_fields = dict(server or {})
        self.startup_timeout_s = startup_timeout_s
        self.keep_checkpoints = max(1, keep_checkpoints)
        self._runs: dict[tuple[str, str], _Run] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nemo_gym_art_trainer")
        atexit.register(self._stop_servers)

    def __repr__(self) -> str:
        return f"LocalBackend(path={str(self.path)!r})"

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def model_folder(self, model: TrainableModel) -> Path:
        return self.path / model.project / "models" / model.name

    # -- register ------------------------------------------------------------------------------------
    async def register(self, model: TrainableModel) -> None:
        """Restore the model's state and start its inference server on the last step's weights.

        Raises:
            ServerStartError: the server did not start (its log's last lines are in the message).
        """
        key = (model.project, model.name)
        if key in self._runs:  # again (maybe a new object for the same model): share the running server
            run = self._runs[key]
            run.model = model
            if run.server is not None and run.server.url:
                model.inference_base_url, model.inference_api_key, model.inference_model_name = (
                    f"{run.server.url}/v1",
                    run.server.token,
                    model.name,
                )
            return
        folder = self.model_folder(model)
        folder.mkdir(parents=True, exist_ok=True)
        run = _Run(model, folder, ModelState.load(folder / "state.json"))
        if self.start_server:
            weights = folder / "weights" / run.state.weights if run.state.weights else None
            served = str(weights) if weights is not None and weights.is_dir() else model.base_model
            fields = {
                "model": served,
                "served_model_name": model.name,
                "return_token_id_information": True,
                "log_path": str(folder / "logs" / "vllm.log"),
                **self.server_fields,
            }
            run.server = ServerProcess(VLLM_MODEL_APP, fields, name=model.name, state_dir=folder / "logs")
            url = await run.server.start(self.startup_timeout_s)
            model.inference_base_url, model.inference_api_key, model.inference_model_name = (
                f"{url}/v1",
                run.server.token,
                model.name,
            )
        self._runs[key] = run

    def _run(self, model: TrainableModel) -> _Run:
        run = self._runs.get((model.project, model.name))
        if run is None:
            raise RuntimeError(f"{model!r} is not registered with {self!r}")
        return run

    async def get_step(self, model: TrainableModel) -> int:
        return self._run(model).state.step

    # -- train ---------------------------------------------------------------------------------------
    async def train(self, model: TrainableModel, groups: list[TrajectoryGroup], config: TrainConfig) -> dict[str, Any]:
        """One optimizer step on `groups` (see the module docstring); returns the step's metrics."""
        run = self._run(model)
        loop = asyncio.get_running_loop()
        engine = await loop.run_in_executor(self._worker, self._engine, run)
        grouped = groups_to_batch(groups, estimator=model.advantage_estimator, pad_token_id=engine.pad_token_id)
        self._write_trajectories(run, "train", run.state.step + 1, groups)
        return await loop.run_in_executor(self._worker, self._step, run, grouped, config.learning_rate)

    def _engine(self, run: _Run) -> PolicyEngine:
        """The model's engine, built (and restored from the last checkpoint) on first use. In the worker thread."""
        if run.engine is None:
            run.engine = PolicyEngine(run.model.engine_config, run.model.loss)
            if run.state.checkpoint:
                run.engine.load_checkpoint(run.folder / "checkpoints", run.state.checkpoint)
            reload = (
                http_reloader(run.server.url, run_token=run.server.token)
                if run.server is not None and run.server.url
                else None
            )
            run.sync = FilesystemWeightSync(run.folder / "weights", reload, keep_last=2)
        return run.engine

    def _step(self, run: _Run, grouped: GroupsBatch, learning_rate: float) -> dict[str, Any]:
        """The step itself (worker thread): train, push the weights, checkpoint, save the state, log."""
        assert run.engine is not None and run.sync is not None
        started = time.monotonic()
        step = run.state.step + 1
        metrics: dict[str, Any] = {"step": step, "split": "train", **_group_metrics(grouped)}
        if grouped.batch is None:
            print(
                f"nemo_gym.art: step {step}: no group to learn from ({grouped.groups_zero_variance} with equal rewards,"
                f" {grouped.groups_too_small} with fewer than 2 trajectories, of {grouped.num_groups}); no optimizer"
                " step",
                file=sys.stderr,
                flush=True,
            )
            metrics["trained"] = False
        else:
            _set_learning_rate(run.engine, learning_rate)
            metrics.update(run.engine.train_step(grouped.batch), learning_rate=learning_rate, trained=True)
            metrics["time_training_s"] = time.monotonic() - started
            synced = time.monotonic()
            weights = run.sync.push(run.engine, step)
            metrics["time_sync_s"] = time.monotonic() - synced
            tag = f"step_{step:06d}"
            run.engine.save_checkpoint(run.folder / "checkpoints", tag)
            self._prune_checkpoints(run.folder / "checkpoints")
            run.state.checkpoint, run.state.weights = tag, weights.name
        run.state.step = step
        run.state.save(run.folder / "state.json")
        metrics["time_step_s"] = time.monotonic() - started
        _append_history(run.folder, metrics)
        return metrics

    def _prune_checkpoints(self, folder: Path) -> None:
        tags = sorted(p for p in folder.glob("step_*") if p.is_dir())
        for old in tags[: -self.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    # -- log -----------------------------------------------------------------------------------------
    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, Any]:
        """Means of the groups' rewards and metrics at the current step, in `history.jsonl`; returns them."""
        run = self._run(model)
        rewards = [t.reward for g in groups for t in g]
        grouped = GroupsBatch(
            None,
            rewards,
            torch.zeros(0),
            num_groups=len(groups),
            num_exceptions=sum(len(g.exceptions) for g in groups),
            metrics=mean_metrics(groups),
        )
        metrics = {"step": run.state.step, "split": split, **_group_metrics(grouped)}
        self._write_trajectories(run, split, run.state.step, groups)
        _append_history(run.folder, metrics)
        return metrics

    def _write_trajectories(self, run: _Run, split: str, step: int, groups: list[TrajectoryGroup]) -> None:
        folder = run.folder / "trajectories" / split
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"{step:06d}.jsonl").open("w") as handle:
            for index, group in enumerate(groups):
                for trajectory in group:
                    handle.write(json.dumps({"group": index, **trajectory.model_dump(mode="json")}) + "\n")

    # -- shutdown ------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the inference servers (the engines are dropped with the backend)."""
        await asyncio.to_thread(self._stop_servers)
        self._worker.shutdown(wait=True)

    def _stop_servers(self) -> None:
        for run in self._runs.values():
            if run.server is not None:
                run.server.stop()
                run.server = None


def _set_learning_rate(engine: PolicyEngine, learning_rate: float) -> None:
    """Make the next optimizer step use `learning_rate` (the engine's schedule multiplies its base LRs)."""
    for optimizer in {id(o): o for o in (engine.optimizer, engine.scheduler.optimizer)}.values():
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
            group["initial_lr"] = learning_rate
    engine.scheduler.base_lrs = [learning_rate] * len(engine.scheduler.base_lrs)


def _group_metrics(grouped: GroupsBatch) -> dict[str, Any]:
    rewards = grouped.rewards
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5 if mean is not None else None
    return {
        "reward_mean": mean,
        "reward_std": std,
        "num_trajectories": len(rewards),
        "num_groups": grouped.num_groups,
        "groups_too_small": grouped.groups_too_small,
        "groups_zero_variance": grouped.groups_zero_variance,
        "num_exceptions": grouped.num_exceptions,
        "num_sequences": len(grouped.batch) if grouped.batch is not None else 0,
        **grouped.metrics,
    }


def _append_history(folder: Path, metrics: dict[str, Any]) -> None:
    with (folder / "history.jsonl").open("a") as handle:
        handle.write(json.dumps({**metrics, "recorded_at": time.time()}) + "\n")
