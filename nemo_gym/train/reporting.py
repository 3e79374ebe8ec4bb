"""Per-step metrics of `ng_train` to metrics.jsonl, the console (rich), TensorBoard and Weights & Biases.

`MetricsReporter` takes the flat metrics dict the loop builds for a step (keys as in `metrics.jsonl`, e.g.
`reward_mean`, `loss`, `time_generation_s`, `eval_pass_at_1`) and fans it out to its sinks:

- JSONL, always: `output_dir/metrics.jsonl`, one line per call, `{"time": unix seconds, "step": k, **metrics}`;
- console (`logging.console`): a rich progress bar over the steps and one compact line per step (and per
  evaluation) printed above it;
- TensorBoard (`logging.tensorboard`): scalars in `output_dir/tensorboard`, written with
  `torch.utils.tensorboard.SummaryWriter`;
- W&B (`logging.wandb.enabled`): a `wandb` run; offline (no key, no network) unless a key or a stored login exists.

TensorBoard tags and W&B keys are `<section>/<jsonl key>` (`metric_tag`), so a curve is found by its JSONL name.
Non-numeric values go to the JSONL only. The reporter adds two derived metrics to every sink:
`clip_fraction = clip_fraction_low + clip_fraction_high` (disjoint events, both means over the same generated
tokens) and `time_step_s = time_generation_s + time_training_s + time_sync_s` (the parts present).

Secrets: the W&B API key is read by `wandb` itself from WANDB_API_KEY or a stored login; this module only checks
that one exists (`has_wandb_credentials`) and never reads it into a variable that is printed or logged.
"""

from __future__ import annotations

import json
import netrc
import os
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, Self
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from nemo_gym.train.config import LoggingOptions, WandbOptions

__all__ = [
    "MetricsReporter",
    "has_wandb_credentials",
    "metric_tag",
    "persistent_wandb_run_id",
    "resolve_wandb_mode",
    "with_derived",
]

JSONL_NAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_RUN_ID_FILE = "wandb_run_id"
EVAL_PREFIX = "eval_"
_NOT_SCALARS = frozenset({"step", "time"})

# (key prefix, section) in order; the first match names a metric's TensorBoard / W&B section, default "train".
_SECTIONS: tuple[tuple[str, str], ...] = (
    (EVAL_PREFIX, "eval"),
    ("reward_", "reward"),
    ("pass_rate", "reward"),
    ("advantage_", "advantage"),
    ("time_", "time"),
    ("tokens_per_s", "time"),
    ("groups_", "data"),
    ("sampling_rounds", "data"),
    ("rollouts", "data"),
    ("data_position", "data"),
)

# (label, template over the metrics) of the console line of a training step; a field whose keys are absent is left out.
_STEP_FIELDS: tuple[tuple[str, str], ...] = (
    ("reward", "{reward_mean:.3f}±{reward_std:.3f}"),
    ("pass", "{pass_rate:.3f}"),
    ("adv", "{advantage_mean:+.2f}±{advantage_std:.2f}"),
    ("loss", "{loss:.4g}"),
    ("clip", "{clip_fraction:.3f}"),
    ("kl", "{kl:.3g}"),
    ("is", "{tis_weight_mean:.3f}"),
    ("|Δlogp|max", "{rollout_logprob_abs_diff_max:.2g}"),
    ("entropy", "{entropy:.3f}"),
    ("gnorm", "{grad_norm:.3g}"),
    ("lr", "{learning_rate:.2e}"),
    ("tok/s", "{tokens_per_s:.0f}"),
    ("gen", "{time_generation_s:.1f}s"),
    ("train", "{time_training_s:.1f}s"),
    ("sync", "{time_sync_s:.1f}s"),
)
_EVAL_FIELDS: tuple[tuple[str, str], ...] = (
    ("reward", "{eval_reward_mean:.3f}"),
    ("pass@1", "{eval_pass_at_1:.3f}"),
    ("rollouts", "{eval_rollouts}"),
)


# -- metric names and values -----------------------------------------------------------------------------------
def metric_tag(key: str) -> str:
    """TensorBoard tag / W&B key of a metrics.jsonl key: `<section>/<key>`, e.g. `reward/reward_mean`, `train/loss`."""
    section = next((name for prefix, name in _SECTIONS if key.startswith(prefix)), "train")
    return f"{section}/{key}"


def with_derived(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """`metrics` plus `clip_fraction` and `time_step_s` (seconds) when their parts are present (see module
    docstring)."""
    out = dict(metrics)
    if "clip_fraction_low" in out and "clip_fraction_high" in out:
        out["clip_fraction"] = float(out["clip_fraction_low"]) + float(out["clip_fraction_high"])
    parts = [
        out[k] for k in ("time_generation_s", "time_training_s", "time_sync_s") if isinstance(out.get(k), int | float)
    ]
    if parts and "time_step_s" not in out:
        out["time_step_s"] = float(sum(parts))
    return out


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics (bool as 0/1) except `step` and `time`."""
    return {k: float(v) for k, v in metrics.items() if k not in _NOT_SCALARS and isinstance(v, int | float)}


def _is_training_step(metrics: Mapping[str, Any]) -> bool:
    return any(k not in _NOT_SCALARS and not k.startswith(EVAL_PREFIX) for k in metrics)


def _has_eval(metrics: Mapping[str, Any]) -> bool:
    return any(k.startswith(EVAL_PREFIX) for k in metrics)


def _format_fields(fields: tuple[tuple[str, str], ...], metrics: Mapping[str, Any], line: Text) -> Text:
    for label, template in fields:
        try:
            value = template.format_map(metrics)
        except (KeyError, ValueError, TypeError):  # absent key, or a value the format does not fit
            continue
        line.append(f"  {label} ", style="dim").append(value)
    return line


# -- W&B mode and credentials ----------------------------------------------------------------------------------
def has_wandb_credentials(environ: Mapping[str, str] | None = None) -> bool:
    """Whether wandb would find credentials: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or a `wandb login` entry
    in the netrc file (NETRC, else ~/.netrc or ~/_netrc) for the host of WANDB_BASE_URL (default api.wandb.ai).
    The key itself is only tested for presence."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    candidates = (
        [Path(environ["NETRC"]).expanduser()]
        if environ.get("NETRC")
        else [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    )
    for path in candidates:
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            return False
        return bool(entry and entry[2])
    return False


def resolve_wandb_mode(mode: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The W&B mode to run in: `mode` when set, else WANDB_MODE (dryrun = offline), else `online` when
    `has_wandb_credentials()`, else `offline`. Returns one of online, offline, disabled."""
    if mode:
        return mode
    environ = os.environ if environ is None else environ
    from_env = environ.get("WANDB_MODE", "").strip().lower()
    if from_env in ("online", "offline", "disabled"):
        return from_env
    if from_env == "dryrun":
        return "offline"
    return "online" if has_wandb_credentials(environ) else "offline"


def persistent_wandb_run_id(output_dir: Path) -> str:
    """The W&B run id kept in `output_dir/wandb_run_id` (created on first use: 8 hex digits), so that a resumed
    training logs into the same online run."""
    path = output_dir / WANDB_RUN_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:8]
    path.write_text(run_id)
    return run_id


# -- sinks -----------------------------------------------------------------------------------------------------
class _Sink(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class ConsoleSink:
    """A rich progress bar over `total_steps` and a line per training step / evaluation printed above it."""

    def __init__(self, total_steps: int, console: Console | None = None):
        self.console = console or Console()
        self.total_steps = total_steps
        self.progress = Progress(
            TextColumn("[bold]ng_train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=self.console,
        )
        self.task = self.progress.add_task("steps", total=total_steps, status="")
        self.progress.start()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if _is_training_step(metrics):
            line = Text(f"step {step}/{self.total_steps}", style="bold")
            _format_fields(_STEP_FIELDS, metrics, line)
            if "groups_total" in metrics:
                kept = (
                    metrics["groups_total"]
                    - metrics.get("groups_zero_variance", 0)
                    - metrics.get("groups_incomplete", 0)
                )
                line.append("  groups ", style="dim").append(f"{kept}/{metrics['groups_total']}")
                if metrics.get("sampling_rounds", 1) > 1:  # dynamic sampling refilled the step
                    line.append(f" in {metrics['sampling_rounds']} rounds", style="dim")
            if metrics.get("trained") is False:
                line.append("  no update (no group left)", style="bold yellow")
            self.console.print(line, soft_wrap=True)
            status = f"reward {metrics['reward_mean']:.3f}" if isinstance(metrics.get("reward_mean"), float) else ""
            self.progress.update(self.task, completed=step, status=status)
        if _has_eval(metrics):
            self.console.print(
                _format_fields(_EVAL_FIELDS, metrics, Text(f"eval @ step {step}", style="bold cyan")), soft_wrap=True
            )

    def close(self) -> None:
        self.progress.stop()


class TensorBoardSink:
    """Scalars under `log_dir`; the writer opens at the first step with `purge_step` = that step, so after a
    resume TensorBoard drops the events a crashed run wrote past its last checkpoint."""

    def __init__(self, log_dir: Path, run_config: Mapping[str, Any] | None = None):
        try:  # at construction, so a missing package fails the setup, not the first step
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "trainer.logging.tensorboard needs `tensorboard`: pip install 'nemo-gym[train]' (or"
                " +trainer.logging.tensorboard=false)"
            ) from exc
        self.summary_writer = SummaryWriter
        self.log_dir = log_dir
        self.run_config = run_config
        self.writer: Any = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self.writer is None:
            self.writer = self.summary_writer(str(self.log_dir), purge_step=step)
            if self.run_config is not None:
                self.writer.add_text(
                    "config", "```\n" + json.dumps(self.run_config, indent=2, default=str) + "\n```", step
                )
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(metric_tag(key), value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbSink:
    """A W&B run (see `WandbOptions`). Online runs keep their id in `output_dir/wandb_run_id`, so a resumed
    training continues the same W&B run; offline runs get a fresh id (`wandb sync` uploads each on its own)."""

    def __init__(self, options: WandbOptions, output_dir: Path, run_config: Mapping[str, Any] | None = None):
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("trainer.logging.wandb needs `wandb`: pip install 'nemo-gym[train]'") from exc

        mode = resolve_wandb_mode(options.mode)
        if options.mode is None and mode == "offline" and not os.environ.get("WANDB_MODE"):
            print(
                "ng_train: W&B runs offline (no WANDB_API_KEY and no `wandb login`); upload later with `wandb sync`",
                file=sys.stderr,
                flush=True,
            )
        run_dir = Path(os.environ.get("WANDB_DIR") or output_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        run_id, resume = (persistent_wandb_run_id(output_dir), "allow") if mode == "online" else (None, None)
        self.run = wandb.init(
            project=options.project,
            entity=options.entity,
            name=options.name or output_dir.resolve().name,
            mode=mode,
            dir=str(run_dir),
            config=dict(run_config or {}),
            id=run_id,
            resume=resume,
            settings=wandb.Settings(console="off"),  # rich owns stdout; no output.log capture
        )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log({metric_tag(k): v for k, v in _scalars(metrics).items()}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # stop wandb's service process (wandb-core): nothing of the run outlives the trainer


# -- the reporter ----------------------------------------------------------------------------------------------
class MetricsReporter:
    """Fans each step's metrics out to metrics.jsonl and the sinks `options` turns on (see module docstring).

    Args:
        options: the `trainer.logging` section.
        output_dir: the trainer's output folder (metrics.jsonl, tensorboard/, the W&B run unless WANDB_DIR is set).
        total_steps: steps of the run (length of the progress bar).
        run_config: the trainer's config, stored with the TensorBoard and W&B runs (must hold no secret).
        console: where the console sink prints (default: a rich Console on stdout).

    Raises:
        ImportError: TensorBoard or W&B is on but `tensorboard` / `wandb` is not installed (`pip install
        nemo-gym[train]`).
    """

    def __init__(
        self,
        options: LoggingOptions,
        output_dir: str | Path,
        *,
        total_steps: int,
        run_config: Mapping[str, Any] | None = None,
        console: Console | None = None,
    ):
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (self.output_dir / JSONL_NAME).open("a")
        self._sinks: list[_Sink] = []
        try:
            if options.console:
                self._sinks.append(ConsoleSink(total_steps, console))
            if options.tensorboard:
                self._sinks.append(TensorBoardSink(self.output_dir / TENSORBOARD_DIR, run_config))
            if options.wandb.enabled:
                self._sinks.append(WandbSink(options.wandb, self.output_dir, run_config))
        except BaseException:
            self.close()
            raise

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Report the metrics of step `step` (1-based; 0 for an evaluation before training). Keys prefixed
        `eval_` are evaluation metrics (the `eval` section); a dict may hold training and evaluation metrics."""
        record = {"time": time.time(), "step": step, **with_derived(metrics)}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        for sink in self._sinks:
            sink.log(step, record)

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Report evaluation metrics at step `step`; keys are prefixed `eval_` when they are not already."""
        self.log(step, {k if k.startswith(EVAL_PREFIX) else EVAL_PREFIX + k: v for k, v in metrics.items()})

    def close(self) -> None:
        """Flush and close every sink (idempotent); the W&B run is finished."""
        sinks, self._sinks = self._sinks, []
        errors: list[BaseException] = []
        for sink in reversed(sinks):  # each sink is closed even when another one fails
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others are closed
                errors.append(exc)
        if not self._jsonl.closed:
            self._jsonl.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
