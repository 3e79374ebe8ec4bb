"""Write reasoning_gym tasks as nemo_gym JSONL rows (the prepare step of the reasoning_gym environment).

    python resources_servers/reasoning_gym/prepare.py +output_jsonl_fpath=tasks.jsonl \\
        "+generators=[{name: basic_arithmetic, size: 50, seed: 1, config: {max_terms: 2, max_digits: 1}}]"
    python resources_servers/reasoning_gym/prepare.py \\
        "+config_paths=[resources_servers/reasoning_gym/configs/quickstart_tasks.yaml]"

Each generator is a reasoning_gym dataset name, a size, a seed and the keyword arguments of its config
class (its difficulty: `reasoning_gym.create_dataset(name, size=, seed=, **config)`). Generation runs
offline and is deterministic: the same generators give a byte-identical file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import reasoning_gym
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reasoning_gym.factory import DATASETS

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import write_jsonl
from nemo_gym.config import load_config, validation_problems

__all__ = ["DEFAULT_ANSWER_INSTRUCTION", "GeneratorSpec", "build_tasks", "prepare_tasks", "main"]

DEFAULT_ANSWER_INSTRUCTION = "Put your final answer inside \\boxed{}."
USAGE = __doc__


class GeneratorSpec(BaseModel):
    """One reasoning_gym generator: which tasks, how many, from which seed, at which difficulty."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="reasoning_gym dataset name, e.g. basic_arithmetic")
    size: int = Field(gt=0, description="number of tasks to generate")
    seed: int = Field(0, description="generator seed; task i of a generator depends only on (seed, i, config)")
    config: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the dataset's config class (difficulty)"
    )


def _check_name(name: str) -> None:
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise ConfigError(
            f"unknown reasoning_gym generator {name!r}{hint}. List all {len(DATASETS)} names with: "
            "python -c 'from reasoning_gym.factory import DATASETS; print(sorted(DATASETS))'"
        )


def _create(spec: GeneratorSpec) -> Any:
    """The reasoning_gym dataset of `spec`.

    Raises:
        ConfigError: an unknown name, or a config the dataset's config class rejects (its fields are listed).
    """
    _check_name(spec.name)
    fields = [f.name for f in dataclasses.fields(DATASETS[spec.name][1]) if f.name not in ("size", "seed")]
    if {"size", "seed"} & spec.config.keys():
        raise ConfigError(f"generator {spec.name!r}: give size and seed next to name, not inside config")
    try:
        return reasoning_gym.create_dataset(spec.name, size=spec.size, seed=spec.seed, **spec.config)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(
            f"generator {spec.name!r}: bad config {spec.config!r}: {exc or type(exc).__name__}. Its fields:"
            f" {', '.join(fields)}"
        ) from exc


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)  # a stable order, whatever the hash seed
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    return str(value)


def _task_row(spec: GeneratorSpec, index: int, entry: dict[str, Any], answer_instruction: str) -> dict[str, Any]:
    entry = json.loads(json.dumps(entry, default=_json_default))
    content = f"{entry['question'].rstrip()}\n\n{answer_instruction}" if answer_instruction else entry["question"]
    return {
        "responses_create_params": {"input": [{"role": "user", "content": content}]},
        "question": entry["question"],
        "answer": entry["answer"],
        "dataset": spec.name,
        "entry": entry,
        "task_id": f"{spec.name}-{spec.seed}-{index}",
    }


def build_tasks(
    generators: list[GeneratorSpec | dict[str, Any]], *, answer_instruction: str = DEFAULT_ANSWER_INSTRUCTION
) -> list[dict[str, Any]]:
    """The task rows of `generators`, in order (generator by generator, index by index).

    Raises:
        ConfigError: a bad generator spec or config, or two generators with the same name and seed
            (their task ids would clash).
    """
    specs = []
    for index, generator in enumerate(generators):
        try:
            specs.append(GeneratorSpec.model_validate(generator))
        except (
            ValidationError
        ) as exc:  # each problem named by its key, e.g. `generators.0.sise: ... (did you mean 'size'?)`
            problems = validation_problems(GeneratorSpec, exc, key_format=f"generators.{index}.{{key}}")
            raise ConfigError("bad generator spec: " + "; ".join(problems)) from exc
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for spec in specs:
        if (spec.name, spec.seed) in seen:
            raise ConfigError(f"two generators {spec.name!r} with seed {spec.seed}: give them different seeds")
        seen.add((spec.name, spec.seed))
        dataset = _create(spec)
        rows.extend(_task_row(spec, index, dataset[index], answer_instruction) for index in range(spec.size))
    return rows


def prepare_tasks(
    generators: list[GeneratorSpec | dict[str, Any]],
    output_jsonl_fpath: str | Path,
    *,
    answer_instruction: str = DEFAULT_ANSWER_INSTRUCTION,
) -> int:
    """Generate the tasks of `generators` and write them to `output_jsonl_fpath` (atomically).

    Returns:
        The number of rows written.

    Raises:
        ConfigError: see `build_tasks`.
    """
    rows = build_tasks(generators, answer_instruction=answer_instruction)
    write_jsonl(output_jsonl_fpath, rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    """Command line: `+output_jsonl_fpath=... +generators=[...]` (or `+config_paths=[a yaml with both]`)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "+help=true" in argv:
        print(USAGE)
        return 0
    values = load_config(argv).values
    for key in ("output_jsonl_fpath", "generators"):
        if key not in values:
            raise ConfigError(f"missing +{key}=...\n{USAGE}")
    count = prepare_tasks(
        values["generators"],
        values["output_jsonl_fpath"],
        answer_instruction=values.get("answer_instruction", DEFAULT_ANSWER_INSTRUCTION),
    )
    print(f"wrote {count} tasks to {values['output_jsonl_fpath']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
