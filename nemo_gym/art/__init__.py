"""A Python API in the style of OpenPipe ART: write an async rollout function with the OpenAI client, train
without writing a server.

    import nemo_gym.art as art

    model = art.TrainableModel(name="agent-001", project="arithmetic", base_model="embedded:smollm2")
    await model.register(art.LocalBackend())
    client = model.openai_client()

    async def rollout(task) -> art.Trajectory:
        messages = [{"role": "user", "content": task["question"]}]
        completion = await client.chat.completions.create(model=model.inference_model_name, messages=messages)
        choice = completion.choices[0]
        return art.Trajectory(messages_and_choices=[*messages, choice], reward=score(choice, task))

    for batch in art.iterate_dataset(tasks, groups_per_step=4, num_epochs=1, initial_step=await model.get_step()):
        groups = await art.gather_trajectory_groups(art.TrajectoryGroup(rollout(t) for _ in range(8)) for t in
        batch.items) await model.train(groups, learning_rate=5e-6)

Modules: `trajectories` (Trajectory, TrajectoryGroup), `gather`, `utils` (iterate_dataset, retry), `model`
(Model, TrainableModel, TrainConfig), `backend` (LocalBackend: vllm_model + the GRPO engine), `tokens`
(groups → TrainingBatch), `ruler` (ruler_score_group), `server_process`. See examples/art_style_train.py.

Where it departs from ART: the default model is the embedded SmolLM2-135M-Instruct; training is full
fine-tuning (LoRA through `engine={"lora": {...}}`) on our DeepSpeed engine, and each train call is one
optimizer step; metrics must be numbers or bools (validated); no W&B/S3 integration, no `additional_histories`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemo_gym.art.gather import gather_trajectory_groups
from nemo_gym.art.model import Model, TrainableModel, TrainConfig
from nemo_gym.art.ruler import ruler_score_group
from nemo_gym.art.trajectories import Trajectory, TrajectoryGroup
from nemo_gym.art.utils import DatasetBatch, iterate_dataset, retry

if TYPE_CHECKING:
    from nemo_gym.art.backend import LocalBackend

__all__ = [
    "DatasetBatch",
    "LocalBackend",
    "Model",
    "TrainConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "gather_trajectory_groups",
    "iterate_dataset",
    "retry",
    "ruler_score_group",
]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":  # imports torch: only when asked for
        from nemo_gym.art.backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
