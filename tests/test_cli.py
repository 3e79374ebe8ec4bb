"""The ng_* commands as a user runs them: help, version, dump_config, unknown parameters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
COMMANDS = ["run", "collect_rollouts", "profile", "status", "dump_config", "help", "version"]


def ng(name: str, *args: str, cwd: Path = REPO, prefix: str = "ng_") -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / f"{prefix}{name}"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.long
@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("flag", ["+help=true", "+h=true", "--help"])
def test_help_lists_parameters_with_type_default_and_meaning(name, flag):
    result = ng(name, flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ng_{name}:")
    if name == "collect_rollouts":
        for field in [
            "agent_name",
            "input_jsonl_fpath",
            "output_jsonl_fpath",
            "limit",
            "num_repeats",
            "num_samples_in_parallel",
            "responses_create_params",
        ]:
            assert f"+{field}:" in result.stdout
        assert "+num_repeats: int | dict[str, int] = 1" in result.stdout


def test_both_names_are_installed():
    for name in COMMANDS:
        assert (BIN / f"ng_{name}").exists() and (BIN / f"nemo_gym_{name}").exists()
    assert ng("version", prefix="nemo_gym_").returncode == 0


def test_version_json():
    info = json.loads(ng("version", "+json=true").stdout)
    assert info["nemo_gym"] and info["python"].startswith("3.")


def test_unknown_parameter_suggests():
    result = ng("profile", "+pass_treshold=0.5")
    assert result.returncode == 2
    assert "unknown parameter +pass_treshold (did you mean 'pass_threshold'?)" in result.stderr
    # NeMo Gym's name for an output file, given to a command that writes a folder: the parameter of that role
    result = ng("export_atif", "+rollouts_jsonl_fpath=r.jsonl", "+output_jsonl_fpath=o.jsonl")
    assert result.returncode == 2
    assert "unknown parameter +output_jsonl_fpath (did you mean 'output_dirpath'?)" in result.stderr


def test_dump_config_masks_secrets(tmp_path):
    (tmp_path / "env.yaml").write_text("policy_api_key: sk-very-secret\npolicy_base_url: http://127.0.0.1:1/v1\n")
    (tmp_path / "c.yaml").write_text(
        "# ng_dump_config +config_paths=[c.yaml]\nmodel:\n  api_key: ${policy_api_key}\n  url: ${policy_base_url}\n "
        " max_output_tokens: 16\n"
    )
    result = ng("dump_config", "+config_paths=[c.yaml]", "+hf_token=hf_abc", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sk-very-secret" not in result.stdout and "hf_abc" not in result.stdout
    assert (
        "api_key: '****'" in result.stdout
        and "max_output_tokens: 16" in result.stdout
        and "url: http://127.0.0.1:1/v1" in result.stdout
    )


def test_config_error_exit_status_and_message(tmp_path):
    (tmp_path / "c.yaml").write_text("x: ???\n")
    result = ng("dump_config", "+config_paths=[c.yaml]", cwd=tmp_path)
    assert result.returncode == 2
    assert "c.yaml: key 'x' has no value" in result.stderr and "+x=<value>" in result.stderr


def test_every_command_is_in_the_readmes_command_table():
    """README's command table lists every ng_* command (ng_viewer was missing); the dataset registry commands are
    documented together on their own page, docs/datasets.md."""
    import re
    from pathlib import Path

    from nemo_gym.cli import COMMANDS

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    table = "\n".join(
        line
        for line in readme[
            readme.index("## Commands") : readme.index("\n## ", readme.index("## Commands") + 1)
        ].splitlines()
        if line.startswith("| `")
    )
    datasets = (repo / "docs" / "datasets.md").read_text()
    assert datasets.startswith("# Datasets: Hugging Face and GitLab\n")
    missing = [
        f"ng_{name}" for name in COMMANDS if not re.search(rf"`ng_{name}\b", table) and f"ng_{name} " not in datasets
    ]
    assert missing == []
