"""`ng_train @config.toml`: Prime Intellect's training TOML (`prime rl run @config.toml`), run by nemo_gym.

The TOML is translated into an ordinary ng_train config, written next to the run's outputs
(`<output_dir>/prime_toml/config.yaml`, `train_tasks.jsonl`, `eval_tasks.jsonl`), and ng_train then runs
that config; `+key=value` overrides after the TOML apply to it (`ng_train @c.toml +trainer.num_steps=2`).
Several `@file.toml` arguments are deep-merged left to right, as prime-rl does; `@ file.toml` (with a space)
works too. `ng_train +init=true` prints a commented template (TEMPLATE) that runs as is.

| TOML key | nemo_gym config |
|---|---|
| `model` (default `embedded:smollm2`) | `trainer.engine.model_path` and `policy_model...vllm_model.model`: `embedded:smollm2` for the embedded SmolLM2-135M-Instruct (also for its Hugging Face name `HuggingFaceTB/SmolLM2-135M-Instruct`), else a local HF model folder (nothing is downloaded) |
| `max_steps` | `trainer.num_steps` |
| `batch_size` | rollouts per step, as in prime-rl: `trainer.batch_size` (tasks per step) = `batch_size / rollouts_per_example`; it must divide evenly |
| `rollouts_per_example` | `trainer.group_size` (the GRPO group; at least 2) |
| `learning_rate` | `trainer.engine.learning_rate` |
| `[sampling] max_tokens, temperature` | `trainer.responses_create_params` `max_output_tokens`, `temperature` (>= 0; the trainer's `engine.temperature` follows it, 1.0 for greedy 0) and the same for evaluation |
| `[[env]] id, name, args` | the environment's servers in `config_paths`, its training rows (with `agent_ref`) in `train_tasks.jsonl`; `name` labels the run (output folder, W&B run name) |
| `[eval] interval` | `trainer.eval.interval` |
| `[[eval.env]] id, num_examples, rollouts_per_example` | the first `num_examples` evaluation rows of each environment in `eval_tasks.jsonl`, each repeated `rollouts_per_example / g` times, `trainer.eval.num_repeats = g` (g: the gcd over the eval environments) |
| `[wandb] project, entity, name` | `trainer.logging.wandb` (enabled) |

An `env.id` is one of our environments (`resources_servers/<id>`) or an installed `verifiers` environment
package (classic `load_environment(**args)` API), run through `resources_servers/verifiers_env`: see
`nemo_gym.prime.environments`. Unknown keys are errors naming the TOML key path, with a suggestion.
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import write_jsonl
from nemo_gym.config import did_you_mean, parse_overrides
from nemo_gym.model_files.listing import offline_models
from nemo_gym.model_servers.embedded import EMBEDDED_MODELS, EMBEDDED_PREFIX, embedded_model
from nemo_gym.prime.environments import ResolvedEnv, key_path, resolve_env
from nemo_gym.train.config import TrainerConfig

__all__ = [
    "TEMPLATE",
    "PrimeConfig",
    "Translation",
    "init_requested",
    "split_toml_args",
    "read_toml",
    "parse_prime_config",
    "resolve_model",
    "offline_models_hint",
    "translate",
    "write_translation",
    "expand_toml_args",
    "check_known_keys",
]

VLLM_MODEL_YAML = "responses_api_models/vllm_model/configs/vllm_model.yaml"
INIT_FLAGS = {"+init=true", "++init=true", "init=true"}
DEFAULT_MAX_TOKENS = 256


# -- the TOML's schema -----------------------------------------------------------------------------------------
class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingSection(_Section):
    max_tokens: int = Field(
        DEFAULT_MAX_TOKENS, ge=1, description="most tokens generated per model call (Prime: required)"
    )
    temperature: float = Field(1.0, ge=0, description="sampling temperature (>= 0)")


class EnvEntry(_Section):
    id: str = Field(
        min_length=1, description="one of our environments (a resources_servers folder) or a verifiers package"
    )
    name: str | None = Field(
        None, description="label of the run: output folder and W&B run name when [wandb].name is unset"
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="resources server fields (ours) or load_environment() arguments (verifiers)"
    )


class EvalEnvEntry(_Section):
    id: str = Field(min_length=1, description="environment id, as in [[env]]")
    num_examples: int | None = Field(None, ge=1, description="first rows of the evaluation dataset (default: all)")
    rollouts_per_example: int = Field(1, ge=1, description="rollouts per evaluation row")


class EvalSection(_Section):
    interval: int = Field(0, ge=0, description="evaluate every this many steps (0: never)")
    env: list[EvalEnvEntry] = Field(default_factory=list, description="evaluation environments")


class WandbSection(_Section):
    project: str = Field("nemo_gym", description="W&B project")
    entity: str | None = Field(None, description="W&B team or user")
    name: str | None = Field(None, description="W&B run name")


class PrimeConfig(_Section):
    """A Prime training TOML (hosted `prime rl run` format)."""

    model: str = Field(EMBEDDED_PREFIX + "smollm2", description="embedded model, its HF name, or a local model folder")
    max_steps: int = Field(ge=1, description="training steps")
    batch_size: int = Field(ge=1, description="rollouts per step (tasks per step x rollouts_per_example)")
    rollouts_per_example: int = Field(ge=1, description="rollouts per task (the GRPO group size)")
    learning_rate: float | None = Field(None, gt=0, description="peak learning rate (default: the trainer's)")
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    env: list[EnvEntry] = Field(min_length=1, description="training environments")
    eval: EvalSection | None = None
    wandb: WandbSection | None = None


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section model of a field annotation (`X`, `X | None` or `list[X]`), else None."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def check_known_keys(values: dict[str, Any], model: type[BaseModel], prefix: str, source: str) -> None:
    """Every key of `values`, at any depth, is a field of `model` (or of the section model a field holds: `X`,
    `X | None`, `list[X]`), before pydantic sees them: an unknown key is named by its path with a suggestion. Used
    for Prime's TOML here and ReinforceNow's config.yml (`nemo_gym.rnow.config_yml`).

    Args:
        values: the parsed file (or a section of it); model: its pydantic model; prefix: the key path of `values`
            (`""` at the top, `"sampling."` in a section); source: the file, for the message.

    Raises:
        ConfigError: `<source>: unknown key '<path>'`, with the close key if any and the keys allowed there.
    """
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in model.model_fields:
            raise ConfigError(
                f"{source}: unknown key '{path}'{did_you_mean(key, model.model_fields)}; keys here:"
                f" {', '.join(model.model_fields)}"
            )
        section = _section_of(model.model_fields[key].annotation)
        if section is None:
            continue
        if isinstance(value, dict):
            check_known_keys(value, section, f"{path}.", source)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    check_known_keys(item, section, f"{path}[{index}].", source)


def parse_prime_config(values: dict[str, Any], source: str = "<toml>") -> PrimeConfig:
    """Validate the TOML's tables.

    Raises:
        ConfigError: an unknown key (with its key path and a suggestion), a missing required key or a bad value
            (`sampling.temperature` below 0, ...), each naming `source` and the key path.
    """
    check_known_keys(values, PrimeConfig, "", source)
    try:
        return PrimeConfig.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            got = "" if error["type"] == "missing" else f" (got {error.get('input')!r})"
            problems.append(f"key '{key_path(error['loc'])}': {error['msg']}{got}")
        raise ConfigError(f"{source}: {'; '.join(problems)}") from exc


# -- command line ----------------------------------------------------------------------------------------------
def init_requested(argv: list[str]) -> bool:
    """True when the arguments ask for the TOML template (`+init=true`)."""
    return any(arg.lower() in INIT_FLAGS for arg in argv)


def split_toml_args(argv: list[str]) -> tuple[list[Path], list[str]]:
    """(`@file.toml` paths, the other arguments); `@ file.toml` (two arguments) is accepted too.

    Raises:
        ConfigError: a lone `@` at the end.
    """
    paths, rest = [], []
    iterator = iter(argv)
    for arg in iterator:
        if arg == "@":
            following = next(iterator, None)
            if following is None:
                raise ConfigError("'@' must be followed by a TOML file: ng_train @config.toml")
            paths.append(Path(following))
        elif arg.startswith("@"):
            paths.append(Path(arg[1:]))
        else:
            rest.append(arg)
    return paths, rest


def _deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = (
            _deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def read_toml(paths: list[Path]) -> dict[str, Any]:
    """The tables of the TOML files, deep-merged left to right.

    Raises:
        ConfigError: a missing file or invalid TOML (with tomllib's line and column).
    """
    values: dict[str, Any] = {}
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"{path}: TOML file does not exist (ng_train +init=true > {path.name} writes a template)")
        try:
            values = _deep_merge(values, tomllib.loads(path.read_text()))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return values


# -- model -----------------------------------------------------------------------------------------------------
TOML_MODEL_FIX = (
    'write model = "embedded:smollm2" (the embedded SmolLM2-135M-Instruct) or the folder of a downloaded model'
)


def resolve_model(model: str, base_dir: Path, *, fix: str = TOML_MODEL_FIX) -> str:
    """`embedded:<name>` for an embedded model (by that name or its Hugging Face name), else a local folder.

    `fix` says how the caller's user names another model (in the caller's syntax: a TOML key, a config.yml key or
    a command-line override); it ends the error message, followed by the models `ng_models` finds here.

    Raises:
        ConfigError: an unknown embedded name, or a name that is neither embedded nor an existing folder.
    """
    if model.startswith(EMBEDDED_PREFIX):
        try:
            embedded_model(model)
        except ValueError as exc:
            raise ConfigError(f"key 'model': {exc}") from exc
        return model
    last = model.rstrip("/").split("/")[-1].lower()
    for name, embedded in EMBEDDED_MODELS.items():
        if last == embedded.served_name.lower():
            return EMBEDDED_PREFIX + name
    for candidate in (base_dir / model, Path.cwd() / model):
        if candidate.expanduser().is_dir():
            return str(candidate.expanduser().resolve())
    embedded_names = ", ".join(f"{e.served_name} ({EMBEDDED_PREFIX}{n})" for n, e in EMBEDDED_MODELS.items())
    raise ConfigError(
        f"key 'model': {model!r} is neither an embedded model ({embedded_names}) nor a local model folder, and nothing"
        f" is downloaded from a model hub here: {fix}. {offline_models_hint(model)}"
    )


def offline_models_hint(wanted: str | None = None) -> str:
    """`ng_models` lists ...: the models found on this machine (embedded, Hugging Face cache, trained), at most 5,
    and the folder to write when `wanted` (a Hugging Face id) is in the Hugging Face cache."""
    found = offline_models()
    cached = next((entry.model for entry in found if entry.kind == "hf_cache" and entry.name == wanted), None)
    if cached:
        return f"{wanted} is in the Hugging Face cache: use its folder {cached}"
    shown = ", ".join(str(entry.model) for entry in found[:5]) + (
        f" and {len(found) - 5} more" if len(found) > 5 else ""
    )
    return (
        f"Models on this machine (ng_models lists them with sizes): {shown}"
        if found
        else "ng_models lists the models on this machine"
    )


# -- translation -----------------------------------------------------------------------------------------------
@dataclass
class Translation:
    """Our ng_train config for a TOML, and the task rows it refers to (written by `write_translation`)."""

    config: dict[str, Any]
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def _resolve_all(prime: PrimeConfig) -> tuple[list[ResolvedEnv], list[tuple[EvalEnvEntry, ResolvedEnv]]]:
    train: dict[str, ResolvedEnv] = {}
    for index, entry in enumerate(prime.env):
        if entry.id in train:
            first = next(i for i, e in enumerate(prime.env) if e.id == entry.id)
            raise ConfigError(
                f"key 'env[{index}].id': {entry.id!r} is listed twice (also env[{first}]); list each environment once"
            )
        train[entry.id] = resolve_env(entry.id, entry.args, f"env[{index}]")
    evals = [
        (e, train.get(e.id) or resolve_env(e.id, {}, f"eval.env[{i}]"))
        for i, e in enumerate(prime.eval.env if prime.eval else [])
    ]
    return list(train.values()), evals


def _with_agent(rows: list[dict[str, Any]], agent: str) -> list[dict[str, Any]]:
    return [{**row, "agent_ref": {"name": agent}} for row in rows]


def _check_batch(prime: PrimeConfig) -> None:
    if prime.rollouts_per_example < 2:
        raise ConfigError("key 'rollouts_per_example': GRPO compares rollouts of the same example; use at least 2")
    if prime.batch_size % prime.rollouts_per_example:
        nearest = max(1, prime.batch_size // prime.rollouts_per_example) * prime.rollouts_per_example
        raise ConfigError(
            f"key 'batch_size': {prime.batch_size} rollouts per step is not a multiple of rollouts_per_example ="
            f" {prime.rollouts_per_example} (batch_size counts rollouts: examples per step x rollouts_per_example);"
            f" e.g. batch_size = {nearest}"
        )
    if prime.eval and prime.eval.interval and not prime.eval.env:
        raise ConfigError(
            "key 'eval.env': eval.interval is set but no [[eval.env]] names an environment to evaluate on"
        )


def _eval_rows(eval_envs: list[tuple[EvalEnvEntry, ResolvedEnv]]) -> tuple[list[dict[str, Any]], int]:
    """(rows, num_repeats): each environment's first `num_examples` rows, repeated so that every row gets its
    `rollouts_per_example` with one `num_repeats` for all (the gcd): 2 and 4 → num_repeats 2, rows x1 and x2."""
    repeats = math.gcd(*(entry.rollouts_per_example for entry, _ in eval_envs))
    rows = []
    for entry, env in eval_envs:
        env_rows = _with_agent(env.rows("eval", entry.num_examples), env.agent_name)
        rows += [row for row in env_rows for _ in range(entry.rollouts_per_example // repeats)]
    return rows, repeats


def _trainer_section(
    prime: PrimeConfig, model: str, output_dir: str, task_dir: Path, num_repeats: int | None
) -> dict[str, Any]:
    sampling = {"temperature": prime.sampling.temperature, "max_output_tokens": prime.sampling.max_tokens}
    engine: dict[str, Any] = {"model_path": model, "dtype": "float32", "temperature": prime.sampling.temperature or 1.0}
    if prime.learning_rate is not None:
        engine["learning_rate"] = prime.learning_rate
    trainer: dict[str, Any] = {
        "input_jsonl_fpath": str(task_dir / "train_tasks.jsonl"),
        "output_dir": output_dir,
        "num_steps": prime.max_steps,
        "batch_size": prime.batch_size // prime.rollouts_per_example,
        "group_size": prime.rollouts_per_example,
        "responses_create_params": dict(sampling),
        "engine": engine,
    }
    if num_repeats is not None:
        trainer["eval"] = {
            "interval": prime.eval.interval if prime.eval else 0,
            "input_jsonl_fpath": str(task_dir / "eval_tasks.jsonl"),
            "num_repeats": num_repeats,
            "responses_create_params": dict(sampling),
        }
    if prime.wandb:
        name = prime.wandb.name or prime.env[0].name
        trainer["logging"] = {
            "wandb": {"enabled": True, "project": prime.wandb.project, "entity": prime.wandb.entity, "name": name}
        }
    try:
        TrainerConfig.model_validate(trainer)
    except ValidationError as exc:  # a translation bug, or a value the TOML's schema let through
        raise ConfigError(f"the translated trainer section is invalid: {exc}") from exc
    return trainer


def translate(prime: PrimeConfig, *, base_dir: Path, output_dir: str, task_dir: Path) -> Translation:
    """Our config for `prime`; task files are referred to as `task_dir/{train,eval}_tasks.jsonl`.

    Raises:
        ConfigError: `batch_size` not divisible by `rollouts_per_example`, a group of one, an unknown model or
            environment, bad environment args, `eval.interval` without `[[eval.env]]`; each names its key.
    """
    _check_batch(prime)
    warnings = []
    if prime.eval and prime.eval.env and not prime.eval.interval:
        warnings.append("[[eval.env]] is set but eval.interval is 0: no evaluation will run (set [eval] interval = N)")
    if prime.sampling.temperature == 0:
        warnings.append(
            "sampling.temperature = 0: the rollouts of a group are identical, so GRPO gets no signal from them"
        )
    model = resolve_model(prime.model, base_dir)
    train_envs, eval_envs = _resolve_all(prime)
    train_rows = [row for env in train_envs for row in _with_agent(env.rows("train", None), env.agent_name)]
    eval_rows, num_repeats = _eval_rows(eval_envs) if eval_envs else ([], None)

    envs = train_envs + [env for _, env in eval_envs]
    config: dict[str, Any] = {
        "config_paths": list(dict.fromkeys(p for env in envs for p in env.config_paths)) + [VLLM_MODEL_YAML]
    }
    for env in envs:
        config.update(env.instances)
    config["policy_model"] = {"responses_api_models": {"vllm_model": {"model": model, "dtype": "float32"}}}
    config["trainer"] = _trainer_section(prime, model, output_dir, task_dir, num_repeats)
    return Translation(config, train_rows, eval_rows, warnings)


def write_translation(translation: Translation, task_dir: Path, sources: list[Path]) -> Path:
    """Write `config.yaml` and the task files into `task_dir`; returns the config's path."""
    task_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(task_dir / "train_tasks.jsonl", translation.train_rows)
    if translation.eval_rows:
        write_jsonl(task_dir / "eval_tasks.jsonl", translation.eval_rows)
    path = task_dir / "config.yaml"
    header = (
        f'# ng_train "+config_paths=[{path}]"\n'
        f"# Written by ng_train from {', '.join(map(str, sources))} (Prime TOML); it is rewritten on each run: edit the"
        " TOML.\n"
    )
    path.write_text(header + yaml.safe_dump(translation.config, sort_keys=False))
    return path


def expand_toml_args(argv: list[str]) -> list[str]:
    """ng_train's arguments with every `@file.toml` replaced by `+config_paths=[<translated config>]`
    (arguments without one are returned unchanged). Prints where the translation went and its warnings.

    Raises:
        ConfigError: see `read_toml`, `parse_prime_config` and `translate`.
    """
    paths, rest = split_toml_args(argv)
    if not paths:
        return argv
    source = ", ".join(map(str, paths))
    prime = parse_prime_config(read_toml(paths), source)
    overrides = dict(parse_overrides(rest))
    if "config_paths" in overrides:
        raise ConfigError(
            "+config_paths cannot be combined with @config.toml: the TOML's [[env]] entries name the environments"
        )
    label = (prime.wandb.name if prime.wandb and prime.wandb.name else None) or prime.env[0].name or paths[-1].stem
    output_dir = str(overrides.get("trainer.output_dir") or f"results/train/{_slug(label)}")
    task_dir = (Path(output_dir) / "prime_toml").resolve()
    try:
        translation = translate(prime, base_dir=paths[-1].resolve().parent, output_dir=output_dir, task_dir=task_dir)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    config_path = write_translation(translation, task_dir, paths)
    for warning in translation.warnings:
        print(f"ng_train: warning: {warning}", file=sys.stderr)
    print(
        f"ng_train: {source} -> {config_path} ({len(translation.train_rows)} training tasks,"
        f" {len(translation.eval_rows)} evaluation rows)",
        flush=True,
    )
    return [f"+config_paths=[{config_path}]", *rest]


TEMPLATE = """\
# Prime-style training config, run by nemo_gym:   ng_train @config.toml   (written by: ng_train +init=true > config.toml)
# Runs as is on this machine with the embedded SmolLM2-135M-Instruct. Overrides of the translated config
# follow the file: ng_train @config.toml +trainer.num_steps=2   (see nemo_gym/prime/config.py for the mapping)

model = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded default (= "embedded:smollm2"), or a local model folder
max_steps = 20                                 # training steps
batch_size = 16                                # rollouts per step: 4 examples x rollouts_per_example (must divide evenly)
rollouts_per_example = 4                       # rollouts per example: the GRPO group (>= 2)
# learning_rate = 1e-6

[sampling]
max_tokens = 128                               # tokens generated per answer
temperature = 1.0                              # >= 0

[[env]]
id = "reasoning_gym"                           # one of resources_servers/<id>, or an installed verifiers package ("owner/name")
name = "smollm2-reasoning-gym"                 # names the run: results/train/<name>, W&B run name
# args = { binary_reward = true }             # fields of the environment's server (verifiers: load_environment() arguments)

# [[env]]                                      # more environments: their tasks are mixed
# id = "mcqa"

[eval]
interval = 5                                   # evaluate every 5 steps (and before the first, after the last)

[[eval.env]]
id = "reasoning_gym"
num_examples = 5                               # first rows of the environment's evaluation data
rollouts_per_example = 2

# [wandb]                                      # log to Weights & Biases (offline without WANDB_API_KEY or a login)
# project = "nemo_gym"
# entity = "my-team"
# name = "smollm2-reasoning-gym"
"""
