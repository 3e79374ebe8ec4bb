"""Prompt templates (NeMo Gym's `prompt_config`): a YAML file with `user` and optional `system`, each a `str.format`
template over a row's top-level fields, that builds a row's `responses_create_params.input`. Applied to rows by
`ng_collect_rollouts +prompt_config=` (as NeMo Gym's collector applies it) and by `ng_materialize_prompts`
(`nemo_gym.datasets.prompts`), the same way as NeMo Gym 0.7.0's `nemo_gym.prompt`: the path resolved as it resolves
it (absolute as given, relative under the first of `$NEMO_GYM_EXTRA_ROOTS`, the current directory where it exists),
other create parameters of the row kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nemo_gym.common.errors import ConfigError, DataError

__all__ = [
    "PromptConfig",
    "apply_prompt",
    "load_prompt_config",
    "prompted_row",
    "resolve_prompt_path",
    "search_roots",
]


class PromptConfig(BaseModel):
    """A prompt template file: `{field}` placeholders are filled from a row's top-level fields (`{{` for a brace)."""

    user: str
    system: str | None = None


def search_roots() -> list[Path]:
    """Where relative component paths are looked up, first match wins: `$NEMO_GYM_EXTRA_ROOTS` (os.pathsep-separated,
    as NeMo Gym 0.7.0 reads it), then the current directory."""
    extra = [Path(p).resolve() for p in os.environ.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if p]
    return [*extra, Path.cwd()]


def resolve_prompt_path(path: str) -> Path:
    """A prompt template's path: absolute as given, else under the first search root where it exists (else the
    first root)."""
    p = Path(path)
    if p.is_absolute():
        return p
    roots = search_roots()
    return next((root / p for root in roots if (root / p).exists()), roots[0] / p)


def load_prompt_config(path: Path) -> PromptConfig:
    """Raises: ConfigError: the file is missing, not YAML, or lacks `user`."""
    try:
        return PromptConfig.model_validate(yaml.safe_load(path.read_text()))
    except OSError as exc:
        raise ConfigError(f"prompt_config {path}: cannot be read ({exc.strerror})") from None
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(
            f"prompt_config {path}: not a prompt template (`user:` and optional `system:`): {exc}"
        ) from None


def apply_prompt(row: dict[str, Any], prompt: PromptConfig) -> dict[str, Any]:
    """`row` with `responses_create_params.input` = the template's messages (other create parameters kept).

    Raises:
        KeyError: the template names a field the row lacks.
    """
    messages = [] if prompt.system is None else [{"role": "system", "content": prompt.system.format_map(row)}]
    messages.append({"role": "user", "content": prompt.user.format_map(row)})
    params = row.get("responses_create_params", {})
    params = dict(params) if isinstance(params, dict) else {}
    params["input"] = messages
    return {**row, "responses_create_params": params}


def prompted_row(row: dict[str, Any], prompt: PromptConfig, where: str) -> dict[str, Any]:
    """`row` with its input built by `prompt` (NeMo Gym's collector and its collation of a
    benchmark dataset: both at once are refused, as there).

    Raises:
        DataError: (`where: ...`) the row has `responses_create_params.input` already, or lacks a template field.
    """
    params = row.get("responses_create_params")
    if isinstance(params, dict) and params.get("input"):
        raise DataError(
            f"{where}: has responses_create_params.input and +prompt_config builds it: they are mutually exclusive"
            " (drop the prompt_config, or the rows' input)"
        )
    try:
        return apply_prompt(row, prompt)
    except KeyError as exc:
        raise DataError(
            f"{where}: the prompt template names the field {exc}, which the row lacks (its fields: {', '.join(row)})"
        ) from None
    except (IndexError, ValueError) as exc:  # a positional `{0}` or an unmatched brace in the template
        raise DataError(f"{where}: the prompt template cannot be filled from the row: {exc}") from None
