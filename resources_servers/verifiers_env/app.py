"""verifiers_env: a `verifiers` environment package (classic `load_environment()` API) as a resources server.

The environment is loaded once at startup (`load_environment(**env_args)`); its dataset rows become task rows
through the prepare step (`prepare.py`, or `ng_train @config.toml`, which runs it), and `/verify` scores the
trajectory with the environment's rubric (`score_rollout`). See `vf_adapter.py` for the contract relied on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.openai_convert import ConversionError
from nemo_gym.serving.server import ServerConfig, Session

from . import vf_adapter

EXAMPLE_ENVS = str(Path(__file__).resolve().parent / "example_envs")  # the bundled vf_reverse_text package


class VerifiersEnvConfig(ServerConfig):
    env_id: str = Field(
        "vf_reverse_text", description="environment id (`owner/name` or a module name): module `name` with `-` as `_`"
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the environment's load_environment()"
    )
    python_path: list[str] = Field(
        default_factory=lambda: [EXAMPLE_ENVS],
        description="folders appended to sys.path to find the environment's module (ng_train sets where it found it)",
    )


class VerifiersTask(VerifyRequest):
    answer: str = Field("", description="ground truth the rubric compares with")
    task: str = Field("default", description="task type of the row (verifiers' `task` column)")
    info: dict[str, Any] | str = Field(
        default_factory=dict, description="structured task metadata (a dict or a JSON string)"
    )


class VerifiersEnvServer(ResourcesServer):
    Config = VerifiersEnvConfig
    verify_request_type = VerifiersTask
    # The rubric's weighted sum decides; [0, 1] for 0/1 reward functions whose weights sum to 1.
    reward_range: ClassVar[tuple[float, float]] = (float("-inf"), float("inf"))

    async def startup(self) -> None:
        config: VerifiersEnvConfig = self.config  # type: ignore[assignment]
        self.env = vf_adapter.load_env(config.env_id, config.env_args, config.python_path)

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        """The rubric's reward; 0.0 with `failure_reason: malformed_output` (and `output_error` saying what is
        wrong) when `response.output` has an item or content part of the wrong JSON type."""
        row = request.model_dump()
        try:
            reward, metrics = await vf_adapter.score(self.env, row, request.response)
        except ConversionError as exc:  # raised by completion_of, before the rubric runs
            return VerifyResult(reward=0.0, failure_reason="malformed_output", output_error=str(exc))
        return VerifyResult(reward=reward, reward_components=metrics or None)
