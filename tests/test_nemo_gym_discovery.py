"""What our head server tells NeMo Gym's clients (`nemo_gym.serving.nemo_gym_discovery`): addresses, and for NeMo Gym
0.7.0's collector the environment server in front of each agent. Against NeMo Gym's own collectors: tests marked peer
(tests/test_nemo_gym_interop.py for 0.4.0, tests/test_nemo_gym07.py for 0.7.0)."""

from __future__ import annotations

import yaml

from nemo_gym.serving.nemo_gym_discovery import agent_references, nemo_gym_discovery, nemo_gym_head_servers


def entry(server_type: str, implementation: str, port: int, **extra) -> dict:
    return {"server_type": server_type, "implementation": implementation, "url": f"http://127.0.0.1:{port}", **extra}


def test_each_agent_without_an_environment_server_gets_a_relay_entry_at_its_own_address():
    """NeMo Gym 0.7.0's collector reaches an agent only through an environment server naming it; its ng_run generates
    a legacy_agent relay for each agent without one, named by its rule: `mcqa_simple_agent` -> `mcqa_environment_server`
    (the agent type stripped), `weather_agent` -> `weather_environment_server` (`_agent` stripped), and
    `<agent>_environment_server` when that name is taken. An agent a real environment server fronts gets none."""
    servers = {
        "policy_model": entry("responses_api_models", "openai_model", 1),
        "mcqa": entry("resources_servers", "mcqa", 2),
        "mcqa_simple_agent": entry("responses_api_agents", "simple_agent", 3),
        "weather_agent": entry("responses_api_agents", "simple_agent", 4),
        "code_agent": entry("responses_api_agents", "simple_agent", 5),
        "code_environment_server": entry("resources_servers", "code_gen", 6),  # a name a relay would take
        "fronted_agent": entry("responses_api_agents", "simple_agent", 7),
        "real_env": entry(
            "environment_servers",
            "single_agent_turn",
            8,
            agent_refs={"agent_server": {"type": "responses_api_agents", "name": "fronted_agent"}},
        ),
    }
    config = nemo_gym_discovery(servers, "127.0.0.1", 11000)

    def relay(name: str) -> dict:
        return config[name]["environment_servers"]["legacy_agent"]

    assert relay("mcqa_environment_server") == {
        "host": "127.0.0.1",
        "port": 3,
        "agent_server": {"type": "responses_api_agents", "name": "mcqa_simple_agent"},
    }
    assert relay("weather_environment_server")["agent_server"]["name"] == "weather_agent"
    assert relay("code_agent_environment_server") == {
        "host": "127.0.0.1",
        "port": 5,
        "agent_server": {"type": "responses_api_agents", "name": "code_agent"},
    }
    assert config["real_env"]["environment_servers"]["single_agent_turn"]["agent_server"]["name"] == "fronted_agent"
    assert not [name for name in config if name.startswith("fronted_agent") and name != "fronted_agent"]
    assert config["policy_model"] == {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 1}}}
    assert len(config) == len(servers) + 1 + 3  # head_server, three relays


def test_nemo_gym_07s_head_answer_read_back_gives_environment_servers_their_agents():
    """Our client reading a NeMo Gym 0.7.0 head (`nemo_gym_head_servers`: its `/global_config_dict_yaml`, here the
    one our head writes) gets each environment server with its agent references, by 0.7.0's rule (a field
    `agent_server`, typed or not, or any field `{type: responses_api_agents, name}`; a resources server reference is
    none), so our collector sends a row for an environment server as 0.7.0's does (`nemo_gym.collect.routing`)."""
    config = {
        "head_server": {"host": "127.0.0.1", "port": 11000},
        "env": {
            "environment_servers": {
                "single_agent_turn_legacy": {
                    "host": "127.0.0.1",
                    "port": 8,
                    "resources_server": {"type": "resources_servers", "name": "weather"},
                    "agent_server": {"name": "weather_agent"},
                }
            }
        },
        "weather_agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": 3}}},
    }
    entries = {e["name"]: e for e in nemo_gym_head_servers(yaml.safe_dump(config), "http://127.0.0.1:11000")}
    assert entries["env"]["agent_refs"] == {"agent_server": {"type": "responses_api_agents", "name": "weather_agent"}}
    assert entries["env"]["url"] == "http://127.0.0.1:8" and "agent_refs" not in entries["weather_agent"]
    assert agent_references({"judge": {"type": "responses_api_agents", "name": "a"}, "x": {"name": "b"}}) == {
        "judge": {"type": "responses_api_agents", "name": "a"}
    }
