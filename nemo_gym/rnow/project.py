"""A ReinforceNow project folder (`config.yml`, `train.jsonl`, `rewards.py`, optional `tools.py`,
`requirements.txt`) run by nemo_gym: `ng_run +rnow_project=DIR`, `ng_train +rnow_project=DIR`.

Everything is checked before anything runs (config keys, every entry, reward and tool names, sandbox
functions, prompt lengths), each problem with its `config.yml` key or `train.jsonl:<line>`. Then the project
is translated into an ordinary config, written to `<out>/config.yaml` with the task rows in
`<out>/train_tasks.jsonl` (`<out>`: `results/rnow/<name>` for ng_run, `<trainer.output_dir>/rnow_project` for
ng_train, whose output_dir defaults to `results/train/<name>`; `<name>`: `Project.output_name`, the project name and a
hash of its folder, so two projects of one name never share outputs), and the command runs that config.
`+key=value` overrides of rnow's keys (`+data.batch_size=8`, `+rollout.max_turns=3`, `+model.path=...` or
`+model=...` as for ng_try, `+trainer.num_epochs=2`) edit config.yml's values; other overrides
(`+trainer.num_steps=2`, `+config_paths=[...]`) go to the translated config. A `policy_model` defined by the user's
own `+config_paths` (e.g. scripted_model, openai_model) replaces the vllm_model policy.

| config.yml | nemo_gym |
|---|---|
| `model.path` (a list: one ng_train run per model, in order) | `policy_model` vllm_model `model` and `trainer.engine.model_path`: `embedded:smollm2` for SmolLM2-135M-Instruct (also by its HF name), else a local model folder |
| `model.qlora_rank`, `qlora_alpha` (default 2 x rank) | `trainer.engine.lora.rank`, `alpha` (LoRA, not quantized: no QLoRA here) |
| `data.batch_size`, `data.group_size` | `trainer.batch_size` (tasks per step), `trainer.group_size` (rollouts per task, >= 2) |
| `trainer.num_epochs` | `trainer.num_steps` = num_epochs x ceil(entries / batch_size) |
| `trainer.learning_rate`, `save_step` | `trainer.engine.learning_rate`, `trainer.checkpoint_interval` (-1 → 0: at the end) |
| `algorithm.adv_estimator` | grpo → `grpo`; reinforce → `rloo` (REINFORCE with the leave-one-out group baseline, Ahmadian et al. 2024); gae → error (needs a critic, which this trainer has not) |
| `algorithm.loss_fn`, `kl_penalty_coef` | `trainer.loss.loss_type` (`ppo`, `importance_sampling`), `trainer.loss.kl_coef` (only when set in config.yml) |
| `rollout.max_turns`, `termination_policy` | simple_agent `max_steps`; both policies end at max_turns, and with either one a model answer without a tool call ends the episode (there is nothing to continue with) |
| `rollout.max_context_window` | the prompt-length check; vllm_model `max_model_len` when set in config.yml; SFT `trainer.supervised.max_seq_len`. Above the model's own limit (its config.json's `max_position_embeddings`) it is lowered to that limit with a warning: rnow's templates are written for larger models |
| `rollout.reasoning_mode` | `reasoning: {effort}` of every row's responses_create_params (`disabled`: none) |
| `rollout.tool_timeout`, `max_tool_response`, `rollout_timeout` | simple_agent `tool_timeout_s`; rnow_project `max_tool_response_chars` (characters, where rnow counts tokens); `trainer.request_timeout_s` |

SFT projects (`dataset_type: sft`, or `+algorithm=sft` on the command line): every entry ends with the assistant
turn to learn (tool calls with JSON-string arguments; `rewards` not needed); ng_train then trains with
`trainer.algorithm: sft` (nemo_gym.train.supervised) on `<out>/train_sft.jsonl` (one `{messages, tools}` row per
entry, `$variables` substituted), `trainer.num_epochs` → `trainer.supervised.num_epochs`; no server is started.
ng_run has nothing to serve for an SFT project and says so.

Not supported (clear errors): `dataset_type` `distill` and `midtrain` (use ng_train's `on_distill` and
`pretrain` algorithms with an ordinary config), `teacher`, `rollout.mcp_url`. Ignored with a warning: `evals`,
`trainer.max_billing`, `data.val_split`.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import write_jsonl
from nemo_gym.config import load_config, parse_overrides
from nemo_gym.model_servers.embedded import context_limit
from nemo_gym.prime.config import resolve_model
from nemo_gym.rnow.config_yml import RnowConfig, is_rnow_key, parse_config, set_override
from nemo_gym.rnow.entries import Entry, entry_problems, entry_tool_names, read_entries, substituted_messages
from nemo_gym.rnow.loading import ProjectFunctions, load_functions
from nemo_gym.rnow.tokens import PromptCounter
from nemo_gym.serving.openai_convert import messages_to_input_items
from nemo_gym.train.config import TrainerConfig

__all__ = [
    "Project",
    "RNOW_FLAG",
    "load_project",
    "is_sft",
    "split_rnow_args",
    "translate",
    "write_translation",
    "expand_rnow_args",
]

RNOW_FLAG = "rnow_project"
VLLM_MODEL_YAML = "responses_api_models/vllm_model/configs/vllm_model.yaml"
SERVER_NAME, AGENT_NAME = "rnow_project", "rnow_project_agent"
MAX_PROBLEMS_SHOWN = 30
MODEL_KEY_PREFIX = "key 'model': "  # how resolve_model's errors start
RNOW_MODEL_FIX = (
    "run the project on the embedded SmolLM2-135M-Instruct with +model=embedded:smollm2 (or write model.path:"
    " embedded:smollm2 in config.yml), or on a downloaded model with +model=<its folder>"
)


# -- the project --------------------------------------------------------------------------------------------
@dataclass
class Project:
    """A checked project: its folder, config, entries and functions."""

    root: Path
    config: RnowConfig
    entries: list[Entry]
    functions: ProjectFunctions
    models: list[str]  # resolved: embedded:<name> or a local folder
    context_window_set: bool = False  # rollout.max_context_window given in config.yml or an override
    warnings: list[str] = field(default_factory=list)
    context_windows: dict[str, int] = field(
        default_factory=dict
    )  # per model: max_context_window, at most the model's limit

    def context_window(self, model: str) -> int:
        """Tokens of `model`'s context: rollout.max_context_window, lowered to the model's limit (see
        `clamp_context_windows`)."""
        return self.context_windows.get(model, self.config.rollout.max_context_window)

    @property
    def sft(self) -> bool:
        """Whether the entries are SFT data (dataset_type sft, or +algorithm=sft)."""
        return self.config.dataset_type == "sft"

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.config.project_name or self.root.name).strip("-") or "rnow"

    @property
    def output_name(self) -> str:
        """`<slug>-<8 hex digits of the folder's path hash>`: the name of the project's output folders, one per
        project folder (rnow's templates share project names: rl-single and tutorial-reward are both `rl-project`)."""
        return f"{self.slug}-{hashlib.sha256(str(self.root).encode()).hexdigest()[:8]}"


def _read_config(root: Path, overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    path = root / "config.yml"
    if not path.is_file():
        raise ConfigError(f"{root}: no config.yml (see examples/rnow_project/config.yml)")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    for key, value in overrides:
        set_override(values, key, value)
    return values


def _resolve_models(config: RnowConfig, root: Path) -> list[str]:
    paths = config.model.path if isinstance(config.model.path, list) else [config.model.path]
    if not paths:
        raise ConfigError("config.yml: key 'model.path': the list of models is empty")
    models = []
    for index, path in enumerate(paths):
        try:
            models.append(resolve_model(path, root, fix=RNOW_MODEL_FIX))
        except ConfigError as exc:
            key = "model.path" if isinstance(config.model.path, str) else f"model.path[{index}]"
            raise ConfigError(f"config.yml: key '{key}': {str(exc).removeprefix(MODEL_KEY_PREFIX)}") from exc
    return models


def clamp_context_windows(project: Project) -> None:
    """`project.context_windows`: rollout.max_context_window per model, lowered to the model's context limit
    (`nemo_gym.model_servers.embedded.context_limit`) with a warning when it was set above it (vLLM refuses a
    max_model_len over
    the model's limit, after loading it)."""
    window = project.config.rollout.max_context_window
    for model in project.models:
        limit = context_limit(model)
        project.context_windows[model] = window if limit is None else min(window, limit.tokens)
        if limit is not None and window > limit.tokens and project.context_window_set:
            project.warnings.append(
                f"config.yml: key 'rollout.max_context_window': {window} tokens is more than {model} takes"
                f" ({limit.source}: {limit.tokens}); using {limit.tokens}"
            )


def _entry_problems(project: Project) -> list[str]:
    train_file = project.config.data.train_file
    problems = []
    counters = {model: PromptCounter(model) for model in project.models}
    for line, entry in project.entries:
        found = entry_problems(entry, project.functions, sft=project.sft)
        if not found:
            messages, tools = (
                substituted_messages(entry),
                [project.functions.tools[n].schema for n in entry_tool_names(entry, project.functions)],
            )
            for model, counter in counters.items():
                tokens, window = counter.count(messages, tools), project.context_window(model)
                if tokens > window:
                    limit = (
                        "" if window == project.config.rollout.max_context_window else f" (lowered to {model}'s limit)"
                    )
                    found.append(
                        f"the {'conversation' if project.sft else 'prompt'} is {tokens} tokens ({counter.describe()}),"
                        f" longer than rollout.max_context_window = {window}{limit}"
                    )
        problems += [f"{train_file}:{line}: {problem}" for problem in found]
    return problems


def _sft_values(values: dict[str, Any]) -> bool:
    return values.get("dataset_type") == "sft" or values.get("algorithm") == "sft"


def is_sft(root: str | Path, overrides: list[tuple[str, Any]] | None = None) -> bool:
    """Whether the project's entries are SFT data (`dataset_type: sft`, or `+algorithm=sft`), from config.yml alone.

    Raises:
        ConfigError: no config.yml, or one that is not a YAML mapping.
    """
    return _sft_values(_read_config(Path(root).expanduser().resolve(), overrides or []))


def load_project(root: str | Path, overrides: list[tuple[str, Any]] | None = None) -> Project:
    """Read and check a project (config.yml with `overrides` applied, every entry, the functions).

    Raises:
        ConfigError: every problem found (up to 30 shown), each with its config.yml key or train.jsonl line.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"+{RNOW_FLAG}={root}: no such folder")
    values = _read_config(root, overrides or [])
    config = parse_config(values)
    models = _resolve_models(config, root)
    functions = load_functions(root, require_rewards=config.dataset_type != "sft")
    train_path = root / config.data.train_file
    if not train_path.is_file():
        raise ConfigError(f"config.yml: key 'data.train_file': {train_path} does not exist")
    entries, problems = read_entries(train_path)
    project = Project(root, config, entries, functions, models, "max_context_window" in (values.get("rollout") or {}))
    clamp_context_windows(project)
    problems += _entry_problems(project)
    if config.data.group_size < 2 and not project.sft:
        problems.insert(0, "config.yml: key 'data.group_size': GRPO compares the rollouts of an entry: use at least 2")
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN] + (
            [f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more"] if len(problems) > MAX_PROBLEMS_SHOWN else []
        )
        raise ConfigError(f"rnow project {root} has {len(problems)} problem(s):\n  " + "\n  ".join(shown))
    for key, ignored in (
        ("evals", config.evals),
        ("trainer.max_billing", config.trainer.max_billing),
        ("data.val_split", config.data.val_split),
    ):
        if ignored:
            project.warnings.append(f"config.yml: key '{key}' is ignored here")
    return project


# -- translation --------------------------------------------------------------------------------------------
@dataclass
class Translation:
    """Our config for one model of a project, and its task rows."""

    model: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]


def task_rows(project: Project) -> list[dict[str, Any]]:
    """One task row per entry: responses_create_params (input, the entry's tools) + the fields verify reads."""
    rows = []
    reasoning = project.config.rollout.reasoning_mode
    for line, entry in project.entries:
        tools = entry_tool_names(entry, project.functions)
        params: dict[str, Any] = {"input": messages_to_input_items(substituted_messages(entry))}
        if tools:
            params["tools"] = [project.functions.tools[name].schema for name in tools]
        if reasoning and reasoning != "disabled":
            params["reasoning"] = {"effort": reasoning}
        row = {
            "responses_create_params": params,
            "rewards": entry["rewards"],
            "metadata": entry.get("metadata") or {},
            "variables": entry.get("variables") or {},
            "tools": tools,
            "rnow_line": line,
            "agent_ref": {"name": AGENT_NAME},
        }
        if entry.get("docker"):
            row["docker"] = entry["docker"]
        rows.append(row)
    return rows


def sft_rows(project: Project) -> list[dict[str, Any]]:
    """One chat row per SFT entry: `messages` (variables substituted; tool calls as they are), `tools` (schemas)."""
    rows = []
    for line, entry in project.entries:
        row: dict[str, Any] = {"messages": substituted_messages(entry), "rnow_line": line}
        tools = entry_tool_names(entry, project.functions)
        if tools:
            row["tools"] = [project.functions.tools[name].schema for name in tools]
        rows.append(row)
    return rows


def _trainer(project: Project, model: str, output_dir: str, tasks_path: Path) -> dict[str, Any]:
    config = project.config
    steps_per_epoch = math.ceil(len(project.entries) / config.data.batch_size)
    lora = {"rank": config.model.qlora_rank, "alpha": float(config.model.qlora_alpha or 2 * config.model.qlora_rank)}
    loss: dict[str, Any] = {"loss_type": config.algorithm.loss_fn}
    if config.algorithm.kl_penalty_coef is not None:
        loss["kl_coef"] = config.algorithm.kl_penalty_coef
    trainer: dict[str, Any] = {
        "input_jsonl_fpath": str(tasks_path),
        "agent_name": AGENT_NAME,
        "output_dir": output_dir,
        "num_steps": config.trainer.num_epochs * steps_per_epoch,
        "batch_size": config.data.batch_size,
        "group_size": config.data.group_size,
        "advantage_estimator": {"grpo": "grpo", "reinforce": "rloo"}[config.algorithm.adv_estimator],
        "engine": {
            "model_path": model,
            "dtype": "float32",
            "learning_rate": config.trainer.learning_rate,
            "lora": lora,
        },
        "loss": loss,
        "checkpoint_interval": max(config.trainer.save_step, 0),
    }
    if config.rollout.rollout_timeout:
        trainer["request_timeout_s"] = config.rollout.rollout_timeout
    if project.sft:  # no rollouts: the entries are the data
        for key in ("agent_name", "group_size", "advantage_estimator", "loss", "request_timeout_s"):
            trainer.pop(key, None)
        trainer.update(
            algorithm="sft",
            supervised={"num_epochs": config.trainer.num_epochs, "max_seq_len": project.context_window(model)},
        )
    try:
        TrainerConfig.model_validate(trainer)
    except ValidationError as exc:
        raise ConfigError(f"config.yml: the translated trainer section is invalid: {exc}") from exc
    return trainer


def translate(
    project: Project,
    model: str,
    *,
    tasks_path: Path,
    output_dir: str | None = None,
    own_policy: bool = False,
    max_context_window_set: bool = False,
) -> Translation:
    """Our config for `project` with policy `model`; with `output_dir`, a `trainer:` section too (ng_train).
    `own_policy`: the user's config_paths define policy_model (no vllm_model is added)."""
    rollout = project.config.rollout
    server: dict[str, Any] = {
        "entrypoint": "app.py",
        "domain": "other",
        "description": f"rnow project {project.root.name}",
        "project_dir": str(project.root),
        "max_tool_response_chars": rollout.max_tool_response,
    }
    if (project.root / "requirements.txt").is_file():  # the project's own packages go into its server's environment
        server["extra_requirements"] = [str(project.root / "requirements.txt")]
    agent = {
        "entrypoint": "app.py",
        "resources_server": {"type": "resources_servers", "name": SERVER_NAME},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
        "max_steps": rollout.max_turns,
        "tool_timeout_s": float(rollout.tool_timeout),
    }
    config: dict[str, Any] = {
        "config_paths": [] if own_policy else [VLLM_MODEL_YAML],
        SERVER_NAME: {"resources_servers": {"rnow_project": server}},
        AGENT_NAME: {"responses_api_agents": {"simple_agent": agent}},
    }
    if not own_policy:
        policy: dict[str, Any] = {"model": model, "dtype": "float32"}
        if max_context_window_set:
            policy["max_model_len"] = project.context_window(model)
        config["policy_model"] = {"responses_api_models": {"vllm_model": policy}}
    if output_dir is not None:
        config["trainer"] = _trainer(project, model, output_dir, tasks_path)
    return Translation(model, config, sft_rows(project) if project.sft else task_rows(project))


def write_translation(
    translation: Translation, out_dir: Path, project: Project, command: str, rows_name: str = "train_tasks.jsonl"
) -> Path:
    """Write `config.yaml` and the rows (`train_tasks.jsonl`, or `train_sft.jsonl` for SFT) into `out_dir`; returns the
    config's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / rows_name, translation.rows)
    path = out_dir / "config.yaml"
    header = (
        f'# {command} "+config_paths=[{path}]"\n# Written from the rnow project {project.root} (model'
        f" {translation.model}); rewritten on each run: edit the project.\n"
    )
    path.write_text(header + yaml.safe_dump(translation.config, sort_keys=False))
    return path


# -- command line -------------------------------------------------------------------------------------------
def split_rnow_args(argv: list[str]) -> tuple[str | None, list[tuple[str, Any]], list[str], list[str]]:
    """(project dir, rnow overrides, the user's config_paths, the other arguments)."""
    project, rnow, config_paths, rest = None, [], [], []
    for arg in argv:
        pairs = parse_overrides([arg]) if "=" in arg else []
        key, value = pairs[0] if pairs else (None, None)
        if key == RNOW_FLAG:
            project = str(value)
        elif key == "config_paths":
            config_paths += [str(p) for p in (value if isinstance(value, list) else [value])]
        elif key == "model" and isinstance(
            value, (str, list)
        ):  # `+model=X`: ng_try's spelling, the same as +model.path=X
            rnow.append(("model.path", value))
        elif key is not None and is_rnow_key(key):
            rnow.append((key, value))
        else:
            rest.append(arg)
    return project, rnow, config_paths, rest


def _defines_policy(config_paths: list[str]) -> bool:
    if not config_paths:
        return False
    loaded = load_config([f"+config_paths=[{','.join(config_paths)}]"], resolve=False)
    return "policy_model" in loaded.values


def _model_output_dirs(
    project: Project, index: int, model: str, *, mode: Literal["run", "train"], trainer_dir: str | None
) -> tuple[str, str | None, Path]:
    """Where the run of the project's model number `index` writes: `(suffix, output_dir, translation folder)`.
    `suffix` tells the runs of several models apart (`-<index>-<model name>`; "" for one model); `output_dir` is the
    trainer's (`trainer_dir`, the user's `trainer.output_dir`, with the suffix as a subfolder; None for ng_run); the
    translation goes to `<output_dir>/rnow_project` (ng_train) or `results/rnow/<project>` (ng_run)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", model.split("/")[-1].removeprefix("embedded:"))
    suffix = "" if len(project.models) == 1 else f"-{index}-{name}"  # the index: two entries may name one model
    if mode == "run":
        return suffix, None, Path(f"results/rnow/{project.output_name}").resolve()
    output_dir = (
        str(Path(trainer_dir) / suffix.lstrip("-"))
        if trainer_dir and suffix
        else (trainer_dir or f"results/train/{project.output_name}{suffix}")
    )
    return suffix, output_dir, (Path(output_dir) / "rnow_project").resolve()


def _translation_note(project: Project, config_path: Path, num_rows: int, tasks_path: Path) -> str:
    """The line that tells what the project became: the translated config, and the SFT conversations or the tasks
    (with the command that collects rollouts of them)."""
    if project.sft:
        return f"rnow project {project.root} -> {config_path} ({num_rows} SFT conversations in {tasks_path})"
    return (
        f"rnow project {project.root} -> {config_path} ({num_rows} tasks; collect with: ng_collect_rollouts"
        f" +agent_name={AGENT_NAME} +input_jsonl_fpath={tasks_path} +output_jsonl_fpath=rollouts.jsonl)"
    )


def expand_rnow_args(argv: list[str], *, mode: Literal["run", "train"], caller: str | None = None) -> list[list[str]]:
    """The arguments of each run for `+rnow_project=DIR` (unchanged, as one run, without it): the project is
    checked and translated, and `+config_paths=[<translated config>, <the user's config_paths>]` replaces it.
    ng_run gets one run (a `model.path` list is an error there); ng_train one per model. `caller` names the command
    in the notes and warnings printed (default: ng_run or ng_train).

    Raises:
        ConfigError: any problem of the project (see `load_project`).
    """
    project_dir, overrides, user_paths, rest = split_rnow_args(argv)
    if project_dir is None:
        return [argv]
    project = load_project(project_dir, overrides)
    command = "ng_run" if mode == "run" else "ng_train"
    speaker = caller or command  # who prints the notes and warnings (ng_try translates as ng_run does)
    if mode == "run" and project.sft:
        raise ConfigError(
            f"rnow project {project.root} is SFT data (dataset_type sft / +algorithm=sft): there is nothing to serve;"
            f" train it with ng_train +{RNOW_FLAG}={project_dir} +algorithm=sft"
        )
    if mode == "run" and len(project.models) > 1:
        raise ConfigError(
            f"config.yml: key 'model.path' lists {len(project.models)} models: ng_run serves one policy; pick one with"
            " +model.path=<model>"
        )
    own_policy = _defines_policy(user_paths)
    trainer_dir = dict(parse_overrides([a for a in rest if "=" in a])).get("trainer.output_dir")
    runs = []
    for index, model in enumerate(project.models):
        suffix, output_dir, out_dir = _model_output_dirs(project, index, model, mode=mode, trainer_dir=trainer_dir)
        tasks_path = out_dir / ("train_sft.jsonl" if project.sft else "train_tasks.jsonl")
        translation = translate(
            project,
            model,
            tasks_path=tasks_path,
            output_dir=output_dir,
            own_policy=own_policy,
            max_context_window_set=project.context_window_set,
        )
        path = write_translation(translation, out_dir, project, command, tasks_path.name)
        print(f"{speaker}: {_translation_note(project, path, len(translation.rows), tasks_path)}", flush=True)
        extra = [
            a for a in rest if not (mode == "train" and suffix and a.lstrip("+").startswith("trainer.output_dir="))
        ]
        runs.append([f"+config_paths=[{','.join([str(path), *user_paths])}]", *extra])
    for warning in project.warnings:
        print(f"{speaker}: warning: {warning}", file=sys.stderr)
    return runs
