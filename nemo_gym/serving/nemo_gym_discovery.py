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

from nemo_gym.config import server_sections
from nemo_gym.errors import ServerBadAnswerError

__all__ = ["add_nemo_gym_discovery_routes", "nemo_gym_discovery", "nemo_gym_head_servers"]


def _host_port(url: str) -> dict[str, Any]:
    parsed = httpx.URL(url)
    return {"host": parsed.host, "port": parsed.port or (443 if parsed.scheme == "https" else 80)}


def nemo_gym_discovery(servers: Mapping[str, dict[str, Any]], head_host: str, head_port: int) -> dict[str, Any]:
    """The config dict NeMo Gym's clients read from a head server (`/global_config_dict_yaml`), holding addresses
    only: `head_server: {host, port}` and, per instance, `{server_type: {implementation: {host, port}}}` of its
    lowest-numbered replica."""
    config: dict[str, Any] = {"head_server": {"host": head_host, "port": head_port}}
    for name, entry in servers.items():
        config[name] = {entry["server_type"]: {entry["implementation"]: _host_port(entry["url"])}}
    return config


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
    port, ...}}}`), replica 0, no run token.

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
                }
            )
    return entries
