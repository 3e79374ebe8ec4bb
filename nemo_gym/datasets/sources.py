"""Registry sources of config `datasets:` entries, fetched by `ng_prepare_data +should_download=true`.

```yaml
datasets:
  - {name: train, type: train, jsonl_fpath: data/train.jsonl,
     huggingface: {repo_id: my-org/NeMo-Gym-Math-my_env-my_data, artifact_fpath: train.jsonl}}
  - {name: extra, type: train, jsonl_fpath: data/extra.jsonl,
     gitlab: {dataset_name: my_data, version: 0.0.1, artifact_fpath: extra.jsonl}}
```
`huggingface_identifier:` / `gitlab_identifier:` mappings with the same fields are read the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError

__all__ = ["HuggingFaceSource", "GitlabSource", "dataset_source", "fetch_dataset"]


class HuggingFaceSource(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    repo_id: str = Field(description="dataset repository, <organization>/<name>")
    artifact_fpath: str = Field(description="file of the repository")


class GitlabSource(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    dataset_name: str = Field(description="generic package name")
    version: str = Field(description="version, x.y.z")
    artifact_fpath: str | None = Field(None, description="file of the version (default: its only JSONL file)")


def dataset_source(entry: dict[str, Any], where: str = "datasets entry") -> HuggingFaceSource | GitlabSource | None:
    """The registry source of a `datasets:` entry (as a mapping), or None when it names none.

    Raises:
        ConfigError: a malformed `huggingface:` / `gitlab:` mapping, naming `where`.
    """
    for keys, model in (
        (("huggingface", "huggingface_identifier"), HuggingFaceSource),
        (("gitlab", "gitlab_identifier"), GitlabSource),
    ):
        for key in keys:
            value = entry.get(key)
            if isinstance(value, dict):
                try:
                    return model.model_validate(value)
                except ValidationError as exc:
                    problems = "; ".join(f"{key}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                    raise ConfigError(f"{where}: {problems}") from exc
    return None


def fetch_dataset(source: HuggingFaceSource | GitlabSource, output: Path) -> str:
    """Download `source` to `output` (checksum verified, atomic). Returns a line saying what was fetched."""
    if isinstance(source, HuggingFaceSource):
        from nemo_gym.datasets.hf import HubDatasets

        hub = HubDatasets()
        hub.download(source.repo_id, source.artifact_fpath, output)
        return f"downloaded {source.artifact_fpath} of {source.repo_id} from {hub.host} to {output}"
    from nemo_gym.datasets.gitlab import GitlabRegistry

    registry = GitlabRegistry()
    registry.download(source.dataset_name, source.version, output, source.artifact_fpath)
    return f"downloaded dataset {source.dataset_name!r} {source.version} from {registry.where} to {output}"
