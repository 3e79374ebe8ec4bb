"""A training run's `trainer.output_dir` when an earlier run used it: go on with that run, or stop and say what to do.

A folder is used when it holds a run's metrics (`metrics.jsonl` with a line), a checkpoint (`checkpoints/latest_step`)
or a final model (`final/`). A new ng_train there (`@config.toml`, YAML or `+rnow_project`) would append its steps to
the metrics (steps 1, 2, 3, 1, 2, 3), add a second TensorBoard file and overwrite the checkpoints and `final/`. So:
  - the folder holds a checkpoint of the same config (`trainer_config.json`, written at the start of every run, equal
    but for the keys that only say how long and how to run: RUN_CONTROL_KEYS): the run resumes from it, said on the
    console; when that checkpoint is at `num_steps` already, there is nothing to train and ng_train says so;
  - otherwise: a ConfigError naming `+trainer.output_dir=<new folder>`, `+overwrite=true` (deletes the earlier
    outputs, TRAINER_OUTPUTS, and starts over) and, when there is a checkpoint, `+trainer.resume=true`.
`+trainer.resume=true` resumes as asked, whatever the saved config. The translated configs that `@config.toml` and
`+rnow_project` write into the folder (`prime_toml/`, `rnow_project/`) are inputs, never touched.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import mask_secrets
from nemo_gym.train.config import TrainerConfig

__all__ = [
    "OVERWRITE_KEY",
    "RUN_CONFIG_FILE",
    "TRAINER_OUTPUTS",
    "RUN_CONTROL_KEYS",
    "OutputDir",
    "inspect_output_dir",
    "prepare_output_dir",
    "write_run_config",
]

RUN_CONFIG_FILE = "trainer_config.json"
OVERWRITE_KEY = "overwrite"  # `ng_train ... +overwrite=true`
TRAINER_OUTPUTS = (
    "metrics.jsonl",
    "tensorboard",
    "checkpoints",
    "final",
    "weights",
    "rollouts",
    "wandb",
    "ng_run.log",
    RUN_CONFIG_FILE,
)
# trainer keys that say how long and how to run, not what is trained: a run goes on with other values of them
RUN_CONTROL_KEYS = frozenset(
    {
        "num_steps",
        "max_train_time_s",
        "resume",
        "output_dir",
        "head_server_url",
        "logging",
        "eval",
        "checkpoint_interval",
        "num_samples_in_parallel",
        "request_timeout_s",
        "num_ranks",
        "weight_sync",
        "weight_sync_host",
    }
)


@dataclass
class OutputDir:
    """What an output folder holds from earlier runs."""

    path: Path
    metric_lines: int  # lines of metrics.jsonl
    checkpoint_step: int | None  # step of checkpoints/latest_step
    final: bool  # final/ exists
    saved_config: dict[str, Any] | None  # trainer_config.json

    @property
    def used(self) -> bool:
        return bool(self.metric_lines) or self.checkpoint_step is not None or self.final

    def describe(self) -> str:
        parts = [f"metrics of {self.metric_lines} step(s)"] if self.metric_lines else []
        parts += [f"a checkpoint at step {self.checkpoint_step}"] if self.checkpoint_step is not None else []
        return ", ".join(parts + (["a final model"] if self.final else []))


def inspect_output_dir(path: str | Path) -> OutputDir:
    """What `path` holds from earlier runs (nothing when it does not exist)."""
    path = Path(path)
    metrics = path / "metrics.jsonl"
    lines = sum(1 for line in metrics.read_text().splitlines() if line.strip()) if metrics.is_file() else 0
    step = None
    latest = path / "checkpoints" / "latest_step"
    if latest.is_file():
        try:
            step = int(
                json.loads((path / "checkpoints" / latest.read_text().strip() / "trainer_state.json").read_text())[
                    "step"
                ]
            )
        except (OSError, ValueError, KeyError, TypeError):
            step = None
    try:
        saved = json.loads((path / RUN_CONFIG_FILE).read_text())
    except (OSError, ValueError):
        saved = None
    return OutputDir(path, lines, step, (path / "final").is_dir(), saved if isinstance(saved, dict) else None)


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key not in RUN_CONTROL_KEYS}


def run_config(cfg: TrainerConfig) -> dict[str, Any]:
    """The trainer section as `trainer_config.json` keeps it (JSON, secrets masked)."""
    return mask_secrets(cfg.model_dump(mode="json"))


def _differences(saved: dict[str, Any], now: dict[str, Any], prefix: str = "trainer.") -> list[str]:
    found = []
    for key in sorted(set(saved) | set(now)):
        before, after = saved.get(key), now.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            found += _differences(before, after, f"{prefix}{key}.")
        elif before != after:
            found.append(f"{prefix}{key} was {before!r}, is {after!r}")
    return found


def _delete_earlier_outputs(out: Path, found: OutputDir) -> None:
    """`+overwrite=true`: delete the earlier run's outputs in `out` (the TRAINER_OUTPUTS; anything else stays) and
    say so; `found`: what `inspect_output_dir` found there."""
    for name in TRAINER_OUTPUTS:
        target = out / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    print(
        f"ng_train: +overwrite=true: deleted the outputs of the earlier run in {out} ({found.describe()})",
        flush=True,
    )


def prepare_output_dir(
    cfg: TrainerConfig, *, overwrite: bool, is_main: bool = True, dry_run: bool = False
) -> tuple[TrainerConfig, Literal["new", "resume", "finished"]]:
    """The config to run (with `resume` set when the folder holds a checkpoint of the same config) and what happens:
    `new` (an unused folder, or `overwrite`: rank 0 deletes the earlier outputs unless `dry_run`), `resume`, or
    `finished` (that checkpoint is at `num_steps`: nothing to train). Prints the decision on rank 0 (`is_main`).

    Raises:
        ConfigError: the folder holds outputs of another config, or of this config without a checkpoint; the message
            names `+trainer.output_dir`, `+overwrite=true` and, with a checkpoint, `+trainer.resume=true`.
    """
    out = Path(cfg.output_dir)
    if cfg.resume:
        return cfg, "resume"
    found = inspect_output_dir(out)
    if overwrite:
        if is_main and found.used and not dry_run:
            _delete_earlier_outputs(out, found)
        return cfg, "new"
    if not found.used:
        return cfg, "new"
    same = found.saved_config is not None and _comparable(found.saved_config) == _comparable(run_config(cfg))
    elsewhere = (
        "write elsewhere with +trainer.output_dir=<new folder>, or start over in it with +overwrite=true (deletes them)"
    )
    if not same:
        why = (
            "; ".join(_differences(_comparable(found.saved_config), _comparable(run_config(cfg)))[:5])
            if found.saved_config
            else "no trainer_config.json says which config made them"
        )
        go_on = ", or continue that run with +trainer.resume=true" if found.checkpoint_step is not None else ""
        raise ConfigError(
            f"trainer.output_dir: {out} holds the outputs of another training run ({found.describe()}; {why}): this run"
            f" would mix its metrics and overwrite its checkpoints and final model; {elsewhere}{go_on}"
        )
    if found.checkpoint_step is None:
        raise ConfigError(
            f"trainer.output_dir: {out} holds {found.describe()} of a run of this config but no checkpoint to resume"
            f" from (trainer.checkpoint_interval: 0 saves one only at the end); {elsewhere}"
        )
    if found.checkpoint_step >= cfg.num_steps:
        if is_main:
            final = f"; final model in {out / 'final'}" if found.final else ""
            print(
                f"ng_train: {out} holds this config's finished run (checkpoint at step {found.checkpoint_step},"
                f" num_steps {cfg.num_steps}{final}): nothing to train. Train on with +trainer.num_steps=<more>, or"
                f" {elsewhere}",
                flush=True,
            )
        return cfg, "finished"
    if is_main:
        print(
            f"ng_train: {out} holds a checkpoint of this config at step {found.checkpoint_step}: resuming from it to"
            f" step {cfg.num_steps} (to start over: +overwrite=true; to keep it: +trainer.output_dir=<new folder>)",
            flush=True,
        )
    return cfg.model_copy(update={"resume": True}), "resume"


def write_run_config(cfg: TrainerConfig) -> None:
    """`output_dir/trainer_config.json`: the config a run starts with, compared by the next run into the folder."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_CONFIG_FILE).write_text(json.dumps(run_config(cfg), indent=2, sort_keys=True) + "\n")
