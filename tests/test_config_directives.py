"""NeMo Gym 0.7.0's config directives (`nemo_gym.config.directives`) through `load_config`: `_inherit_from` (a move,
with the target's keys merged over the source), `_copy`, their `${inherit_from:...}` / `${copy:...}` string forms,
`_delete_key`, an agent moved to a new name retargeting the environment servers that named it, config files that
include others by a path from their tree's root (0.7.0's example_single_tool_call_single_agent_turn.yaml, below), and
errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load(path: Path, *overrides: str) -> dict:
    return load_config([f"+config_paths=[{path}]", *overrides]).values


def test_inherit_from_moves_and_merges(tmp_path):
    config = write(
        tmp_path / "c.yaml",
        "template:\n  x: 1\n  y: {a: 1, b: 2}\n"
        "mine:\n  _inherit_from: template\n  y: {b: 3}\n  z: 4\n"
        "kept:\n  x: 5\n"
        "copied:\n  _copy: kept\n  w: 6\n"
        "by_string: ${copy:template.y}\n",
    )
    values = load(config)
    assert "template" not in values  # moved
    assert values["mine"] == {"x": 1, "y": {"a": 1, "b": 3}, "z": 4}
    assert values["kept"] == {"x": 5} and values["copied"] == {"x": 5, "w": 6}
    assert values["by_string"] == {"a": 1, "b": 2}  # from the config before any directive ran


def test_directives_leave_a_lists_values_unresolved(tmp_path):
    """A list item naming a value the config does not define yet (a run-time `${policy_model_name}`, as 0.7.0's
    lmarena configs do) is left as written by an unresolved load (the directives walk the list's nodes)."""
    config = write(tmp_path / "c.yaml", "judges:\n  - ${policy_model_name}\n  - {y: {_copy: base}}\nbase: {x: 1}\n")
    values = load_config([f"+config_paths=[{config}]"], resolve=False).values
    assert values["judges"] == ["${policy_model_name}", {"y": {"x": 1}}]


def test_a_key_may_inherit_from_one_that_comes_after_it(tmp_path):
    config = write(tmp_path / "c.yaml", "mine:\n  _inherit_from: template\n  y: 2\ntemplate:\n  x: 1\n  y: 1\n")
    values = load(config)
    assert values["mine"] == {"x": 1, "y": 2} and "template" not in values


def test_delete_key_after_an_inherit(tmp_path):
    config = write(
        tmp_path / "c.yaml",
        "template:\n  x: 1\n  y: 2\n  z: 3\nmine:\n  _inherit_from: template\n  _delete_key: 'y, z'\n  w: 4\n",
    )
    assert load(config)["mine"] == {"x": 1, "w": 4}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mine:\n  _inherit_from: nowhere.at_all\n", r"c\.yaml: key 'mine': the path 'nowhere\.at_all' it inherits"),
        ("a: {x: 1}\nmine:\n  _copy: a\n  _delete_key: y\n", r"c\.yaml: key 'mine': _delete_key names 'y'"),
        ("mine: ${inherit_from:nothing}\n", r"c\.yaml: key 'mine': the path 'nothing'"),
    ],
)
def test_bad_directives_name_the_file_and_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path / "c.yaml", text))


def nemo_gym_07_tree(root: Path) -> Path:
    """The files of NeMo Gym 0.7.0's single-agent-turn example that matter here (their config text as in the wheel)."""
    (root / "nemo_gym-0.7.0.dist-info").mkdir(parents=True)
    for folder in ("resources_servers/example_single_tool_call", "responses_api_agents/simple_agent"):
        write(root / folder / "app.py", "from nemo_gym.base_resources_server import x\n")
    write(
        root / "environment_servers/single_agent_turn_legacy/app.py", "from nemo_gym.base_environment_server import x\n"
    )
    write(
        root / "environment_servers/single_agent_turn_legacy/configs/single_agent_turn_legacy.yaml",
        "single_agent_turn_legacy:\n  environment_servers:\n    single_agent_turn_legacy:\n      entrypoint: app.py\n"
        "      resources_server:\n        type: resources_servers\n        name: ???\n"
        "      agent_server:\n        type: responses_api_agents\n        name: ???\n"
        "      default_episode_timeout_seconds: 21600\n",
    )
    return write(
        root / "resources_servers/example_single_tool_call/configs/example_single_tool_call_single_agent_turn.yaml",
        "config_paths:\n  - environment_servers/single_agent_turn_legacy/configs/single_agent_turn_legacy.yaml\n"
        "example_single_tool_call:\n  resources_servers:\n    example_single_tool_call:\n      entrypoint: app.py\n"
        "example_single_tool_call_session_agent:\n  responses_api_agents:\n"
        "    simple_agent:\n      entrypoint: app.py\n"
        "      resources_server: {type: resources_servers, name: example_single_tool_call}\n"
        "example_single_tool_call_single_agent_turn:\n  _inherit_from: single_agent_turn_legacy\n"
        "  environment_servers:\n    single_agent_turn_legacy:\n"
        "      resources_server: {type: resources_servers, name: example_single_tool_call}\n"
        "      agent_server: {type: responses_api_agents, name: example_single_tool_call_session_agent}\n"
        "      resources_tool_transports: [direct_http]\n",
    )


def test_nemo_gym_07s_single_agent_turn_config_loads(tmp_path):
    """Its file includes the environment server's template by a path from the tree's root and `_inherit_from`s it:
    three instances, the template gone, every `???` filled, each instance from the tree's folders."""
    root = tmp_path / "ng07"
    config = nemo_gym_07_tree(root)
    instances = {i.name: i for i in server_instances(load_config([f"+config_paths=[{config}]"]))}
    assert set(instances) == {
        "example_single_tool_call",
        "example_single_tool_call_session_agent",
        "example_single_tool_call_single_agent_turn",
    }
    env = instances["example_single_tool_call_single_agent_turn"]
    assert env.implementation_dir == root / "environment_servers" / "single_agent_turn_legacy"
    assert env.fields["agent_server"]["name"] == "example_single_tool_call_session_agent"
    assert env.fields["default_episode_timeout_seconds"] == 21600
    assert env.fields["resources_tool_transports"] == ["direct_http"]


def test_an_agent_moved_to_a_new_name_is_renamed_in_its_environment_server(tmp_path):
    config = write(
        tmp_path / "c.yaml",
        "agent:\n  responses_api_agents:\n    simple_agent: {entrypoint: app.py}\n"
        "env:\n  environment_servers:\n    legacy_agent:\n"
        "      agent_server: {type: responses_api_agents, name: agent}\n"
        "renamed:\n  _inherit_from: agent\n",
    )
    values = load(config)
    assert "agent" not in values and values["env"]["environment_servers"]["legacy_agent"]["agent_server"] == {
        "type": "responses_api_agents",
        "name": "renamed",
    }
    twice = write(
        tmp_path / "twice.yaml", config.read_text() + "again:\n  _copy: renamed\nthird:\n  _inherit_from: agent\n"
    )
    with pytest.raises(ConfigError, match=r"key 'env': it names agent 'agent', which was inherited into several names"):
        load(twice)
