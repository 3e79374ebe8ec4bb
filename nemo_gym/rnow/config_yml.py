"""A ReinforceNow project's `config.yml`: its schema (rnow's ProjectConfig, with the defaults of its docs), its
validation (each problem naming its key), and which `+key=value` overrides edit it (`nemo_gym.rnow.project`
explains the translation)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.prime.config import check_known_keys

__all__ = ["RnowConfig", "parse_config", "is_rnow_key", "set_override"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSection(_Section):
    train_file: str = Field("train.jsonl", description="entries file, relative to the project")
    batch_size: int = Field(ge=1, description="entries (prompts) per step")
    group_size: int = Field(4, ge=1, description="rollouts per entry")
    val_split: float | None = Field(None, ge=0, le=1, description="SFT only (ignored)")


class ModelSection(_Section):
    path: str | list[str] = Field(description="model, or a list of models (one run each)")
    qlora_rank: int = Field(32, ge=1, description="LoRA rank")
    qlora_alpha: int | None = Field(None, ge=1, description="LoRA alpha (default 2 x rank)")
    name: str | None = None
    description: str | None = None


class AlgorithmSection(_Section):
    loss_fn: Literal["ppo", "importance_sampling"] = "ppo"
    adv_estimator: Literal["grpo", "gae", "reinforce"] = "grpo"
    kl_penalty_coef: float | None = Field(None, ge=0, description="KL to the reference model (unset: none)")


class RolloutSection(_Section):
    max_turns: int = Field(1, ge=1, description="model calls per episode")
    max_context_window: int = Field(32768, ge=1, description="most prompt tokens of an entry")
    termination_policy: Literal["last_tool", "max_turns"] = "last_tool"
    reasoning_mode: Literal["disabled", "low", "medium", "high"] | None = None
    tool_timeout: float = Field(60, gt=0, description="seconds per tool call")
    max_tool_response: int | None = Field(None, ge=1, description="tool outputs are cut to this many characters")
    rollout_timeout: float | None = Field(None, gt=0, description="seconds per rollout")
    include_thinking: bool = False
    mcp_url: str | list[str] | None = None


class TrainerSection(_Section):
    num_epochs: int = Field(ge=1, description="passes over the entries")
    learning_rate: float = Field(1e-4, gt=0)
    save_step: int = Field(-1, ge=-1, description="checkpoint every N steps; -1: at the end only")
    max_billing: float | None = None


class RnowConfig(_Section):
    """ReinforceNow's config.yml."""

    project_id: str = ""
    project_name: str = ""
    dataset_id: str = ""
    organization_id: str | None = None
    description: str | None = None
    dataset_type: Literal["rl", "sft", "distill", "midtrain"]
    data: DataSection
    model: ModelSection
    trainer: TrainerSection
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    teacher: dict[str, Any] | None = None
    evals: list[dict[str, Any]] = Field(default_factory=list)


SECTIONS = {"data", "model", "algorithm", "rollout", "trainer"}
TOP_LEVEL = {"project_id", "project_name", "dataset_id", "organization_id", "description", "dataset_type"}


def is_rnow_key(key: str) -> bool:
    """Whether an override `+key=value` edits config.yml (else it goes to the translated config)."""
    head, _, rest = key.partition(".")
    if head == "trainer":
        return rest.split(".")[0] in TrainerSection.model_fields
    return head in TOP_LEVEL or (head in SECTIONS and bool(rest)) or key == "algorithm"


def set_override(values: dict[str, Any], key: str, value: Any) -> None:
    """Set config.yml's dotted `key` (`data.batch_size`) in `values` to `value`, making the sections on the way."""
    *parents, last = key.split(".")
    for part in parents:
        values = values.setdefault(part, {})
        if not isinstance(values, dict):
            raise ConfigError(f"override +{key}: '{part}' is not a section of config.yml")
    values[last] = value


def parse_config(values: dict[str, Any], source: str = "config.yml") -> RnowConfig:
    """Validate config.yml's values.

    Raises:
        ConfigError: unknown keys (with a suggestion), bad values, unsupported features; each names the key.
    """
    if isinstance(values.get("algorithm"), str):  # `+algorithm=sft`: the command line's choice of the training mode
        choice = values.pop("algorithm")
        if choice != "sft":
            raise ConfigError(
                f"{source}: key 'algorithm': +algorithm={choice} is not a training mode; use +algorithm=sft, or set"
                " algorithm.adv_estimator for RL"
            )
        values["dataset_type"] = "sft"
    check_known_keys(values, RnowConfig, "", source)
    try:
        config = RnowConfig.model_validate(values)
    except ValidationError as exc:
        problems = [
            f"key '{'.'.join(map(str, e['loc']))}': {e['msg']}"
            + ("" if e["type"] == "missing" else f" (got {e.get('input')!r})")
            for e in exc.errors()
        ]
        raise ConfigError(f"{source}: {'; '.join(problems)}") from exc
    if config.dataset_type not in ("rl", "sft"):
        raise ConfigError(
            f"{source}: key 'dataset_type': {config.dataset_type!r} is not supported in rnow projects: use rl or sft"
            " (for distillation and continued pre-training write an ng_train config with trainer.algorithm on_distill"
            " or pretrain)"
        )
    if config.teacher is not None:
        raise ConfigError(f"{source}: key 'teacher': distillation is not supported yet; remove the section")
    if config.rollout.mcp_url:
        raise ConfigError(
            f"{source}: key 'rollout.mcp_url': MCP tool servers are not supported in rnow projects yet; define the"
            " tools in tools.py"
        )
    if config.algorithm.adv_estimator == "gae":
        raise ConfigError(
            f"{source}: key 'algorithm.adv_estimator': 'gae' is not supported: it needs a value model (critic), which"
            " this trainer has not; use grpo or reinforce"
        )
    return config
