"""NeMo Gym 0.7.0's config directives (`nemo_gym.config.directives`) through `load_config`: `_inherit_from` (a move,
with the target's keys merged over the source), `_copy`, their `${inherit_from:...}` / `${copy:...}` string forms,
`_delete_key`, an agent moved to a new name retargeting the environment servers that named it, config files that
include others by a path from their tree's root (0.7.0's example_single_tool_call_single_agent_turn.yaml, below), a
nested server folder's config, and errors that name the file and the key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from nemo_gym_peer07 import peer07_env, peer07_site_packages, peer07_venv

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


def test_a_nested_server_folders_config_names_its_trees_folders(tmp_path):
    """A config inside a nested server folder (0.7.0's `responses_api_agents/conversational_tool_use/
    domain_generation/configs/`, its text as in the wheel) loads: each instance runs from the folder of the tree
    it names, the nested agent and the environment server alike (it failed with 'no folder
    responses_api_agents/conversational_tool_use/domain_generation'), as does a config one folder below
    `configs/`."""
    root = tmp_path / "ng07"
    nested = root / "responses_api_agents/conversational_tool_use/domain_generation"
    write(nested / "app.py", "from nemo_gym.base_responses_api_agent import x\n")
    write(root / "environment_servers/legacy_agent/app.py", "from nemo_gym.base_environment_server import x\n")
    config = write(
        nested / "configs/conversational_tool_use_domain_generation.yaml",
        "conversational_tool_use_domain_generation:\n  responses_api_agents:\n"
        "    conversational_tool_use/domain_generation:\n      entrypoint: app.py\n"
        "      model_server: {type: responses_api_models, name: domain_generation_model}\n"
        "domain_generation_model:\n  _copy: policy_model\n"
        "conversational_tool_use_domain_generation_environment_server:\n  environment_servers:\n"
        "    legacy_agent:\n      entrypoint: app.py\n"
        "      agent_server: {type: responses_api_agents, name: conversational_tool_use_domain_generation}\n",
    )
    policy = "+policy_model.responses_api_models.openai_model.entrypoint=app.py"
    instances = {i.name: i for i in server_instances(load_config([f"+config_paths=[{config}]", policy]))}
    assert instances["conversational_tool_use_domain_generation"].implementation_dir == nested
    env = instances["conversational_tool_use_domain_generation_environment_server"]
    assert env.implementation_dir == root / "environment_servers" / "legacy_agent"
    # a config one folder below configs/ (0.7.0's responses_api_models/local_vllm_model/configs/Qwen/<file>.yaml)
    model = root / "responses_api_models/local_vllm_model"
    write(model / "app.py", "from nemo_gym.base_responses_api_model import x\n")
    deeper = write(
        model / "configs/Qwen/q.yaml", "qwen:\n  responses_api_models:\n    local_vllm_model: {entrypoint: app.py}\n"
    )
    assert [i.implementation_dir for i in server_instances(load_config([f"+config_paths=[{deeper}]"]))] == [model]


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


# NeMo Gym 0.7.0's own config parser (`GlobalConfigDictParser.parse`, offline, no env.yaml) over the server config
# files of its wheel: file -> the server instances, or "error: <its exception's class>"
PARSE_07 = """
import contextlib, io, json, sys
from omegaconf import OmegaConf
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
root, initial, files = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
server_types = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
out = {}
for name in files:
    parse = GlobalConfigDictParserConfig(initial_global_config_dict=OmegaConf.create({**initial, "config_paths":
        [f"{root}/{name}"]}), skip_load_from_cli=True, skip_load_from_dotenv=True, offline=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            config = GlobalConfigDictParser().parse(parse)
        out[name] = sorted(k for k, v in config.items() if OmegaConf.is_dict(v) and any(t in v for t in server_types))
    except Exception as exc:
        out[name] = "error: " + type(exc).__name__
print(json.dumps(out))
"""
# the policy model every file's agents name, as 0.7.0's env.yaml gives it
POLICY = {
    "policy_base_url": "http://127.0.0.1:9/v1",
    "policy_api_key": "unused",
    "policy_model_name": "m",
    "policy_model": {"responses_api_models": {"openai_model": {"entrypoint": "app.py", "openai_base_url":
        "${policy_base_url}", "openai_api_key": "${policy_api_key}", "openai_model": "${policy_model_name}"}}},
}  # fmt: skip
# the files whose verdicts differ, and why (0.7.0.whl's files; any other difference fails the test)
EARLIER_ERROR = "ours refuses it before any server starts; 0.7.0's parser takes it and the run fails later"
DIFFERENT = {
    **{
        f"resources_servers/ns_tools/configs/ns_tools_{tool}.yaml": f"{EARLIER_ERROR}: no folder ns_tools_{tool}"
        for tool in ("arxiv", "coolprop", "particle", "periodictable", "radioactivedecay", "wikipedia")
    },
    "resources_servers/ns_tools/configs/ns_tools.yaml": f"{EARLIER_ERROR}: a reference to a missing instance",
    "responses_api_agents/image_tools_agent/configs/image_tools_agent.yaml": f"{EARLIER_ERROR}: the same",
    "responses_api_agents/harbor_agent/configs/harbor_agent_opensandbox.yaml": f"{EARLIER_ERROR}: an unset ${{oc.env}}",
    "responses_api_agents/vcqa_agent/configs/vcqa_agent.yaml": f"{EARLIER_ERROR}: the same (HF_TOKEN)",
    "resources_servers/legal_agent_bench/configs/legal_agent_bench.yaml": "an entrypoint outside its folder: refused",
    **{
        path: "an overlay (fields without an entrypoint) for a server another file defines: 0.7.0 counts it"
        for path in (
            "resources_servers/gdpval/configs/gdpval_kimi_local_judge.yaml",
            "resources_servers/gdpval/configs/gdpval_minimax_multistage_judge.yaml",
            "resources_servers/gdpval/configs/gdpval_minimax_selfhosted_judge.yaml",
            "resources_servers/math_with_autograder/configs/math_with_autograder_nemotron3ultra.yaml",
            "resources_servers/math_with_judge/configs/math_with_local_judge.yaml",
        )
    },
    "resources_servers/asr_with_pc/configs/asr_with_pc.yaml": "0.7.0 checks model pairings (ours: not)",
    "resources_servers/spartqa/configs/spartqa.yaml": "0.7.0 checks its manifest fields (`domain: other`)",
}


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(600)
def test_every_server_config_of_0_7_0_loads_as_0_7_0_loads_it(tmp_path):
    """Each server config file of NeMo Gym 0.7.0's wheel (`<server type>/**/configs/**/*.yaml`, 383), alone with
    the policy model: our loader and 0.7.0's own parser agree whether it loads, and on its server instances when it
    does, but for the files of DIFFERENT, each with why. Among those that agree: the nested servers' configs
    (`responses_api_agents/conversational_tool_use/domain_generation/configs/`, `local_vllm_model/configs/Qwen/`)
    and the ones that define `policy_model` again with another implementation (both refuse them)."""
    site = peer07_site_packages()
    files = sorted(
        str(path.relative_to(site))
        for server_type in ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
        for path in (site / server_type).glob("**/configs/**/*.yaml")
    )
    assert len(files) > 350
    done = subprocess.run(
        [str(peer07_venv() / "bin" / "python"), "-c", PARSE_07, str(site), json.dumps(POLICY), *files],
        capture_output=True, text=True, timeout=500, cwd=tmp_path, env=peer07_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout)
    policy = write(tmp_path / "policy.yaml", yaml.safe_dump(POLICY))
    ours = {}
    for name in files:
        try:
            ours[name] = sorted(
                i.name for i in server_instances(load_config([f"+config_paths=[{policy},{site / name}]"]))
            )
        except ConfigError:
            ours[name] = "error"
    differ = {
        name
        for name in files
        if isinstance(theirs[name], list) != isinstance(ours[name], list)
        or (isinstance(ours[name], list) and ours[name] != theirs[name])
    }
    assert differ == set(DIFFERENT), {name: (theirs[name], ours[name]) for name in differ ^ set(DIFFERENT)}
    assert sum(isinstance(theirs[name], list) and isinstance(ours[name], list) for name in files) > 220
    for name in (
        "responses_api_agents/conversational_tool_use/domain_generation/configs/"
        "conversational_tool_use_domain_generation.yaml",
        "responses_api_models/local_vllm_model/configs/Qwen/Qwen3-30B-A3B-Instruct-2507.yaml",
    ):
        assert isinstance(ours[name], list) and ours[name] == theirs[name], name
    assert ours["responses_api_models/vllm_model/configs/vllm_model.yaml"] == "error"
    assert theirs["responses_api_models/vllm_model/configs/vllm_model.yaml"].startswith("error: ")
