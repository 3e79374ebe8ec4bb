"""`ng_init_environment` (NeMo Gym 0.7.0's `gym env init --environment NAME`): a manifest-backed environment, as
0.7.0 lays one out: the resources server `resources_servers/<name>/` (`ng_init_resources_server`'s working
scaffold) and the catalog folder `environments/<name>/` beside it, holding

- `manifest.yaml`: the environment's catalog entry (0.7.0's schema, `nemo_gym.datasets.manifest`): kind, integration
  profile `custom-gym-verifier`, domain, description, authors, reward range, and the composition it mirrors (resources
  server, agent, model server, datasets);
- `config.yaml`: that composition: the server's config (`config_paths`) with the agent's datasets replaced by the
  environment's own;
- `data/example.jsonl`: the environment's example rows (the server's, to start from);
- `README.md`.

`ng_list_environments` lists it (status experimental), `gym env start --environment <name>` starts it, and NeMo Gym
0.7.0's `gym env validate <name>` accepts it as written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.datasets.manifest import load_manifest
from nemo_gym.scaffold.resources_server import init_resources_server, server_name

__all__ = ["InitEnvironmentOptions", "init_environment", "init_environment_main"]


class InitEnvironmentOptions(BaseModel):
    """Parameters of `ng_init_environment`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the environment's name (a Python identifier): environments/<name>/")
    description: str = Field("Word counting with a tool", description="one line on what the environment does")
    domain: str = Field("agent", description="its domain (math, coding, agent, knowledge, games, ...: manifest.yaml)")
    authors: list[str] = Field(default_factory=lambda: ["TODO"], description="who maintains it (manifest.yaml)")
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0), description="the declared inclusive reward range [low, high] (manifest.yaml's reward.range)"
    )
    higher_is_better: bool = Field(True, description="whether a higher reward is better (reward.higher_is_better)")

    @model_validator(mode="after")
    def _ordered_range(self) -> InitEnvironmentOptions:
        if self.reward_range[0] >= self.reward_range[1]:
            raise ValueError(f"reward_range {list(self.reward_range)}: low must be below high")
        return self


def _manifest(name: str, options: InitEnvironmentOptions, dataset: dict) -> dict:
    return {
        "name": name,
        "version": "0.1.0",
        "experimental": True,
        "kind": "environment",
        "integration_profile": "custom-gym-verifier",
        "domain": options.domain,
        "description": options.description,
        "modality": "text",
        "licensing": "Apache-2.0",
        "authors": options.authors,
        "reward": {"range": list(options.reward_range), "higher_is_better": options.higher_is_better},
        "determinism": "seeded",
        "resources_server": name,
        "agent_server": "simple_agent",
        "datasets": [{k: v for k, v in dataset.items() if k != "license"}],
        "model_server": "policy_model",
        "lifecycle": "active",
    }


def _readme(name: str, description: str) -> str:
    return (
        f"# {name}\n\n{description}\n\n"
        f"The environment of the resources server `resources_servers/{name}/` (its tools and `verify`), with the rows"
        f" of `data/example.jsonl`. `manifest.yaml` is its catalog entry (`ng_list_environments +name={name}`);"
        " `config.yaml` its composition.\n\n"
        f"Start it: `gym env start --environment {name} --model-type vllm_model`, then collect rollouts with"
        f" `ng_collect_rollouts +agent_name={name}_simple_agent"
        f" +input_jsonl_fpath=environments/{name}/data/example.jsonl +output_jsonl_fpath=results/rollouts.jsonl`.\n"
    )


def init_environment(options: InitEnvironmentOptions, *, repo_root: Path = REPO_ROOT) -> Path:
    """Create `repo_root/environments/<name>/` and its resources server (module docstring). Returns the folder.

    Raises:
        ConfigError: a name that is not a Python identifier, a folder that exists already, or a manifest that breaks
            0.7.0's schema (a domain it does not know, ...); nothing is left behind then.
    """
    name = server_name(f"resources_servers/{options.name}")
    folder = repo_root / "environments" / name
    if folder.exists():
        raise ConfigError(f"{folder} exists already; not overwriting it. Choose another name or delete the folder.")
    server = init_resources_server(f"resources_servers/{name}", options.description, repo_root=repo_root)
    try:
        dataset = {
            "name": name,
            "type": "example",
            "jsonl_fpath": f"environments/{name}/data/example.jsonl",
            "num_repeats": 1,
            "license": "Apache 2.0",
        }
        config = {
            "config_paths": [f"resources_servers/{name}/configs/{name}.yaml"],
            f"{name}_simple_agent": {"responses_api_agents": {"simple_agent": {"datasets": [dataset]}}},
        }
        (folder / "data").mkdir(parents=True)
        shutil.copyfile(server / "data" / "example.jsonl", folder / "data" / "example.jsonl")
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (folder / "manifest.yaml").write_text(yaml.safe_dump(_manifest(name, options, dataset), sort_keys=False))
        (folder / "README.md").write_text(_readme(name, options.description))
        load_manifest(folder / "manifest.yaml")  # as the catalog reads it
    except (ConfigError, OSError):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(server, ignore_errors=True)
        raise
    return folder


def init_environment_main(options: InitEnvironmentOptions) -> int:
    """`ng_init_environment`: create it, print what and the next steps. Returns 0 (errors raise)."""
    folder = init_environment(options)
    name = folder.name
    print(f"Created environments/{name}/ (manifest.yaml, config.yaml, data/example.jsonl, README.md)")
    print(f"    and resources_servers/{name}/ (ng_init_resources_server's scaffold)")
    print("Next steps:")
    print(f"  ng_list_environments +name={name}")
    print(f"  gym env validate {name}      # the manifest against its config and data")
    print(f"  gym env test {name}          # its server's tests and verifier cases")
    print(f"  gym env start --environment {name} --model-type vllm_model")
    print(f"  gym env publish {name}       # once manifest.yaml names its authors")
    return 0
