"""`detect_framework` recognises a server folder written for NVIDIA NeMo Gym also when its entrypoint reaches NeMo
Gym's base classes through another server folder of its tree, as NeMo Gym 0.4.0's gpqa_diamond does
(`from resources_servers.mcqa.app import ...`, and no `nemo_gym` import of its own) and bunsenbench_chemistry_mcq
(whose only `nemo_gym` import, `nemo_gym.upstream.reward_profile`, is a module name ours has too). Before, such a folder
was taken for one of ours: ng_run tried to build it an environment of ours from its `-e nemo-gym[dev] @ ../../` line
and stopped."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.layout import REPO_ROOT
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
