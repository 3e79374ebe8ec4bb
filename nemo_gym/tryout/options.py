"""The parameters of `ng_try` (`TryOptions`, documented in `nemo_gym.tryout.rollouts`) and the split of its command
line into them and the rest (config for ng_run, or config.yml overrides of an rnow project).
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import parse_overrides, validation_problems
from nemo_gym.serving.responses_params import ResponsesCreateParams

__all__ = ["TryOptions", "split_arguments"]


class TryOptions(BaseModel):
    """Parameters of `ng_try` (any other `+key=value` is config, or a config.yml override of an rnow project)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    rnow_project: str | None = Field(
        None, description="a ReinforceNow project folder (config.yml, train.jsonl, rewards.py, tools.py)"
    )
    config_paths: list[str] = Field(
        default_factory=list,
        description=(
            "YAML files of a nemo_gym config (with +input_jsonl_fpath); with +rnow_project: extra servers, e.g. a"
            " policy_model"
        ),
    )
    input_jsonl_fpath: str | None = Field(
        None, description="task JSONL of a nemo_gym config: one row a line with responses_create_params"
    )
    agent_name: str | None = Field(
        None, description="agent for rows without agent_ref (default: the config's only agent)"
    )
    model: str | None = Field(
        None,
        description=(
            "embedded:smollm2, a local HF model folder, an OpenAI-compatible base URL (http://host:port/v1), or a model"
            " server instance of the config"
        ),
    )
    model_name: str | None = Field(
        None, description="with an endpoint URL: the model name to send (default: the endpoint's only /models entry)"
    )
    num_rollouts: int = Field(1, ge=1, description="rollouts per chosen entry")
    entries: list[int] | None = Field(
        None, description="0-based indices of the entries to run, e.g. [0,3,7] (default: one random entry)"
    )
    all_entries: bool = Field(False, alias="all", description="run every entry")
    seed: int | None = Field(
        None, description="seed of the random entry choice and (vllm_model) of the sampling; default: drawn and printed"
    )
    output: str | None = Field(
        None,
        description=(
            "JSON file of the rollouts (default results/try/<name>-<time>.json; the ng_run log goes next to it)"
        ),
    )
    head_server_url: str | None = Field(
        None, description="use the servers of this running ng_run instead of starting them"
    )
    responses_create_params: ResponsesCreateParams = Field(
        default_factory=dict,
        description=(
            "merged over each row's responses_create_params, e.g. {max_output_tokens: 64, temperature: 0.7} (Responses"
            " API create parameters)"
        ),
    )
    num_samples_in_parallel: int = Field(4, ge=1, description="most rollouts in flight at once")
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one rollout (/run call), seconds")
    max_retries: int = Field(
        3,
        ge=0,
        description="retries of a rollout after a transient failure (connection error, timeout, 429, 502/503/504)",
    )
    startup_timeout_s: float = Field(
        1800.0, gt=0, description="seconds to wait for the started servers (vLLM builds its engine on first use)"
    )


def split_arguments(argv: list[str]) -> tuple[TryOptions, list[str]]:
    """`(ng_try's options, the other arguments as given)`: the others are config for ng_run or config.yml overrides.

    Raises:
        ConfigError: a bad option value, or an unknown top-level key that looks like a misspelt option.
    """
    names = {info.alias or name: name for name, info in TryOptions.model_fields.items()}
    values: dict[str, Any] = {}
    rest: list[str] = []
    for arg in argv:
        [(key, value)] = parse_overrides([arg])
        if key in names:
            values[key] = value
            continue
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.75) if "." not in key else []
        if close:
            raise ConfigError(f"ng_try: unknown parameter +{key} (did you mean +{close[0]}?); see +help=true")
        rest.append(arg)
    try:
        return TryOptions.model_validate(values), rest
    except ValidationError as exc:
        problems = "; ".join(validation_problems(TryOptions, exc, "+{key}"))
        raise ConfigError(f"ng_try: {problems} (see +help=true)") from exc
