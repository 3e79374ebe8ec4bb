"""Config loading: nesting, env.yaml, overrides, interpolation, and errors that name file and key."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import is_secret_key, load_config, mask_secrets, parse_overrides
from nemo_gym.config.server_instances import server_instances


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_overrides_all_three_forms_set_keys(tmp_path):
    loaded = load_config(["+a.b=1", "++c=[x,y]", "d=hello"], cwd=tmp_path)
    assert loaded.values == {"a": {"b": 1}, "c": ["x", "y"], "d": "hello"}


def test_nested_config_paths_env_yaml_and_override_order(tmp_path):
    write(tmp_path / "base.yaml", "x: base\ny: base\nz: base\n")
    write(tmp_path / "top.yaml", "config_paths: [base.yaml]\ny: top\nurl: ${policy_base_url}/v1\n")
    write(tmp_path / "env.yaml", "z: env\npolicy_base_url: http://127.0.0.1:9\n")
    loaded = load_config(["+config_paths=[top.yaml]", "+x=cli"], cwd=tmp_path)
    assert loaded.values["x"] == "cli"  # command line beats everything
    assert loaded.values["y"] == "top"  # a file beats the files it lists
    assert loaded.values["z"] == "env"  # env.yaml beats config files
    assert loaded.values["url"] == "http://127.0.0.1:9/v1"  # interpolation resolved
    assert loaded.origin("y").endswith("top.yaml")


def test_missing_value_names_file_key_and_fix(tmp_path):
    write(tmp_path / "c.yaml", "model:\n  api_key: ???\n")
    with pytest.raises(ConfigError) as info:
        load_config(["+config_paths=[c.yaml]"], cwd=tmp_path)
    message = str(info.value)
    assert "c.yaml" in message and "'model.api_key'" in message and "+model.api_key=" in message


def test_broken_interpolation_names_key(tmp_path):
    write(tmp_path / "c.yaml", "url: ${policy_base_url}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: key 'url'.*policy_base_url"):
        load_config(["+config_paths=[c.yaml]"], cwd=tmp_path)


def test_missing_config_file_and_cycle(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml' does not exist"):
        load_config(["+config_paths=[nope.yaml]"], cwd=tmp_path)
    write(tmp_path / "a.yaml", "config_paths: [b.yaml]\n")
    write(tmp_path / "b.yaml", "config_paths: [a.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(["+config_paths=[a.yaml]"], cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"config file '.*/b\.yml' does not exist \(did you mean 'b\.yaml'\?\)"):
        load_config(["+config_paths=[b.yml]"], cwd=tmp_path)  # a typo: the close name in its folder is named


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="not a key=value"):
        parse_overrides(["+limit"])


SERVERS = """
env_a:
  resources_servers:
    example_single_tool_call: {entrypoint: app.py}
agent_a:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: env_a}
      model_server: {type: responses_api_models, name: policy_modl}
policy_model:
  responses_api_models:
    scripted_model: {entrypoint: app.py}
"""


def test_unknown_instance_reference_suggests_the_close_name(tmp_path):
    write(tmp_path / "s.yaml", SERVERS)
    with pytest.raises(ConfigError) as info:
        server_instances(load_config(["+config_paths=[s.yaml]"], cwd=tmp_path))
    message = str(info.value)
    assert "s.yaml" in message and "agent_a.responses_api_agents.simple_agent.model_server" in message
    assert "did you mean 'policy_model'" in message


def test_unknown_server_type_and_folder(tmp_path):
    write(tmp_path / "t.yaml", "x:\n  resource_servers:\n    mcqa: {entrypoint: app.py}\n")
    with pytest.raises(
        ConfigError, match="unknown server type 'resource_servers' \\(did you mean 'resources_servers'\\?\\)"
    ):
        server_instances(load_config(["+config_paths=[t.yaml]"], cwd=tmp_path))
    write(tmp_path / "f.yaml", "x:\n  resources_servers:\n    example_single_tool_cal: {entrypoint: app.py}\n")
    with pytest.raises(ConfigError, match="did you mean 'example_single_tool_call'"):
        server_instances(load_config(["+config_paths=[f.yaml]"], cwd=tmp_path))


def test_a_key_with_two_servers_names_the_key_and_the_servers(tmp_path):
    """Two files of config_paths that each define `policy_model`, with another implementation: one error naming the
    key, its file and both servers (they merged into one key that is no server instance; the error was about a
    reference to a missing `policy_model`); also for fields given to another implementation than the defined one."""
    write(tmp_path / "a.yaml", "policy_model:\n  responses_api_models:\n    openai_model: {entrypoint: app.py}\n")
    write(tmp_path / "b.yaml", "policy_model:\n  responses_api_models:\n    vllm_model: {entrypoint: app.py}\n")
    with pytest.raises(ConfigError) as raised:
        server_instances(load_config(["+config_paths=[a.yaml,b.yaml]"], cwd=tmp_path))
    assert str(raised.value).startswith(
        f"{tmp_path / 'b.yaml'}: key 'policy_model' holds 2 servers (responses_api_models.openai_model,"
        " responses_api_models.vllm_model); a server instance has one server type and one implementation."
    )
    # fields for another implementation than the one defined: the same error
    write(tmp_path / "c.yaml", "policy_model:\n  responses_api_models:\n    vllm_model: {temperature: 0.5}\n")
    with pytest.raises(ConfigError, match="key 'policy_model' holds 2 servers"):
        server_instances(load_config(["+config_paths=[a.yaml,c.yaml]"], cwd=tmp_path))
    # templates without code to start are no server instance, as before
    write(tmp_path / "d.yaml", "t:\n  responses_api_models:\n    x: {a: 1}\n    y: {b: 2}\n")
    assert server_instances(load_config(["+config_paths=[d.yaml]"], cwd=tmp_path)) == []


def test_framework_is_ours_only_with_our_value(tmp_path):
    """`framework: nemo_gym` is ours; a value close to it is a typo, named; another is the server's own field
    (NeMo Gym 0.7.0's tales server: `framework: textworld`), left to the server."""
    section = "x:\n  resources_servers:\n    mcqa: {entrypoint: app.py, framework: %s}\n"
    for value, framework in (("nemo_gym", "nemo_gym"), ("textworld", None)):
        write(tmp_path / "f.yaml", section % value)
        [instance] = server_instances(load_config(["+config_paths=[f.yaml]"], cwd=tmp_path))
        assert instance.framework == framework
    write(tmp_path / "f.yaml", section % "nemo-gym")
    with pytest.raises(ConfigError, match=r"key 'x\.resources_servers\.mcqa\.framework': unknown framework 'nemo-gym'"):
        server_instances(load_config(["+config_paths=[f.yaml]"], cwd=tmp_path))


def test_valid_instances(tmp_path):
    write(tmp_path / "s.yaml", SERVERS.replace("policy_modl", "policy_model"))
    instances = server_instances(load_config(["+config_paths=[s.yaml]"], cwd=tmp_path))
    assert [(i.name, i.server_type, i.implementation) for i in instances] == [
        ("env_a", "resources_servers", "example_single_tool_call"),
        ("agent_a", "responses_api_agents", "simple_agent"),
        ("policy_model", "responses_api_models", "scripted_model"),
    ]


def test_secret_masking():
    values = {
        "policy_api_key": "sk-1",
        "hf_token": "t",
        "nested": [{"password": "p", "max_output_tokens": 8, "apiKey": "k"}],
        "key_count": 3,
    }
    assert mask_secrets(values) == {
        "policy_api_key": "****",
        "hf_token": "****",
        "nested": [{"password": "****", "max_output_tokens": 8, "apiKey": "****"}],
        "key_count": "****",
    }
    assert not is_secret_key("monkey") and not is_secret_key("tokens_per_s")


@pytest.mark.long
def test_every_yaml_in_the_tree_loads():
    """Each YAML under configs/ and the server folders loads, resolves and names only existing servers
    (a server YAML that leaves `policy_model` to a model YAML is composed with the scripted model's)."""
    paths = sorted(REPO_ROOT.glob("configs/*.yaml")) + sorted(REPO_ROOT.glob("*/*/configs/*.yaml"))
    assert paths
    values = ["+policy_base_url=http://127.0.0.1:1/v1", "+policy_api_key=x", "+policy_model_name=m"]
    scripted = REPO_ROOT / "responses_api_models/scripted_model/configs/scripted_model.yaml"
    for path in paths:
        first = path.read_text().lstrip().splitlines()[0]
        assert first.startswith("#"), f"{path}: the first line must be a comment with the command that runs it"
        if "???" in path.read_text():  # a value left to the command line (an agent's resources server): its command
            command = shlex.split(first.lstrip("# "))
            assert command[0] == "ng_run", f"{path}: the first line must be the ng_run command that sets its ???"
            server_instances(load_config([*command[1:], *values], cwd=REPO_ROOT), check_dirs=True)
            continue
        loaded = load_config([f"+config_paths=[{path}]", *values])
        if "policy_model" not in loaded.values:
            loaded = load_config([f"+config_paths=[{path},{scripted}]", *values])
        server_instances(loaded, check_dirs=True)


def test_an_override_sets_an_item_of_a_files_list(tmp_path):
    """`generators.0.size=5` changes one item of the file's list; it used to replace the list by a dict and crash."""
    path = tmp_path / "tasks.yaml"
    path.write_text("generators:\n  - {name: a, size: 25}\n  - {name: b, size: 25}\n")
    values = load_config([f"+config_paths=[{path}]", "++generators.1.size=5", "+other.0=x"], cwd=tmp_path).values
    assert values["generators"] == [{"name": "a", "size": 25}, {"name": "b", "size": 5}]
    assert values["other"] == {"0": "x"}  # not a list in any file: a key as before
    with pytest.raises(
        ConfigError, match=r"key 'generators\.2\.size': list index out of range \(a list's items are numbered from 0\)"
    ):
        load_config([f"+config_paths=[{path}]", "++generators.2.size=5"], cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"key 'generators\.b\.size'"):
        load_config([f"+config_paths=[{path}]", "++generators.b.size=5"], cwd=tmp_path)
