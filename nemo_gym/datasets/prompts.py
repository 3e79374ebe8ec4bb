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
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.prompt_templates import apply_prompt, load_prompt_config, resolve_prompt_path
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import iter_lines

__all__ = ["MaterializePromptsOptions", "materialize_main"]


class MaterializePromptsOptions(BaseModel):
    """Parameters of `ng_materialize_prompts`."""

    model_config = ConfigDict(extra="forbid")
    input_jsonl_fpath: str = Field(description="raw JSONL rows (without responses_create_params.input)")
    prompt_config: str = Field(description="prompt template YAML: `user` (required) and `system` (optional)")
    output_jsonl_fpath: str = Field(description="output JSONL with responses_create_params.input filled in")


def materialize_main(options: MaterializePromptsOptions) -> int:
    """`ng_materialize_prompts`. Returns 0.

    Raises:
        DataError: a line is not JSON, a row already has `responses_create_params.input`, or lacks a template field.
        ConfigError: the prompt template cannot be read.
    """
    prompt_path = resolve_prompt_path(options.prompt_config)
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
