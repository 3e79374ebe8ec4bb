"""`--reuse-verifier NAME` of `gym env init --environment/--benchmark` (NeMo Gym 0.7.0's `reuse_verifier`): the
workload is graded by an existing resources server, `resources_servers/NAME/`, instead of a scaffolded one.

The server's config, `resources_servers/NAME/configs/NAME.yaml` (under the scaffold's root, else this repository), must
hold what 0.7.0 requires of a reused verifier: exactly one resources server instance, of implementation NAME; no
model server; at most one agent, a `simple_agent` that names that resources server instance. The workload's config
then names that file (`config_paths`) and takes the bundled agent under its own name with `_inherit_from` (a move, as
0.7.0's configs that reuse a scorer do: another workload reusing the same server in one run keeps its own), its
datasets replaced by the workload's; without a bundled agent it declares a `simple_agent` of its own. The server's
example rows (`data/example.jsonl`) are the workload's first rows: they are the rows its verify reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import did_you_mean, server_sections

__all__ = ["ReusedVerifier", "reused_verifier"]


@dataclass(frozen=True)
class ReusedVerifier:
    """A resources server a scaffolded workload reuses (module docstring)."""

    name: str  # its implementation: resources_servers/<name>/
    config_reference: str  # resources_servers/<name>/configs/<name>.yaml, as config_paths names it
    resource_instance: str
    agent_instance: str | None  # the simple_agent its config bundles, if any
    examples: Path  # its data/example.jsonl

    def agent_entry(self, dataset: dict[str, Any]) -> dict[str, Any]:
        """The workload's agent instance in its config.yaml, running `dataset`."""
        if self.agent_instance is not None:
            return {
                "_inherit_from": self.agent_instance,
                "responses_api_agents": {"simple_agent": {"datasets": [dataset]}},
            }
        agent = {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": self.resource_instance},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            "datasets": [dataset],
        }
        return {"responses_api_agents": {"simple_agent": agent}}


def _entries(raw: dict[str, Any], server_type: str) -> list[tuple[str, str, dict[str, Any]]]:
    """`(instance, implementation, fields)` of each top-level section of `server_type` in a config file."""
    return [(name, impl, fields) for name, kind, impl, fields in server_sections(raw) if kind == server_type]


def reused_verifier(name: str, root: Path) -> ReusedVerifier:
    """The resources server `name` a workload scaffolded under `root` reuses (module docstring).

    Raises:
        ConfigError: no such server config under `root` or this repository (the closest folder name suggested), or
            one that breaks a rule of the module docstring, naming the file and the rule.
    """
    reference = f"resources_servers/{name}/configs/{name}.yaml"
    candidates = list(dict.fromkeys((base / reference).resolve() for base in (root, REPO_ROOT)))
    path = next((candidate for candidate in candidates if candidate.is_file()), None)
    if path is None:
        known = {p.parent.name for base in (root, REPO_ROOT) for p in (base / "resources_servers").glob("*/configs")}
        raise ConfigError(
            f"--reuse-verifier {name}: no {reference} under {' or '.join(str(c.parents[3]) for c in candidates)}"
            f"{did_you_mean(name, known)}"
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"--reuse-verifier {name}: cannot read {path}: {exc}") from None
    raw = raw if isinstance(raw, dict) else {}
    resources = _entries(raw, "resources_servers")
    if len(resources) != 1 or resources[0][1] != name:
        raise ConfigError(
            f"--reuse-verifier {name}: {path} must declare exactly one resources server instance, of {name}"
            f" (it declares {[f'{i} ({impl})' for i, impl, _ in resources]})"
        )
    if _entries(raw, "responses_api_models"):
        raise ConfigError(f"--reuse-verifier {name}: {path} declares a model server; a reused verifier may not")
    [(resource_instance, _, _)] = resources
    agents = _entries(raw, "responses_api_agents")
    if len(agents) > 1 or (agents and agents[0][1] != "simple_agent"):
        raise ConfigError(f"--reuse-verifier {name}: {path} may declare one agent at most, a simple_agent")
    agent_instance = None
    if agents:
        agent_instance, _, fields = agents[0]
        reference_of_agent = fields.get("resources_server")
        if not isinstance(reference_of_agent, dict) or reference_of_agent.get("name") != resource_instance:
            raise ConfigError(
                f"--reuse-verifier {name}: {path}: its simple_agent {agent_instance} must name the resources server"
                f" instance {resource_instance}"
            )
    examples = path.parent.parent / "data" / "example.jsonl"
    if not examples.is_file():
        raise ConfigError(f"--reuse-verifier {name}: {examples} is missing: its rows are the workload's first rows")
    return ReusedVerifier(name, reference, resource_instance, agent_instance, examples)
