"""NeMo Gym 0.7.0's `gym eval prepare` (`ng_prepare_benchmark`), refused with the reason. Its benchmarks are listed by
`ng_list_benchmarks` (`gym list benchmarks`): the benchmark entries of `nemo_gym.datasets.catalog`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError

__all__ = ["PrepareBenchmarkOptions", "prepare_benchmark_main"]


class PrepareBenchmarkOptions(BaseModel):
    """Parameters of `ng_prepare_benchmark` (it runs nothing: see `prepare_benchmark_main`)."""

    model_config = ConfigDict(extra="allow")
    config_paths: list[str] = Field(
        default_factory=list, description="the benchmark's config (benchmarks/<name>/config.yaml)"
    )


def prepare_benchmark_main(argv: list[str]) -> int:
    """`ng_prepare_benchmark`: not supported; always raises.

    Raises:
        ConfigError: naming what 0.7.0 does here and why we do not.
    """
    raise ConfigError(
        "not supported: NeMo Gym 0.7.0's prepare_benchmark runs the benchmark's own prepare.py, which imports NeMo Gym"
        " 0.7.0's internals and downloads the data from the network (Hugging Face and others); nemo_gym ships no"
        " benchmark folders and runs no third-party prepare scripts. Prepare the data with NeMo Gym 0.7.0"
        " (`gym eval prepare --benchmark NAME`), then use the JSONL it writes with ng_collect_rollouts or ng_eval."
    )
