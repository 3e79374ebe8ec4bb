"""`ng_materialize_prompts` (NeMo Gym 0.7.0's `gym dataset render`): a prompt template (a YAML file with `user` and
optional `system`, each a `str.format` template over a row's top-level fields) applied to raw JSONL rows, writing
each row with `responses_create_params.input` filled in and `prompt_config_used` naming the template.

Same output as NeMo Gym 0.7.0's `nemo_gym.prompt.materialize_prompts`, byte for byte (`json.dumps` lines, the
prompt path resolved the way it resolves it: absolute as given, relative under the first of
`$NEMO_GYM_EXTRA_ROOTS`, the current directory where it exists). Departures: a row that already has
`responses_create_params.input`, a template field a row lacks, or a bad template file is a `DataError` /
`ConfigError` naming the file and row, not a traceback; 0.7.0's install root is not searched (ours ships no
prompt templates).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.errors import ConfigError, DataError
from nemo_gym.jsonl import iter_lines

__all__ = ["MaterializePromptsOptions", "PromptConfig", "apply_prompt", "materialize_main", "search_roots"]


class MaterializePromptsOptions(BaseModel):
    """Parameters of `ng_materialize_prompts`."""

    model_config = ConfigDict(extra="forbid")
    input_jsonl_fpath: str = Field(description="raw JSONL rows (without responses_create_params.input)")
    prompt_config: str = Field(description="prompt template YAML: `user` (required) and `system` (optional)")
    output_jsonl_fpath: str = Field(description="output JSONL with responses_create_params.input filled in")


class PromptConfig(BaseModel):
    """A prompt template file: `{field}` placeholders are filled from a row's top-level fields (`{{` for a brace)."""

    user: str
    system: str | None = None


def search_roots() -> list[Path]:
    """Where relative component paths are looked up, first match wins: `$NEMO_GYM_EXTRA_ROOTS` (os.pathsep-separated,
    as NeMo Gym 0.7.0 reads it), then the current directory."""
    extra = [Path(p).resolve() for p in os.environ.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if p]
    return [*extra, Path.cwd()]


def _resolve(path: str) -> Path:
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


def materialize_main(options: MaterializePromptsOptions) -> int:
    """`ng_materialize_prompts`. Returns 0.

    Raises:
        DataError: a line is not JSON, a row already has `responses_create_params.input`, or lacks a template field.
        ConfigError: the prompt template cannot be read.
    """
    prompt_path = _resolve(options.prompt_config)
    prompt = load_prompt_config(prompt_path)
    rows = []
    for line_no, line in iter_lines(options.input_jsonl_fpath):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"{options.input_jsonl_fpath}:{line_no}: not valid JSON ({exc})") from None
    given = [i for i, row in enumerate(rows) if (row.get("responses_create_params") or {}).get("input")]
    if given:
        raise DataError(
            f"{options.input_jsonl_fpath}: rows {given} already have responses_create_params.input; a prompt_config"
            " and a given input are mutually exclusive (drop one)"
        )
    output = Path(options.output_jsonl_fpath)
    output.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, row in enumerate(rows):
        try:
            materialized = apply_prompt(row, prompt)
        except KeyError as exc:
            raise DataError(
                f"{options.input_jsonl_fpath}: row {i}: the prompt template references field {exc} but the row only"
                f" has fields {list(row)}"
            ) from None
        materialized["prompt_config_used"] = str(prompt_path)
        lines.append(json.dumps(materialized) + "\n")
    output.write_text("".join(lines))
    print(f"Materialized {len(rows)} rows to {output}")
    return 0
