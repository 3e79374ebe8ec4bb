"""`ng_export <run id | output dir | checkpoint dir | HF folder> +output=DIR`: a merged HF model folder for vllm_model.

What the source names, and what is exported:
  - a background run id (ng_runs list) → its output_dir, as below;
  - a trainer output_dir → `final/` when it is at least as new as the latest checkpoint, else that checkpoint;
  - `output_dir/checkpoints` (has `latest_step`) → the latest checkpoint; `output_dir/checkpoints/step_NNNNNN` →
    that one. A DeepSpeed checkpoint is loaded into a `PolicyEngine` built from the engine config stored in its
    `trainer_state.json` (or, for older checkpoints, from the background run that wrote it) and written with
    `PolicyEngine.save_hf`: LoRA merged, `lm_head.weight` written explicitly, `tie_word_embeddings: false`
    (docs/architecture.md, Models);
  - a HF folder (`config.json` + `*.safetensors`, e.g. `output_dir/final`) → copied; a tied single-file model
    gets its explicit `lm_head.weight` added.
The result is written next to DIR and renamed into place; a non-empty DIR is replaced only with +overwrite=true.
Serve it with `+policy_model.responses_api_models.vllm_model.model=DIR`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.paths import check_name, resolve_inside
from nemo_gym.config import load_config
from nemo_gym.runs.background import list_records, load_record

__all__ = ["ExportOptions", "ExportSource", "resolve_source", "export_model", "export_main"]

LATEST_FILE = "latest_step"
TRAINER_STATE_FILE = "trainer_state.json"


class ExportOptions(BaseModel):
    """Parameters of `ng_export` (the source may be given as the positional argument)."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(
        description=(
            "background run id, trainer output_dir, checkpoint folder (checkpoints/ or checkpoints/step_*) or HF model"
            " folder (e.g. <output_dir>/final)"
        )
    )
    output: str = Field(description="the HF model folder to write (safetensors + config + tokenizer)")
    overwrite: bool = Field(False, description="replace a non-empty output folder")


@dataclasses.dataclass(frozen=True)
class ExportSource:
    """A resolved source: an HF folder, or a DeepSpeed checkpoint `tag` under `checkpoint_dir`."""

    kind: Literal["hf", "deepspeed"]
    path: Path  # the HF folder, or the checkpoint tag folder
    checkpoint_dir: Path | None = None
    tag: str | None = None

    def describe(self) -> str:
        return f"HF folder {self.path}" if self.kind == "hf" else f"DeepSpeed checkpoint {self.path}"


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _is_checkpoint_tag(path: Path) -> bool:
    return (path / TRAINER_STATE_FILE).is_file() or any(path.glob("mp_rank_*_model_states.pt"))


def _latest_checkpoint(checkpoints: Path) -> ExportSource | None:
    latest = checkpoints / LATEST_FILE
    if not latest.is_file():
        return None
    tag = check_name(latest.read_text().strip(), what=f"{latest}: checkpoint tag")  # a file's content: one folder name
    return ExportSource(
        "deepspeed", resolve_inside(checkpoints, tag, what=f"{latest}: checkpoint tag"), checkpoints, tag
    )


def resolve_source(source: str) -> ExportSource:
    """What `source` names (see the module docstring).

    Raises:
        DataError: it names no run, folder, checkpoint or model.
    """
    path = Path(source).expanduser()
    if not path.exists() and "/" not in source:
        try:
            record = load_record(source)
        except ConfigError as exc:
            raise DataError(f"{source!r} is neither a folder nor a background run id ({exc})") from exc
        if not record.output_dir:
            raise DataError(f"background run {record.id} has no output_dir")
        path = Path(record.output_dir)
    path = path.resolve()
    if _is_hf_folder(path):
        return ExportSource("hf", path)
    if (path / LATEST_FILE).is_file():
        return _latest_checkpoint(path)  # type: ignore[return-value]
    if _is_checkpoint_tag(path):
        return ExportSource("deepspeed", path, path.parent, path.name)
    final, checkpoint = path / "final", _latest_checkpoint(path / "checkpoints")
    if _is_hf_folder(final) and (checkpoint is None or final.stat().st_mtime >= checkpoint.path.stat().st_mtime):
        return ExportSource("hf", final)
    if checkpoint is not None:
        return checkpoint
    raise DataError(
        f"{path}: no model found (expected config.json + *.safetensors, checkpoints/{LATEST_FILE}, or a checkpoint"
        " folder)"
    )


# -- DeepSpeed checkpoint → HF ---------------------------------------------------------------------------------
def _engine_config_values(source: ExportSource) -> dict[str, Any]:
    """The engine config the checkpoint was trained with: from its trainer_state.json, else from the background
    run whose output_dir holds it.

    Raises:
        DataError: neither has it.
    """
    state_path = source.path / TRAINER_STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if isinstance(state.get("engine"), dict):
        return state["engine"]

    output_dir = str(source.checkpoint_dir.parent) if source.checkpoint_dir else None
    for record in list_records():
        if record.command == "train" and record.output_dir == output_dir:
            engine = (load_config(record.argv, cwd=Path(record.cwd)).values.get("trainer") or {}).get("engine")
            if isinstance(engine, dict):
                model_path = Path(engine["model_path"]).expanduser()
                if not engine["model_path"].startswith("embedded:") and not model_path.is_absolute():
                    engine = {**engine, "model_path": str(Path(record.cwd) / model_path)}
                return engine
    raise DataError(
        f"{state_path}: no engine config (model_path, lora, ...) recorded, and no background run wrote {output_dir}"
    )


def _export_checkpoint(source: ExportSource, output: Path) -> Path:
    from nemo_gym.train.config import EngineConfig, LossOptions
    from nemo_gym.train.engine import PolicyEngine

    config = EngineConfig.model_validate(_engine_config_values(source))
    engine = PolicyEngine(config, LossOptions(), total_steps=1)
    engine.load_checkpoint(source.checkpoint_dir, source.tag)
    return engine.save_hf(output)


# -- HF folder → HF folder -------------------------------------------------------------------------------------
def _untie_in_place(folder: Path) -> None:
    """Write `lm_head.weight` (a copy of the embeddings) into a single-file model that lacks it; config untied.

    Raises:
        DataError: the weights are sharded, or have neither lm_head nor embeddings.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    files = sorted(folder.glob("*.safetensors"))
    names = set()
    for file in files:
        with safe_open(str(file), "pt") as handle:
            names |= set(handle.keys())
    if "lm_head.weight" not in names:
        if len(files) != 1 or "model.embed_tokens.weight" not in names:
            raise DataError(
                f"{folder}: no lm_head.weight, and it cannot be added (sharded weights or no model.embed_tokens.weight)"
            )
        state = load_file(str(files[0]))
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
        save_file(state, str(files[0]), metadata={"format": "pt"})
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if config.get("tie_word_embeddings", True) is not False:
        config["tie_word_embeddings"] = False
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def _copy_hf_folder(source: Path, output: Path) -> Path:
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("*.tmp", ".*"))
    _untie_in_place(tmp)
    if output.exists():
        shutil.rmtree(output)
    tmp.rename(output)
    return output


# -- command ---------------------------------------------------------------------------------------------------
def _check_output(source: ExportSource, output: Path, overwrite: bool) -> None:
    if output == source.path or source.path.is_relative_to(output) or output.is_relative_to(source.path):
        raise ConfigError(f"+output={output} overlaps the source {source.path}; choose another folder")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"+output={output} exists and is not a folder")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ConfigError(f"+output={output} is not empty; pass +overwrite=true to replace it")


def export_model(source: str, output: str | Path, *, overwrite: bool = False) -> tuple[ExportSource, Path]:
    """Export `source` (see the module docstring) to the HF folder `output`; returns the resolved source and the folder.

    Raises:
        DataError: the source names no model. ConfigError: `output` overlaps it, or is non-empty without `overwrite`.
    """
    resolved = resolve_source(source)
    out = Path(output).expanduser().resolve()
    _check_output(resolved, out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = _copy_hf_folder(resolved.path, out) if resolved.kind == "hf" else _export_checkpoint(resolved, out)
    missing = [name for name in ("config.json", "tokenizer_config.json") if not (written / name).is_file()]
    if missing:
        print(
            f"ng_export: warning: {written} has no {', '.join(missing)}; vLLM needs a tokenizer (copy it from the base"
            " model)"
        )
    return resolved, written


def export_main(options: ExportOptions) -> int:
    """`ng_export`: returns the exit status."""
    resolved, written = export_model(options.source, options.output, overwrite=options.overwrite)
    print(f"ng_export: wrote {written} from the {resolved.describe()}")
    print(f"  serve it: ng_run ... +policy_model.responses_api_models.vllm_model.model={written}")
    return 0
