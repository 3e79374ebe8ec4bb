"""Write a verifiers environment's dataset as nemo_gym task rows (the prepare step of verifiers_env).

    python resources_servers/verifiers_env/prepare.py +env_id=vf_reverse_text +split=train \\
        +output_jsonl_fpath=results/vf_reverse_text_train.jsonl "+env_args={num_train_examples: 50}" \\
        +agent_name=vf_reverse_text_simple_agent

The environment is loaded in this interpreter (where its package is installed), `load_environment(**env_args)`;
each row of its train (`+split=train`) or evaluation (`+split=eval`) dataset becomes a row with
`responses_create_params.input` = the prompt and the task fields the rubric reads (`answer`, `task`, `info`,
`example_id`). `ng_train @config.toml` runs this step itself for every verifiers `[[env]]`.
`data/example.jsonl` is this step's output for the bundled `vf_reverse_text` (`+limit=5`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import write_jsonl
from nemo_gym.config import parse_overrides
from nemo_gym.serving.module_loading import script_package

if (
    not __package__
):  # run as a script (`python prepare.py`): its relative imports resolve in this folder's package (PEP 366)
    __package__ = script_package(__file__)

from . import vf_adapter  # noqa: E402

__all__ = ["PrepareOptions", "prepare_rows", "main"]

EXAMPLE_ENVS = str(Path(__file__).resolve().parent / "example_envs")


class PrepareOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    env_id: str = Field(description="environment id (`owner/name` or a module name)")
    env_args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of load_environment()")
    split: Literal["train", "eval"] = Field(
        "train", description="train: the environment's dataset; eval: its eval_dataset (else the dataset)"
    )
    limit: int | None = Field(None, ge=1, description="write the first `limit` rows")
    output_jsonl_fpath: str = Field(description="JSONL file to write")
    agent_name: str | None = Field(None, description="agent instance written as each row's agent_ref")
    python_path: list[str] = Field(
        default_factory=lambda: [EXAMPLE_ENVS], description="folders appended to sys.path to find the module"
    )


def prepare_rows(options: PrepareOptions) -> list[dict[str, Any]]:
    """The task rows of `options` (not written).

    Raises:
        ConfigError: see `vf_adapter.load_env` and `vf_adapter.task_rows`.
    """
    env = vf_adapter.load_env(options.env_id, options.env_args, options.python_path)
    rows = vf_adapter.task_rows(env, options.split, options.limit)
    if options.agent_name:
        rows = [{**row, "agent_ref": {"name": options.agent_name}} for row in rows]
    return rows


def main(argv: list[str]) -> int:
    """`+key=value` arguments (see the module docstring); returns the exit status."""
    values: dict[str, Any] = {}
    try:
        for key, value in parse_overrides(argv):
            values[key] = value
        options = PrepareOptions.model_validate(values)
        rows = prepare_rows(options)
    except ValidationError as exc:
        problems = "; ".join("+" + ".".join(map(str, e["loc"])) + f": {e['msg']}" for e in exc.errors())
        print(f"prepare: {problems}\n{__doc__}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 2
    write_jsonl(options.output_jsonl_fpath, rows)
    print(f"prepare: {len(rows)} rows of {options.env_id} ({options.split}) -> {options.output_jsonl_fpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
