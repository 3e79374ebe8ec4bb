"""`detect_framework` recognises a server folder written for NVIDIA NeMo Gym also when its entrypoint reaches NeMo
Gym's base classes through another server folder of its tree, as NeMo Gym 0.4.0's gpqa_diamond does
(`from resources_servers.mcqa.app import ...`, and no `nemo_gym` import of its own) and bunsenbench_chemistry_mcq
(whose only `nemo_gym` import, `nemo_gym.upstream.reward_profile`, is a module name ours has too). Before, such a folder
was taken for one of ours: ng_run tried to build it an environment of ours from its `-e nemo-gym[dev] @ ../../` line
and stopped."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.upstream.detect import FRAMEWORK, detect_framework


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def nemo_gym_tree(root: Path) -> Path:
    """A NeMo Gym-style tree: mcqa written against NeMo Gym's base classes; returns the tree root."""
    write(
        root / "resources_servers" / "mcqa" / "app.py",
        "from nemo_gym.base_resources_server import SimpleResourcesServer\n",
    )
    return root


def test_a_folder_importing_a_nemo_gym_sibling_is_nemo_gym(tmp_path):
    root = nemo_gym_tree(tmp_path)
    write(
        root / "resources_servers" / "gpqa" / "app.py",
        "import re\nfrom resources_servers.mcqa.app import SimpleResourcesServer\n",
    )
    write(
        root / "resources_servers" / "bunsen" / "app.py",
        "from nemo_gym.upstream.reward_profile import x\nfrom resources_servers.mcqa import app\n",
    )
    write(root / "resources_servers" / "chain" / "app.py", "import resources_servers.gpqa.app\n")
    for name in ("mcqa", "gpqa", "bunsen", "chain"):
        assert detect_framework(root / "resources_servers" / name, "app.py") == FRAMEWORK, name


def test_a_folder_importing_only_our_modules_or_our_siblings_is_ours(tmp_path):
    root = nemo_gym_tree(tmp_path)
    write(
        root / "resources_servers" / "own" / "app.py",
        "from nemo_gym.env import ResourcesServer\nfrom nemo_gym.upstream.reward_profile import x\n",
    )
    write(root / "resources_servers" / "uses_own" / "app.py", "from resources_servers.own.app import ResourcesServer\n")
    write(root / "resources_servers" / "cycle_a" / "app.py", "from resources_servers.cycle_b.app import B\n")
    write(root / "resources_servers" / "cycle_b" / "app.py", "from resources_servers.cycle_a.app import A\n")
    write(root / "resources_servers" / "missing" / "app.py", "from resources_servers.nowhere.app import A\n")
    for name in ("own", "uses_own", "cycle_a", "missing"):
        assert detect_framework(root / "resources_servers" / name, "app.py") is None, name


def test_no_server_folder_of_this_repository_is_taken_for_nemo_gym():
    for server_type in ("resources_servers", "responses_api_agents", "responses_api_models"):
        for folder in sorted((REPO_ROOT / server_type).iterdir()):
            if (folder / "app.py").is_file():
                assert detect_framework(folder, "app.py") is None, folder


def _instance(root: Path, server_type: str, name: str, **fields: object):
    from nemo_gym.config.server_instances import ServerInstance

    folder = root / server_type / name
    return ServerInstance(
        name, server_type, name, {"entrypoint": "app.py", "implementation_dir": str(folder), **fields}
    )


def test_the_release_a_nemo_gym_folder_needs(tmp_path):
    """Issue 29: the NeMo Gym release a folder runs with. Its tree's release first (an unpacked wheel's dist-info, a
    checkout's package_info.py); else 0.7.0 for an environment server (a server type 0.7.0 introduced) or for a folder
    that imports, itself or through a sibling, a module 0.4.0's package lacks (`nemo_gym.judge`); else None (the run's
    default); an instance's `nemo_gym_version` field wins over all of them."""
    from nemo_gym.orchestration.upstream_servers import release_version
    from nemo_gym.upstream.detect import NEWEST_RELEASE, detect_release

    plain = nemo_gym_tree(tmp_path / "plain")
    write(plain / "resources_servers" / "judged" / "app.py", "from nemo_gym.judge import JudgeClient\n")
    write(plain / "resources_servers" / "via" / "app.py", "from resources_servers.judged.app import JudgeClient\n")
    write(plain / "environment_servers" / "legacy_agent" / "app.py", "from nemo_gym.server_utils import x\n")
    assert detect_release(_instance(plain, "resources_servers", "mcqa")) is None
    assert detect_release(_instance(plain, "resources_servers", "judged")) == NEWEST_RELEASE == "0.7.0"
    assert detect_release(_instance(plain, "resources_servers", "via")) == "0.7.0"
    assert detect_release(_instance(plain, "environment_servers", "legacy_agent")) == "0.7.0"

    wheel = nemo_gym_tree(tmp_path / "wheel")
    (wheel / "nemo_gym-0.6.0.dist-info").mkdir()
    write(wheel / "resources_servers" / "judged" / "app.py", "from nemo_gym.judge import JudgeClient\n")
    assert detect_release(_instance(wheel, "resources_servers", "judged")) == "0.6.0"
    # a nested agent folder (0.7.0's responses_api_agents/conversational_tool_use/simulation): the same tree's release
    write(wheel / "responses_api_agents" / "conversational_tool_use" / "simulation" / "app.py", "import nemo_gym\n")
    nested = _instance(wheel, "responses_api_agents", "conversational_tool_use/simulation")
    assert detect_release(nested) == "0.6.0"
    checkout = nemo_gym_tree(tmp_path / "checkout")
    write(
        checkout / "nemo_gym" / "package_info.py",
        'MAJOR = 0\nMINOR = 8\nPATCH = 0\nPRE_RELEASE = "rc1"\nVERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)\n',
    )
    assert detect_release(_instance(checkout, "resources_servers", "mcqa")) == "0.8.0rc1"

    assert release_version(_instance(plain, "resources_servers", "mcqa"), "0.4.0") == "0.4.0"
    assert release_version(_instance(plain, "resources_servers", "judged"), "0.4.0") == "0.7.0"
    assert (
        release_version(_instance(wheel, "resources_servers", "judged", nemo_gym_version="0.5.1"), "0.4.0") == "0.5.1"
    )


def test_nemo_gym_07s_own_config_loads(tmp_path):
    """0.7.0's resources_servers/mcqa/configs/mcqa.yaml, from its tree: the `environment_servers` instance is no longer
    an unknown server type (`ConfigError … unknown server type 'environment_servers'` before), and every instance
    runs from that tree's folders."""
    from nemo_gym.config import load_config
    from nemo_gym.config.server_instances import server_instances

    root = nemo_gym_tree(tmp_path / "ng07")
    (root / "nemo_gym-0.7.0.dist-info").mkdir()
    write(
        root / "responses_api_agents" / "simple_agent" / "app.py", "from nemo_gym.base_responses_api_agent import x\n"
    )
    write(root / "environment_servers" / "legacy_agent" / "app.py", "from nemo_gym.base_environment_server import x\n")
    config = root / "resources_servers" / "mcqa" / "configs" / "mcqa.yaml"
    write(
        config,
        "mcqa:\n  resources_servers:\n    mcqa:\n      entrypoint: app.py\n"
        "mcqa_simple_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
        "      resources_server: {type: resources_servers, name: mcqa}\n"
        "mcqa_environment_server:\n  environment_servers:\n    legacy_agent:\n      entrypoint: app.py\n"
        "      agent_server: {type: responses_api_agents, name: mcqa_simple_agent}\n",
    )
    instances = {i.name: i for i in server_instances(load_config([f"+config_paths=[{config}]"]))}
    assert set(instances) == {"mcqa", "mcqa_simple_agent", "mcqa_environment_server"}
    env_server = instances["mcqa_environment_server"]
    assert env_server.implementation_dir == root / "environment_servers" / "legacy_agent"
    assert detect_framework(env_server.implementation_dir, "app.py") == FRAMEWORK
