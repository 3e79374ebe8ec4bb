"""`ng_e2e_collect_rollouts` (NeMo Gym 0.7.0's `gym eval run` without `--no-serve`): the config's datasets of one split
prepared (`ng_prepare_data +mode=train_preparation +should_download=true`), its servers started (`ng_run`, a child
process), the prepared rows collected through them (`ng_collect_rollouts`), the servers stopped.

Arguments: the config (`+config_paths=[...]`, overrides) for ng_prepare_data and ng_run, plus `+split=train |
validation | benchmark` (required), `+reuse_existing_data_preparation=true` (keep an earlier prepared file) and
ng_collect_rollouts' parameters (`+output_jsonl_fpath` required, `+agent_name`, `+limit`, `+num_repeats`, ...).

As 0.7.0: the prepared files go to `<output without suffix>/preprocessed_datasets/<split>.jsonl`; `+input_jsonl_fpath`
is refused (the input is the prepared split), and so is `+split=example`. Departures: ng_run's log goes to
`<output stem>.ng_run.log`; 0.7.0's `rollout_collection_driver`, health checks and `require_complete` are not offered;
our collection resumes by default (`+resume=false` starts over), where 0.7.0 needs `+resume_from_cache=true`.
"""

from __future__ import annotations

from pathlib import Path

from nemo_gym.collect.command import CollectConfig, collect_main
from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config, parse_overrides
from nemo_gym.config.commands import COMMANDS, parse_options
from nemo_gym.datasets.prepare import prepare_main
from nemo_gym.orchestration.server_processes import NgRunProcess

__all__ = ["SPLITS", "e2e_main", "split_arguments"]

SPLITS = ("train", "validation", "benchmark")
E2E_KEYS = ("split", "reuse_existing_data_preparation")
COLLECT_KEYS = tuple(k for k in CollectConfig.model_fields if k not in ("input_jsonl_fpath", "head_server_url"))


def _key(arg: str) -> str:
    [(key, _)] = parse_overrides([arg])
    return key.split(".")[0]


def split_arguments(argv: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """`(e2e options, ng_collect_rollouts arguments, config arguments)` of `argv`.

    Raises:
        ConfigError: `+input_jsonl_fpath`, `+head_server_url`, a missing or unknown `+split`, or a bad argument.
    """
    own: dict[str, str] = {}
    collect, config = [], []
    for arg in argv:
        key = _key(arg)
        if key in ("input_jsonl_fpath", "head_server_url"):
            raise ConfigError(
                f"+{key} is not supported when serving end-to-end: the input is the config's prepared +split dataset"
                " and the servers are started here (use ng_collect_rollouts for a given file or running servers)"
            )
        if key in E2E_KEYS:
            own[key] = arg.split("=", 1)[1]
        else:
            (collect if key in COLLECT_KEYS else config).append(arg)
    split = own.get("split")
    if split is None:
        raise ConfigError(
            f"+split is required (gym eval run --split): which datasets of the config to collect, one of"
            f" {', '.join(SPLITS)} (a benchmark's are of type benchmark)"
        )
    if split not in SPLITS:
        hint = " (example datasets are validated with ng_prepare_data, not collected)" if split == "example" else ""
        raise ConfigError(f"+split must be one of {', '.join(SPLITS)}, got {split!r}{hint}")
    return own, collect, config


def _prepare(config: list[str], out_dir: Path, split: str, reuse: bool) -> Path:
    """The prepared `<split>.jsonl` (prepared now unless `reuse` and it exists)."""
    prepared = out_dir / f"{split}.jsonl"
    if reuse and prepared.is_file():
        print(f"Skipping data preparation: +reuse_existing_data_preparation=true and {prepared} exists")
        return prepared
    argv = [*config, f"++output_dirpath={out_dir}", "++mode=train_preparation", "++should_download=true"]
    prepare_main(load_config(argv, resolve=False))
    if not prepared.is_file():
        raise ConfigError(
            f"the config declares no {split!r} dataset (no {prepared} was prepared); declare one under an agent's"
            f" datasets: with type: {split}"
        )
    return prepared


def e2e_main(argv: list[str]) -> int:
    """`ng_e2e_collect_rollouts`. Returns ng_collect_rollouts' exit status.

    Raises:
        ConfigError: a bad argument or config, or no dataset of the split.
        ServerStartError: the servers did not start (ng_run's last log lines in the message).
    """
    own, collect_argv, config = split_arguments(argv)
    # checked before anything is prepared or started (the input and head URL are set below)
    options: CollectConfig = parse_options(COMMANDS["collect_rollouts"], [*collect_argv, "+input_jsonl_fpath=-"])
    output = Path(options.output_jsonl_fpath)
    reuse = str(own.get("reuse_existing_data_preparation", "false")).lower() == "true"
    prepared = _prepare(config, output.with_suffix("") / "preprocessed_datasets", own["split"], reuse)
    print(
        f"Output artifacts:\n1. Preprocessed datasets: {prepared.parent}\n2. Dataset file used for rollout collection:"
        f" {prepared}\n3. Rollout collection results file: {output}"
    )
    servers = NgRunProcess(config, None, output.with_suffix(".ng_run.log"), caller="ng_e2e_collect_rollouts")
    try:
        return collect_main(
            options.model_copy(update={"input_jsonl_fpath": str(prepared), "head_server_url": servers.head_url})
        )
    finally:
        servers.stop()
