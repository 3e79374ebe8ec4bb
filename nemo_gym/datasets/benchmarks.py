"""`ng_prepare_benchmark` (NeMo Gym 0.7.0's `gym eval prepare`): run the `prepare()` of each dataset of a config that
has a `prepare_script` (every `benchmark` dataset has one: 0.7.0's manifest rule), as 0.7.0's `prepare_benchmark`
runs it: every script is checked first (it exists, it defines `prepare`), then each is imported and
`prepare(**prepare_script_args)` is called, which must return the dataset's own `jsonl_fpath` (else the error says
both). `+use_cached_prepared_benchmarks=true` skips a dataset whose file exists;
`+num_prepare_benchmark_processes=N` runs up to N scripts at once, each in a process of its own. Its benchmarks are
listed by `ng_list_benchmarks` (`gym list benchmarks`); `ng_init_benchmark` scaffolds one whose prepare.py needs
nothing else.

Departures: a script is imported from its file (its tree's root on `sys.path`, so it may import its own siblings as
0.7.0's dotted import does), not by a dotted name from the working directory; `prepare_dependencies` are checked, not
installed (a missing one is named with the command that installs it); a script that imports a module of NeMo Gym
0.7.0 itself (its benchmark folders' scripts import `nemo_gym.*` helpers nemo_gym does not have) is refused with that
module named, and so is one that fails: nemo_gym ships no benchmark folders of its own.
"""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any, get_args

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config, validation_problems
from nemo_gym.datasets.prepare import Dataset, DatasetSpec, declared_datasets

__all__ = ["PrepareBenchmarkOptions", "prepare_benchmark", "prepare_benchmark_main"]

ALL_TYPES = get_args(DatasetSpec.model_fields["type"].annotation)  # every dataset type


class PrepareBenchmarkOptions(BaseModel):
    """Parameters of `ng_prepare_benchmark` (the rest of the config holds the server instances and their datasets)."""

    model_config = ConfigDict(extra="ignore")
    config_paths: list[str] = Field(
        default_factory=list, description="the benchmark's config (benchmarks/<name>/config.yaml)"
    )
    use_cached_prepared_benchmarks: bool = Field(
        False, description="skip a dataset whose jsonl_fpath exists already (0.7.0's name)"
    )
    prepare_script_args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments passed to each prepare() (0.7.0's name)"
    )
    num_prepare_benchmark_processes: int = Field(
        1, ge=1, description="how many prepare scripts run at once, each in its own process (0.7.0's name)"
    )


def _missing_dependencies(dataset: Dataset) -> list[str]:
    """The entries of the dataset's `prepare_dependencies` (requirement strings) not installed in this Python."""
    missing = []
    for entry in dataset.spec.model_extra.get("prepare_dependencies") or []:
        try:
            requirement = Requirement(str(entry))
            installed = metadata.version(requirement.name)
        except (InvalidRequirement, metadata.PackageNotFoundError):
            missing.append(str(entry))
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            missing.append(str(entry))
    return missing


def _script(dataset: Dataset) -> Path:
    """The dataset's prepare script, checked.

    Raises:
        ConfigError: it is missing, or a prepare dependency is not installed.
    """
    script = dataset.file(str(dataset.spec.prepare_script))
    if not script.is_file():
        raise ConfigError(f"dataset {dataset.spec.name!r} of {dataset.agent}: its prepare_script {script} is missing")
    if missing := _missing_dependencies(dataset):
        raise ConfigError(
            f"dataset {dataset.spec.name!r}: its prepare_dependencies {missing} are not installed; install them first:"
            f" uv pip install --python {sys.executable} {' '.join(repr(m) for m in missing)}"
        )
    return script


def _import(script: Path, root: Path | None) -> Any:
    """The module of `script`, with `root` on `sys.path` while it is imported.

    Raises:
        ConfigError: it imports a module that is not installed (one of NeMo Gym 0.7.0 named so), or fails to import.
    """
    name = "_ng_prepare_" + "_".join(script.with_suffix("").parts[-3:]).replace("-", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None  # a .py file path always has a spec
    module = importlib.util.module_from_spec(spec)
    added = root is not None and str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("nemo_gym."):
            raise ConfigError(
                f"{script} imports {exc.name}, a module of NVIDIA NeMo Gym 0.7.0 that nemo_gym does not have: prepare"
                " this benchmark with NeMo Gym 0.7.0 (gym eval prepare --benchmark NAME) and use the JSONL it writes"
            ) from None
        raise ConfigError(f"{script} imports {exc.name}, which is not installed here: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"{script} failed to import: {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            sys.path.remove(str(root))
    if not callable(getattr(module, "prepare", None)):
        raise ConfigError(f"{script} defines no prepare() function (the one ng_prepare_benchmark calls)")
    return module


def _call(module: Any, script: Path, name: str, args: dict[str, Any]) -> str:
    """The path `module.prepare(**args)` returned, as a string ('' for None).

    Raises:
        ConfigError: prepare() failed, naming the script, the dataset and the error.
    """
    try:
        output = module.prepare(**args)
    except Exception as exc:
        raise ConfigError(f"{script}: prepare() failed for dataset {name!r}: {type(exc).__name__}: {exc}") from None
    return "" if output is None else str(output)


def _call_in_worker(script: Path, root: Path | None, name: str, args: dict[str, Any]) -> str:
    """`_call` in a worker process: the script imported there."""
    return _call(_import(script, root), script, name, args)


def prepare_benchmark(argv: list[str]) -> dict[str, Path]:
    """Prepare the datasets with a `prepare_script` of the config of `argv` (module docstring). Returns
    `{dataset name: its file}`, those skipped as cached included.

    Raises:
        ConfigError: no such dataset in the config, a script that is missing, imports what is not installed, defines
            no `prepare`, fails, or returns another path than the dataset's `jsonl_fpath`; a bad option.
    """
    loaded = load_config(argv, resolve=False)
    try:
        options = PrepareBenchmarkOptions.model_validate(loaded.values)
    except ValidationError as exc:
        raise ConfigError("; ".join(validation_problems(PrepareBenchmarkOptions, exc, "+{key}"))) from exc
    datasets = [d for d in declared_datasets(loaded, ALL_TYPES) if d.spec.prepare_script]
    if not datasets:
        raise ConfigError(
            "no dataset of the config has a prepare_script (a benchmark dataset declares one); give the benchmark's"
            " config: +config_paths=[benchmarks/<name>/config.yaml] (gym eval prepare --benchmark NAME)"
        )
    scripts = [_script(dataset) for dataset in datasets]  # every script checked before any runs, as 0.7.0
    modules = [_import(script, dataset.root) for script, dataset in zip(scripts, datasets)]
    prepared, runs = {}, []
    for dataset, script, module in zip(datasets, scripts, modules):
        if options.use_cached_prepared_benchmarks and dataset.path.is_file():
            print(f"Skipping {dataset.spec.name}: +use_cached_prepared_benchmarks=true and {dataset.path} exists")
            prepared[dataset.spec.name] = dataset.path
        else:
            print(f"Preparing dataset: {dataset.spec.name} ({script})")
            runs.append((dataset, script, module))
    args = options.prepare_script_args
    if options.num_prepare_benchmark_processes > 1 and len(runs) > 1:
        with ProcessPoolExecutor(min(options.num_prepare_benchmark_processes, len(runs))) as pool:
            calls = [pool.submit(_call_in_worker, script, d.root, d.spec.name, args) for d, script, _ in runs]
            outputs = [call.result() for call in calls]
    else:
        outputs = [_call(module, script, d.spec.name, args) for d, script, module in runs]
    for (dataset, script, _), output in zip(runs, outputs):
        if not output or Path(output).resolve() != dataset.path.resolve():
            raise ConfigError(
                f"{script}: prepare() returned {output or None}, not the dataset's jsonl_fpath {dataset.path}: a"
                " prepare script writes the file its dataset names and returns its path"
            )
        rows = sum(1 for line in dataset.path.open(encoding="utf-8") if line.strip())
        print(f"Dataset prepared at: {dataset.path} ({rows} rows)")
        prepared[dataset.spec.name] = dataset.path
    return prepared


def prepare_benchmark_main(argv: list[str]) -> int:
    """`ng_prepare_benchmark`'s main. Returns 0 (errors raise)."""
    prepare_benchmark(argv)
    return 0
