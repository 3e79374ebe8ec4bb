"""NVIDIA NeMo Gym's discovery of a run's servers, both sides: the routes our head server adds for NeMo Gym's
clients (`GET /global_config_dict_yaml`, `GET /server_instances`: addresses only, never another config value, never
a secret) and the reading of NeMo Gym's head server's `/global_config_dict_yaml` by our client
(`ServerClient.list_servers`, when that head server has no `/servers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import yaml
from fastapi import FastAPI, Request

from nemo_gym.common.errors import ServerBadAnswerError
from nemo_gym.config import server_sections
from nemo_gym.config.server_instances import references

__all__ = [
    "add_nemo_gym_discovery_routes",
    "agent_references",
    "dataset_agent_pins",
    "registration_links",
    "nemo_gym_discovery",
    "nemo_gym_head_servers",
]


def agent_references(fields: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """An environment server's references to agent instances, by field (NeMo Gym 0.7.0's rule,
    `environment_server_agent_names`: a field `agent_server`, or any field `{type: responses_api_agents, name}`):
    `{field: {"type": "responses_api_agents", "name": ...}}`."""
    return {
        key: {"type": AGENT_TYPE, "name": str(value["name"])}
        for key, value in fields.items()
        if isinstance(value, Mapping)
        and "name" in value
        and (value.get("type") == AGENT_TYPE or (key == "agent_server" and value.get("type") is None))
    }


def dataset_agent_pins(fields: Mapping[str, Any]) -> list[str]:
    """The agents a server's datasets pin (NeMo Gym 0.7.0's dataset key `agent:`, `dataset_agent_pins`): each
    distinct string, in the order its `datasets` declare them. Instance names only; `[]` without pins."""
    datasets = fields.get("datasets")
    pins: list[str] = []
    for dataset in datasets if isinstance(datasets, list) else ():
        pin = dataset.get("agent") if isinstance(dataset, Mapping) else None
        if isinstance(pin, str) and pin not in pins:
            pins.append(pin)
    return pins


def registration_links(fields: Mapping[str, Any]) -> dict[str, Any]:
    """What a server's head-server entry says of the instances its config names: `references` (every `{type, name}`
    reference, `nemo_gym.config.server_instances.references`) and `dataset_agent_pins` (`dataset_agent_pins`), for
    every source of entries (our servers, the NeMo Gym servers our ng_run registers, a 0.7.0 head server's config)."""
    return {"references": references(fields), "dataset_agent_pins": dataset_agent_pins(fields)}


def _host_port(url: str) -> dict[str, Any]:
    parsed = httpx.URL(url)
    return {"host": parsed.host, "port": parsed.port or (443 if parsed.scheme == "https" else 80)}


def nemo_gym_discovery(servers: Mapping[str, dict[str, Any]], head_host: str, head_port: int) -> dict[str, Any]:
    """The config dict NeMo Gym's clients read from a head server (`/global_config_dict_yaml`), holding addresses
    only: `head_server: {host, port}` and, per instance, `{server_type: {implementation: {host, port}}}` of its
    lowest-numbered replica; an environment server (NeMo Gym 0.7.0) also with its agent references (`agent_refs`
    of its registration: instance names, no other value).

    NeMo Gym 0.7.0's collector reaches an agent only through an environment server that references it, and its
    ng_run generates a `legacy_agent` relay (`/run` and `/aggregate_metrics` passed through unchanged) for each agent
    without one. Here such an agent gets that relay's entry, named by 0.7.0's rule (`legacy_environment_server_name`:
    `mcqa_simple_agent` -> `mcqa_environment_server`), at the agent's own address: the agent answers what the relay
    would pass on, without another process."""
    config: dict[str, Any] = {"head_server": {"host": head_host, "port": head_port}}
    fronted = set()
    for name, entry in servers.items():
        refs = entry.get("agent_refs") or {}
        fronted |= {ref["name"] for ref in refs.values()}
        config[name] = {entry["server_type"]: {entry["implementation"]: {**_host_port(entry["url"]), **refs}}}
    for name, entry in servers.items():
        if entry["server_type"] == AGENT_TYPE and name not in fronted:
            relay = _relay_name(name, entry["implementation"], config)
            config[relay] = {
                "environment_servers": {
                    "legacy_agent": {**_host_port(entry["url"]), "agent_server": {"type": AGENT_TYPE, "name": name}}
                }
            }
    return config


AGENT_TYPE = "responses_api_agents"
RELAY_SUFFIX = "_environment_server"


def _relay_name(agent: str, implementation: str, taken: Mapping[str, Any]) -> str:
    """NeMo Gym 0.7.0's name for an agent's generated relay (global_config.legacy_environment_server_name): the agent
    name without its implementation (else without `_agent`) plus `_environment_server`; `<agent>_environment_server`
    when that is taken, then the suffix again until free."""
    stem = agent.removesuffix(f"_{implementation}").removesuffix(implementation).rstrip("_")
    if stem == agent:
        stem = agent.removesuffix("_agent").rstrip("_")
    name = f"{stem or implementation}{RELAY_SUFFIX}"
    if name in taken:
        name = f"{agent}{RELAY_SUFFIX}"
    while name in taken:
        name += RELAY_SUFFIX
    return name


def add_nemo_gym_discovery_routes(app: FastAPI) -> None:
    """Add NeMo Gym's discovery routes to the head server `app`, answered from its registry `app.state.servers`
    (instance name → registration of its lowest-numbered replica)."""

    @app.get("/global_config_dict_yaml")
    async def global_config_dict_yaml(request: Request) -> str:
        """NeMo Gym's discovery answer (a JSON string holding YAML): the head server and each instance's address."""
        return yaml.safe_dump(
            nemo_gym_discovery(app.state.servers, request.url.hostname or "127.0.0.1", request.url.port or 80),
            sort_keys=False,
        )

    @app.get("/server_instances")
    async def server_instances() -> list[dict]:
        """NeMo Gym's list of server instances: addresses only."""
        return [
            {
                "process_name": name,
                "server_type": entry["server_type"],
                "name": entry["implementation"],
                **_host_port(entry["url"]),
                "url": entry["url"],
            }
            for name, entry in app.state.servers.items()
        ]


def nemo_gym_head_servers(answer: Any, head_url: str) -> list[dict[str, Any]]:
    """`GET /servers`-shaped entries from the `/global_config_dict_yaml` answer of NVIDIA NeMo Gym's head server (a
    JSON string holding the run's config as YAML): one per server instance (`{server_type: {implementation: {host,
    port, ...}}}`), replica 0, no run token; an environment server's with its `agent_refs` (`agent_references`).

    Raises:
        ServerBadAnswerError: the answer is not such a YAML mapping.
    """
    try:
        config = yaml.safe_load(answer) if isinstance(answer, str) else answer
    except yaml.YAMLError as exc:
        raise ServerBadAnswerError(f"GET {head_url}/global_config_dict_yaml: not YAML ({exc})", server="head") from None
    if not isinstance(config, dict):
        raise ServerBadAnswerError(
            f"GET {head_url}/global_config_dict_yaml: expected a YAML mapping of server instances, got"
            f" {type(config).__name__}",
            server="head",
        )
    entries = []
    for name, server_type, implementation, fields in server_sections(config):
        if fields.get("host") and fields.get("port"):
            host = str(fields["host"])
            url = f"http://[{host}]:{fields['port']}" if ":" in host else f"http://{host}:{fields['port']}"
            entries.append(
                {
                    "name": str(name),
                    "replica": 0,
                    "server_type": str(server_type),
                    "implementation": str(implementation),
                    "url": url,
                    "send_run_token": False,
                    "framework": "nemo_gym",
                    **registration_links(fields),
                    **(
                        {"agent_refs": refs}
                        if server_type == "environment_servers" and (refs := agent_references(fields))
                        else {}
                    ),
                }
            )
    return entries
