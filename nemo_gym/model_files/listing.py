"""`ng_models`: the models a user can train or serve here, as a table (rich) or JSON (`+json=true`).

Where they are found:
  embedded      the models shipped in PyPI packages (`embedded:smollm2`): the GGUF inside the package (in this
                environment or a vllm_model engine environment under `$NEMO_GYM_HOME/engines`) and its converted
                float folder `$NEMO_GYM_HOME/models/<name>-<sha>/` (written by the first vllm_model start)
  hf_cache      the local Hugging Face cache (`huggingface_hub.scan_cache_dir`; `$HF_HUB_CACHE`, or `+hf_cache_dir`):
                model repos whose `config.json` names a causal-LM architecture (one of transformers'
                `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, else a name ending in ForCausalLM / LMHeadModel), i.e. text
                generation; the newest snapshot of each
  final         a trainer's `output_dir/final` (ng_train's final model, HF folder)
  export        any other HF model folder (`config.json` + `*.safetensors`, causal LM), e.g. an `ng_export` output
  checkpoint    a trainer's `output_dir/checkpoints` (DeepSpeed; `latest_step` names the newest): resumable with
                `+trainer.resume=true`; served after `ng_export <path> +output=DIR`
  server        the models of the run server you are logged in to (`ng_login +server=URL`; nemo_gym.team.client)
Folders scanned for trained models: `results/` (of the current folder), `+dirs=[...]`, and the output_dir of every
background run (`ng_runs list`). The intermediate weight folders a trainer syncs to vLLM (`output_dir/weights/step_*`)
are left out. The `model` column is what `+model=` (ng_try), `vllm_model.model` and `trainer.engine.model_path` take.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.filesize import decimal

from nemo_gym.common.errors import NemoGymError
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.model_servers.embedded import EMBEDDED_MODELS, EMBEDDED_PREFIX, EmbeddedModel
from nemo_gym.runs.background import list_records
from nemo_gym.team import remote_runs

__all__ = [
    "ModelsOptions",
    "ModelEntry",
    "embedded_models",
    "hf_cache_models",
    "trained_models",
    "server_models",
    "list_models",
    "offline_models",
    "models_main",
]

LATEST_FILE, TRAINER_STATE_FILE, DONE_MARKER = "latest_step", "trainer_state.json", ".nemo_gym_complete"
MAX_SCAN_DEPTH = 6  # folders below a scanned root: results/<group>/<run>/<output_dir>/final is 4 deep
_CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ModelWithLMHead")  # without transformers' table


class ModelsOptions(BaseModel):
    """Parameters of `ng_models`."""

    model_config = ConfigDict(extra="forbid")
    json_output: bool = Field(False, alias="json", description="print a JSON list instead of a table")
    dirs: list[str] = Field(
        default_factory=list,
        description=(
            "more folders to scan for trained models and exports (besides results/ and background runs' output_dirs)"
        ),
    )
    results_dir: str = Field("results", description="the results folder to scan (relative to the current folder)")
    hf_cache_dir: str | None = Field(
        None, description="Hugging Face hub cache to scan (default: $HF_HUB_CACHE, else ~/.cache/huggingface/hub)"
    )


@dataclasses.dataclass
class ModelEntry:
    """One model. `model` is the value that serves or trains it (None: not directly, see `note`)."""

    kind: str  # embedded | hf_cache | final | export | checkpoint | server
    name: str
    model: str | None
    path: str | None
    size_bytes: int | None
    architecture: str | None = None
    modified: str | None = None  # ISO 8601, local time
    run_id: str | None = None  # the background run that wrote it
    note: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


# -- helpers ---------------------------------------------------------------------------------------------------
def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (symlinks not followed; a file is its own size)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            file = Path(root) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def _modified(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime).astimezone().isoformat(timespec="seconds")


def causal_lm_table() -> dict[str, tuple[str, ...]] | None:
    """transformers' causal-LM classes by model type (`{"llama": ("LlamaForCausalLM",), "gemma3":
    ("Gemma3ForConditionalGeneration",), ...}`): its `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, read from
    `transformers/models/auto/modeling_auto.py` as a literal (importing that module imports torch: seconds, where
    reading it takes milliseconds). None when transformers is not installed or the table is not found; callers then
    go by the class-name suffixes."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" for t in node.targets
        ):
            value = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args else node.value
            try:
                pairs = dict(ast.literal_eval(value))
            except (ValueError, TypeError, SyntaxError):
                return None
            return {str(k): (v,) if isinstance(v, str) else tuple(v) for k, v in pairs.items()}
    return None


def text_generation_architecture(config_path: Path, table: dict[str, tuple[str, ...]] | None) -> str | None:
    """The causal-LM class a `config.json` names in `architectures`, or, when it names none (a folder converted
    from GGUF), the class of its `model_type`; None when it is not a text-generation model or is unreadable."""
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    known = {name for names in table.values() for name in names} if table is not None else None
    architectures = config.get("architectures")
    for name in architectures if isinstance(architectures, list) else []:
        if isinstance(name, str) and (name in known if known is not None else name.endswith(_CAUSAL_LM_SUFFIXES)):
            return name
    if not architectures and table is not None and config.get("model_type") in table:
        return table[config["model_type"]][0]
    return None


def is_hf_folder(path: Path) -> bool:
    """`config.json` and at least one `*.safetensors` file (what vllm_model and the trainer load)."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


# -- embedded --------------------------------------------------------------------------------------------------
def _gguf_files(model: EmbeddedModel) -> list[Path]:
    """The model's GGUF in this environment and in the vllm_model engine environments."""
    found = []
    spec = importlib.util.find_spec(model.module)  # find_spec, not import: the package's __init__ imports `llm`
    if spec is not None and spec.submodule_search_locations:
        found.append(Path(list(spec.submodule_search_locations)[0]) / model.gguf_file)
    found += sorted((nemo_gym_home() / "engines").glob(f"*/lib/python*/site-packages/{model.module}/{model.gguf_file}"))
    return [p for p in found if p.is_file()]


def embedded_models(table: dict[str, tuple[str, ...]] | None) -> list[ModelEntry]:
    """Every embedded model, installed or not (then `note` says how it gets installed)."""
    entries = []
    for model in EMBEDDED_MODELS.values():
        ggufs = _gguf_files(model)
        converted = [p.parent for p in sorted((nemo_gym_home() / "models").glob(f"{model.name}-*/{DONE_MARKER}"))]
        details: dict[str, Any] = {"package": model.package, "served_name": model.served_name}
        if ggufs:
            details.update(gguf=str(ggufs[0]), gguf_bytes=ggufs[0].stat().st_size)
        if converted:
            details.update(converted=str(converted[-1]), converted_bytes=folder_bytes(converted[-1]))
        path = converted[-1] if converted else ggufs[0] if ggufs else None
        architecture = text_generation_architecture(converted[-1] / "config.json", table) if converted else None
        if converted:
            gguf = f"{decimal(details['gguf_bytes'])} " if ggufs else ""
            note = f"float folder converted from the {gguf}GGUF in PyPI package {model.package}"
        elif ggufs:
            note = f"GGUF from PyPI package {model.package}; converted to a float folder on the first vllm_model start"
        else:
            note = f"installed with {model.package} by the first vllm_model start"
        entries.append(
            ModelEntry(
                "embedded",
                model.served_name,
                EMBEDDED_PREFIX + model.name,
                str(path) if path else None,
                folder_bytes(path) if path else None,
                architecture,
                _modified(path) if path else None,
                note=note,
                details=details,
            )
        )
    return entries


# -- Hugging Face cache ----------------------------------------------------------------------------------------
def hf_cache_models(
    cache_dir: str | None, table: dict[str, tuple[str, ...]] | None
) -> tuple[list[ModelEntry], list[str]]:
    """Text-generation models in the HF cache (newest snapshot each) and warnings (cache unreadable, no client)."""
    try:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except ImportError:
        return [], [
            "the Hugging Face cache was not scanned: huggingface_hub is not installed (pip install -e '.[datasets]')"
        ]
    try:
        info = scan_cache_dir(
            cache_dir or os.environ.get("HF_HUB_CACHE")
        )  # the variable as it is now (huggingface_hub reads it at import)
    except CacheNotFound:
        return [], []
    warnings = [f"Hugging Face cache: {warning}" for warning in info.warnings]
    entries = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: r.last_modified)
        architecture = text_generation_architecture(revision.snapshot_path / "config.json", table)
        if architecture is None:
            continue
        refs = ", ".join(sorted(revision.refs)) or revision.commit_hash[:12]
        entries.append(
            ModelEntry(
                "hf_cache",
                repo.repo_id,
                str(revision.snapshot_path),
                str(revision.snapshot_path),
                repo.size_on_disk,
                architecture,
                datetime.fromtimestamp(revision.last_modified).astimezone().isoformat(timespec="seconds"),
                note=f"revision {refs}",
                details={"repo_path": str(repo.repo_path), "commit": revision.commit_hash},
            )
        )
    return entries, warnings


# -- trained models and exports --------------------------------------------------------------------------------
def _walk(root: Path, depth: int = 0) -> Iterator[Path]:
    """`root` and its sub-folders (not hidden, not through symlinks), down to MAX_SCAN_DEPTH; a model folder or a
    checkpoints folder is yielded but not entered."""
    yield root
    if depth >= MAX_SCAN_DEPTH or is_hf_folder(root) or (root / LATEST_FILE).is_file():
        return
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
    except OSError:
        return
    for child in children:
        yield from _walk(child, depth + 1)


def _checkpoint_entry(folder: Path) -> ModelEntry | None:
    tag = (folder / LATEST_FILE).read_text().strip()
    tag_dir = folder / tag
    if not tag_dir.is_dir():
        return None
    state_path = tag_dir / TRAINER_STATE_FILE
    try:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    except ValueError:
        state = {}
    engine = state.get("engine") if isinstance(state.get("engine"), dict) else {}
    steps = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_"))
    base = engine.get("model_path")
    lora = engine.get("lora") if isinstance(engine.get("lora"), dict) else {}
    note = (
        f"DeepSpeed, {len(steps)} checkpoint(s), newest {tag}"
        + (f", base {base}" if base else "")
        + (f", LoRA rank {lora['rank']}" if lora.get("rank") else "")
    )
    note += "; resume with +trainer.resume=true, serve after ng_export <path> +output=DIR"
    return ModelEntry(
        "checkpoint",
        f"{folder.parent.name}/{folder.name}/{tag}",
        None,
        str(tag_dir),
        folder_bytes(tag_dir),
        None,
        _modified(tag_dir),
        note=note,
        details={"step": state.get("step"), "base_model": base, "checkpoints": steps},
    )


def _trained_entry(folder: Path, table: dict[str, tuple[str, ...]] | None) -> ModelEntry | None:
    if (folder / LATEST_FILE).is_file():
        return _checkpoint_entry(folder)
    if not is_hf_folder(folder) or (
        folder.parent.name == "weights" and (folder.parent.parent / "metrics.jsonl").is_file()
    ):
        return None  # not a model, or a trainer's intermediate weight-sync copy
    architecture = text_generation_architecture(folder / "config.json", table)
    if architecture is None:
        return None
    kind = "final" if folder.name == "final" else "export"
    name = f"{folder.parent.name}/{folder.name}" if kind == "final" else folder.name
    note = "ng_train's final model" if kind == "final" else "HF model folder"
    return ModelEntry(
        kind, name, str(folder), str(folder), folder_bytes(folder), architecture, _modified(folder), note=note
    )


def trained_models(roots: list[tuple[Path, str | None]], table: dict[str, tuple[str, ...]] | None) -> list[ModelEntry]:
    """Final models, exports and checkpoints under `roots` (`(folder, background run id or None)`), once each."""
    entries: dict[str, ModelEntry] = {}
    for root, run_id in roots:
        if not root.is_dir():
            continue
        for folder in _walk(root.resolve()):
            if str(folder) in entries:
                entries[str(folder)].run_id = entries[str(folder)].run_id or run_id
                continue
            entry = _trained_entry(folder, table)
            if entry is not None:
                entry.run_id = run_id
                entries[str(folder)] = entry
    return sorted(entries.values(), key=lambda e: (e.modified or "", e.name), reverse=True)


def _background_output_dirs() -> list[tuple[Path, str]]:
    return [(Path(r.output_dir), r.id) for r in list_records() if r.output_dir]


# -- run server --------------------------------------------------------------------------------------------------
def server_models() -> tuple[list[ModelEntry], list[str]]:
    """The models of the run server this user is logged in to (`ng_login +server=URL`, active organization), from
    `nemo_gym.team.remote_runs.list_server_models()`: each a run's final model, fetched with `ng_runs download <run>`
    before it can be served here. Nothing when not logged in; a server that cannot be reached is a warning, not an
    error (the local models are still listed)."""
    try:
        listed = remote_runs.list_server_models()
    except NemoGymError as exc:  # TeamServerError: unreachable, or the token was refused; never carries the token
        return [], [f"run server: its models could not be listed ({exc})"]
    entries = []
    for item in listed:
        modified = item.get("modified")
        when = (
            datetime.fromtimestamp(modified).astimezone().isoformat(timespec="seconds")
            if isinstance(modified, (int, float))
            else modified
        )
        details = {k: item[k] for k in ("server", "org") if k in item}
        entries.append(
            ModelEntry(
                "server",
                str(item.get("name")),
                None,
                None,
                item.get("size_bytes"),
                None,
                when,
                item.get("run_id"),
                note=str(item.get("note") or ""),
                details=details,
            )
        )
    return entries, []


# -- command -----------------------------------------------------------------------------------------------------
def list_models(options: ModelsOptions) -> tuple[list[ModelEntry], list[str]]:
    """Every model (see the module docstring) and the warnings met while looking."""
    table = causal_lm_table()
    cached, warnings = hf_cache_models(options.hf_cache_dir, table)
    roots: list[tuple[Path, str | None]] = [
        (Path(options.results_dir), None),
        *((Path(d).expanduser(), None) for d in options.dirs),
    ]
    for path in options.dirs:
        if not Path(path).expanduser().is_dir():
            warnings.append(f"+dirs: {path} is not a folder")
    trained = trained_models([*_background_output_dirs(), *roots], table)
    remote, remote_warnings = server_models()
    return [*embedded_models(table), *cached, *trained, *remote], warnings + remote_warnings


def offline_models(results_dir: str = "results") -> list[ModelEntry]:
    """The models of this machine that `+model=` takes as they are, for error messages: the embedded ones, the
    Hugging Face cache's and the final models and exports under `results_dir` (no run server, no checkpoints)."""
    table = causal_lm_table()
    cached, _ = hf_cache_models(None, table)
    trained = [e for e in trained_models([(Path(results_dir), None)], table) if e.model is not None]
    return [*embedded_models(table), *cached, *trained]


TABLE_MIN_COLUMNS = 160  # narrower terminals get one block per model: seven columns fold every cell there


def _table(entries: list[ModelEntry]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        box=box.SIMPLE_HEAVY,
        title="Models: +model= (ng_try), vllm_model's model and trainer.engine.model_path take the 'model' column",
        title_justify="left",
    )
    for column in ("kind", "name", "model", "size", "modified", "path", "note"):
        table.add_column(column, overflow="fold", justify="right" if column == "size" else "left")
    for e in entries:
        note = e.note + (f" (run {e.run_id})" if e.run_id else "")
        path = "" if e.path == e.model else e.path or "-"  # a folder's path is its model value
        table.add_row(
            e.kind,
            e.name,
            e.model or "-",
            decimal(e.size_bytes) if e.size_bytes is not None else "-",
            (e.modified or "-")[:10],
            path,
            note,
        )
    return table


def _blocks(entries: list[ModelEntry]) -> Any:
    """One block per model, for terminals narrower than TABLE_MIN_COLUMNS: a title line (name, kind, size, date), then
    `model`, `path` and `note` lines whose values fold at the width but are never squeezed into a column."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [
        Text(
            "Models: +model= (ng_try), vllm_model's model and trainer.engine.model_path take the 'model' value",
            style="bold",
        ),
        Text(""),
    ]
    for e in entries:
        facts = ", ".join(
            x
            for x in (
                e.kind,
                decimal(e.size_bytes) if e.size_bytes is not None else None,
                (e.modified or "")[:10] or None,
            )
            if x
        )
        title = Text(e.name, style="bold")
        title.append(f"  ({facts})", style="dim")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column(overflow="fold")
        grid.add_row("  model", e.model or "- (see note)")
        if e.path and e.path != e.model:
            grid.add_row("  path", e.path)
        note = e.note + (f" (run {e.run_id})" if e.run_id else "")
        if note:
            grid.add_row("  note", note)
        parts += [title, grid, Text("")]
    return Group(*parts)


def models_main(options: ModelsOptions) -> int:
    """`ng_models`: print the list (a table on terminals of TABLE_MIN_COLUMNS or more, else one block per model);
    returns 0. Warnings go to stderr."""
    entries, warnings = list_models(options)
    if options.json_output:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2))
    else:
        from rich.console import Console

        console = Console(emoji=False, markup=False, highlight=False)
        console.print(_table(entries) if console.width >= TABLE_MIN_COLUMNS else _blocks(entries))
    for warning in warnings:
        print(f"ng_models: warning: {warning}", file=sys.stderr)
    return 0
