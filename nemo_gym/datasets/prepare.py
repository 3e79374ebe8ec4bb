"""`ng_prepare_data`: collect the datasets a config declares, validate every row, write them with metrics.

Datasets are the `datasets:` entries of the config's server instances (usually agents):
`{name, type: train|validation|benchmark|example, jsonl_fpath, num_repeats, license, huggingface_identifier}`.

- `+mode=train_preparation` takes the train, validation and benchmark datasets and writes, per type,
  `<output_dirpath>/<type>.jsonl` (each row `num_repeats` times, with `agent_ref: {name: <agent>}` added
  when the row has none) and `<output_dirpath>/<type>_metrics.json`.
- `+mode=example_validation` takes the example datasets and writes the same files for type `example`,
  plus `<stem>_metrics.json` next to each dataset file (`data/example_metrics.json`), which
  `ng_test +should_validate_data=true` compares with what it computes.

Metrics follow NeMo Gym's `example_metrics.json` (same keys): number of examples; for the number of tools,
of user turns, the JSON-dumped number of words of `responses_create_params` (a proxy for tokens) and the
temperature: the count of non-null values, average, min, max and sample standard deviation; numeric task
fields get the same statistics and text fields their unique and total counts. Values are rounded to 2
decimals (3 when |x| < 1).

`+should_download=true` fetches each missing dataset file from its registry source (`huggingface:
{repo_id, artifact_fpath}` or `gitlab: {dataset_name, version, artifact_fpath}`, see
`nemo_gym.datasets.sources`), checksum verified, into its `jsonl_fpath`; a missing file without a source is
reported with where to put it; one a `prepare_script` writes (a benchmark's) is reported with the command that runs it
(`ng_prepare_benchmark`, `nemo_gym.datasets.benchmarks`).

A dataset's `prompt_config` (as NeMo Gym 0.7.0's benchmark datasets declare one: a prompt template,
`nemo_gym.collect.prompt_templates`) builds each row's `responses_create_params.input` from the row's fields as the
rows are read; a row that has an input already, or lacks a field the template names, is refused (0.7.0 applies it when
collating a benchmark dataset, under the same rule). Relative paths of a dataset (`jsonl_fpath`, `prompt_config`,
`prepare_script`) are found from the root of the tree of the YAML file that declares it (a catalog config names them
from there, as 0.7.0's do), else the working directory, else this repository (`dataset_file`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.collect.prompt_templates import PromptConfig, load_prompt_config, prompted_row
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import iter_lines
from nemo_gym.common.layout import REPO_ROOT, SERVER_TYPES
from nemo_gym.config import LoadedConfig, config_tree_root, load_config, validation_problems
from nemo_gym.datasets.sources import dataset_source, fetch_dataset
from nemo_gym.env.dataset_metrics import dataset_metrics, metrics_path

__all__ = [
    "Dataset",
    "DatasetSpec",
    "PrepareDataOptions",
    "dataset_file",
    "declared_datasets",
    "prepare_command",
    "prepare_data",
    "prepare_main",
    "read_rows",
]

MODE_TYPES = {"train_preparation": ("train", "validation", "benchmark"), "example_validation": ("example",)}


class PrepareDataOptions(BaseModel):
    """Parameters of `ng_prepare_data` (the rest of the config holds the server instances and their datasets)."""

    model_config = ConfigDict(extra="ignore")
    config_paths: list[str] = Field(
        default_factory=list, description="YAML files whose server instances declare datasets"
    )
    output_dirpath: str = Field(description="folder for the prepared <type>.jsonl and <type>_metrics.json files")
    mode: Literal["train_preparation", "example_validation"] = Field(
        description=(
            "train_preparation: train/validation/benchmark datasets; example_validation: example datasets (also writes"
            " data/example_metrics.json)"
        )
    )
    should_download: bool = Field(
        False, description="fetch missing datasets from their huggingface: / gitlab: source into their jsonl_fpath"
    )


class DatasetSpec(BaseModel):
    """One `datasets:` entry of a server instance."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(description="dataset name")
    type: Literal["train", "validation", "benchmark", "example"] = Field(description="what the dataset is for")
    jsonl_fpath: str = Field(description="JSONL file, relative to the repository root or absolute")
    num_repeats: int = Field(1, ge=1, description="times each row appears in the prepared file")
    license: str | None = Field(None, description="license of the data")
    huggingface_identifier: Any = Field(None, description="where the data can be downloaded from, if anywhere")
    prepare_script: str | None = Field(
        None, description="a Python file whose prepare() writes jsonl_fpath (ng_prepare_benchmark runs it)"
    )
    prompt_config: str | None = Field(
        None, description="a prompt template that builds each row's responses_create_params.input from its fields"
    )


@dataclass
class Dataset:
    """A declared dataset: the instance that declares it, its entry, and its files (`dataset_file`)."""

    agent: str
    spec: DatasetSpec
    path: Path
    root: Path | None = None  # the root of the tree of the YAML file that declares it

    def file(self, raw: str) -> Path:
        """One of its relative paths (`dataset_file`)."""
        return dataset_file(raw, self.root)


def dataset_file(raw: str, root: Path | None) -> Path:
    """A dataset's file: absolute as given; else under `root` (the declaring YAML file's tree), the working directory
    or this repository, the first where it exists (under `root`, else this repository, where none does: a file to be
    prepared or downloaded goes into the tree that declares it)."""
    path = Path(raw).expanduser()
    if path.is_absolute():
        return path
    bases = [base for base in (root, Path.cwd(), REPO_ROOT) if base is not None]
    return next((base / path for base in bases if (base / path).exists()), (root or REPO_ROOT) / path)


def declared_datasets(loaded: LoadedConfig, types: tuple[str, ...]) -> list[Dataset]:
    """The datasets of the given types declared by the config's server instances.

    Raises:
        ConfigError: a malformed `datasets:` entry, naming the instance.
    """
    found = []
    for name, value in loaded.values.items():
        fields = _server_fields(value)
        if fields is None:
            continue
        for index, entry in enumerate(fields.get("datasets") or []):
            try:
                spec = DatasetSpec.model_validate(entry)
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise ConfigError(f"{loaded.origin(name)}: key '{name}...datasets.{index}': {problems}") from exc
            if spec.type in types:
                origin = loaded.origin(name)
                root = config_tree_root(Path(origin)) if origin != "<command line>" else None
                found.append(Dataset(name, spec, dataset_file(spec.jsonl_fpath, root), root))
    return found


def _server_fields(value: Any) -> dict[str, Any] | None:
    """The fields of `{<server type>: {<implementation>: {fields}}}`, else None."""
    if not (isinstance(value, dict) and len(value) == 1 and next(iter(value)) in SERVER_TYPES):
        return None
    inner = next(iter(value.values()))
    if not (isinstance(inner, dict) and len(inner) == 1):
        return None
    fields = next(iter(inner.values()))
    return fields if isinstance(fields, dict) else None


def read_rows(path: Path, prompt: PromptConfig | None = None) -> list[dict[str, Any]]:
    """The rows of a dataset file, each checked; with `prompt` (the dataset's `prompt_config`), each row's input built
    from it first.

    Raises:
        DataError: `file:line: [rule] message` for every bad row (at most 20 listed).
    """
    rows, problems = [], []
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            problems.append(f"{path}:{number}: [json] not valid JSON: {exc}")
            continue
        if not isinstance(row, dict):
            problems.append(f"{path}:{number}: [json] a JSON {type(row).__name__}, not an object")
            continue
        if prompt is not None:
            try:
                row = prompted_row(row, prompt, f"{path}:{number}: [prompt-config]")
            except DataError as exc:
                problems.append(str(exc))
                continue
        if not isinstance(row.get("responses_create_params"), dict) or not isinstance(
            row["responses_create_params"].get("input"), (str, list)
        ):
            problems.append(
                f"{path}:{number}: [responses-create-params] needs a responses_create_params object with an input"
            )
        else:
            rows.append(row)
    if problems:
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise DataError("\n".join(problems[:20]) + more)
    return rows


def header(dataset: Dataset) -> dict[str, Any]:
    spec = dataset.spec
    return {
        "name": spec.name,
        "type": spec.type,
        "jsonl_fpath": spec.jsonl_fpath,
        "num_repeats": spec.num_repeats,
        "license": spec.license,
    }


def _missing(dataset: Dataset, should_download: bool) -> DataError:
    spec = dataset.spec
    source = f" (huggingface_identifier: {spec.huggingface_identifier})" if spec.huggingface_identifier else ""
    how = (
        "it has no huggingface: or gitlab: source to download it from: fetch it yourself"
        if should_download
        else "fetch it (+should_download=true downloads it from its huggingface: / gitlab: source)"
    )
    return DataError(
        f"{dataset.path}: dataset {spec.name!r} ({spec.type}) of {dataset.agent} is missing{source}; {how} and save it"
        f" as {spec.jsonl_fpath}"
    )


def _download(dataset: Dataset, should_download: bool) -> None:
    """Fetch a missing dataset file from its registry source, else raise DataError saying how to get it."""
    if dataset.spec.prepare_script:
        raise DataError(
            f"{dataset.path}: dataset {dataset.spec.name!r} ({dataset.spec.type}) of {dataset.agent} is not prepared:"
            f" its prepare_script {dataset.spec.prepare_script} writes it. Run it first: ng_prepare_benchmark with this"
            " config (gym eval prepare --benchmark NAME, or --config)"
        )
    source = None
    if should_download:
        source = dataset_source(dataset.spec.model_dump(), f"{dataset.agent}: dataset {dataset.spec.name!r}")
    if source is None:
        raise _missing(dataset, should_download)
    print(fetch_dataset(source, dataset.path))


def prepare_data(loaded: LoadedConfig, options: PrepareDataOptions) -> dict[str, Path]:
    """Validate and collate the datasets in scope of `options.mode`. Returns {type: prepared JSONL path}.

    Raises:
        ConfigError: no dataset in scope, or a malformed `datasets:` entry.
        DataError: a missing dataset file or bad rows (`file:line: [rule] message`).
    """
    datasets = declared_datasets(loaded, MODE_TYPES[options.mode])
    if not datasets:
        raise ConfigError(
            f"no dataset of type {' / '.join(MODE_TYPES[options.mode])} in the config's `datasets:` entries"
            f" (+mode={options.mode})"
        )
    for dataset in datasets:
        if not dataset.path.is_file():
            _download(dataset, options.should_download)
    out = Path(options.output_dirpath)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for kind in dict.fromkeys(d.spec.type for d in datasets):
        prepared, per_dataset = [], []
        for dataset in (d for d in datasets if d.spec.type == kind):
            prompt = dataset.spec.prompt_config
            rows = read_rows(dataset.path, load_prompt_config(dataset.file(prompt)) if prompt else None)
            metrics = {**header(dataset), **dataset_metrics(rows)}
            per_dataset.append(metrics)
            if options.mode == "example_validation":
                metrics_path(dataset.path).write_text(json.dumps(metrics, indent=4) + "\n")
            for row in rows:
                prepared += [{"agent_ref": {"name": dataset.agent}, **row}] * dataset.spec.num_repeats
        written[kind] = out / f"{kind}.jsonl"
        written[kind].write_text("".join(json.dumps(row) + "\n" for row in prepared))
        (out / f"{kind}_metrics.json").write_text(
            json.dumps({"datasets": per_dataset, "prepared": dataset_metrics(prepared)}, indent=4) + "\n"
        )
    return written


def prepare_main(loaded: LoadedConfig) -> int:
    try:
        options = PrepareDataOptions.model_validate(loaded.values)
    except ValidationError as exc:
        raise ConfigError(
            "; ".join(validation_problems(PrepareDataOptions, exc, "+{key}")) + " (see +help=true)"
        ) from exc
    for kind, path in prepare_data(loaded, options).items():
        rows = sum(1 for _ in path.open())
        print(f"{kind}: {rows} rows -> {path} (metrics: {path.with_name(f'{kind}_metrics.json')})")
    return 0


def prepare_command(argv: list[str]) -> int:
    """`ng_prepare_data`'s main: the config of `argv`, loaded unresolved (datasets need no secrets or ${...} values)."""
    return prepare_main(load_config(argv, resolve=False))
