"""Dataset registry commands against local Hub and GitLab servers that speak the real HTTP API
(`tests/registry_fakes.py`) to the real `huggingface_hub` and `python-gitlab` clients."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from live_servers import serve
from ng_process import NgRun
from registry_fakes import FakeGitlab, FakeHub

from nemo_gym.cli import main
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.datasets.common import atomic_download, token_for

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
RESOURCE_CONFIG = REPO / "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
HF_CANARY = "hf_CANARYtoken0123456789SECRET"
GL_CANARY = "glpat-CANARYtoken9876543210SECRET"


@pytest.fixture
def registries(tmp_path, monkeypatch, caplog):
    """Both fakes on loopback, the environment pointing at them, cwd = a clean folder (no env.yaml)."""
    hub, lab = FakeHub(HF_CANARY), FakeGitlab(GL_CANARY)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.DEBUG)
    with serve(hub.app()) as hub_url, serve(lab.app()) as lab_url:
        for key, value in {
            "HF_ENDPOINT": hub_url,
            "HF_TOKEN": HF_CANARY,
            "HF_HOME": str(tmp_path / "hf_home"),
            "GITLAB_URL": lab_url,
            "GITLAB_TOKEN": GL_CANARY,
            "GITLAB_PROJECT_ID": str(lab.project_id),
            "NEMO_GYM_HOME": str(tmp_path / "ng_home"),
        }.items():
            monkeypatch.setenv(key, value)
        yield hub, lab
    assert HF_CANARY not in caplog.text and GL_CANARY not in caplog.text, "a token reached the logs"


@pytest.fixture
def ng(capfd):
    """Run an ng_* command in-process; returns (exit status, stdout + stderr), checked for tokens."""

    def run(name: str, *args: str) -> tuple[int, str]:
        status = main(name, list(args))
        out, err = capfd.readouterr()
        text = out + err
        assert HF_CANARY not in text and GL_CANARY not in text, f"a token was printed: {text}"
        return status, text

    return run


def upload_to_hf(ng, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    return ng(
        "upload_dataset_to_hf",
        "+hf_organization=my-org",
        "+dataset_name=weather",
        f"+input_jsonl_fpath={EXAMPLE}",
        f"+resource_config_path={RESOURCE_CONFIG}",
        "+hf_collection_name=gym-data",
        *extra,
    )


REPO_ID = "my-org/NeMo-Gym-Agent-example_single_tool_call-weather"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


def test_gitlab_round_trip_is_byte_identical(registries, ng, tmp_path):
    _, lab = registries
    status, text = ng(
        "upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}"
    )
    assert status == 0, text
    assert [f["file_name"] for p in lab.packages.values() for f in p["files"]] == [
        "example.jsonl",
        "example.jsonl.sha256",
    ]
    out = tmp_path / "pulled" / "weather.jsonl"
    status, text = ng("download_dataset_from_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+output_fpath={out}")
    assert status == 0, text
    assert out.read_bytes() == EXAMPLE.read_bytes()
    status, text = ng("download_dataset_from_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+output_fpath={out}")
    assert status == 2 and "+overwrite=true" in text  # an existing output is not replaced silently


def test_gitlab_sha256_file_used_when_the_api_reports_none(registries, ng, tmp_path):
    _, lab = registries
    lab.report_sha256 = False  # an older GitLab: the `.sha256` file next to the package file is the checksum
    assert (
        ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")[0]
        == 0
    )
    out = tmp_path / "w.jsonl"
    assert (
        ng(
            "download_dataset_from_gitlab",
            "+dataset_name=weather",
            "+version=0.0.1",
            "+artifact_fpath=example.jsonl",
            f"+output_fpath={out}",
        )[0]
        == 0
    )
    assert out.read_bytes() == EXAMPLE.read_bytes()


def test_gitlab_existing_version_needs_overwrite(registries, ng, tmp_path):
    _, lab = registries
    args = ("+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    assert ng("upload_dataset_to_gitlab", *args)[0] == 0
    changed = tmp_path / "example.jsonl"
    changed.write_text(EXAMPLE.read_text().splitlines()[0] + "\n")
    status, text = ng(
        "upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={changed}"
    )
    assert status == 2 and "already exists" in text and "+overwrite=true" in text
    assert (
        ng(
            "upload_dataset_to_gitlab",
            "+dataset_name=weather",
            "+version=0.0.1",
            f"+input_jsonl_fpath={changed}",
            "+overwrite=true",
        )[0]
        == 0
    )
    assert [(p["version"], len(p["files"])) for p in lab.packages.values()] == [("0.0.1", 2)]
    assert (
        ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=1.0", f"+input_jsonl_fpath={EXAMPLE}")[
            1
        ].count("x.y.z")
        == 1
    )


def test_gitlab_corrupted_download_writes_nothing(registries, ng, tmp_path):
    _, lab = registries
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    lab.corrupt = True
    out = tmp_path / "w.jsonl"
    status, text = ng("download_dataset_from_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+output_fpath={out}")
    assert status == 2 and "checksum mismatch" in text
    assert not out.exists() and leftovers(tmp_path) == []


def test_gitlab_interrupted_download_writes_nothing(registries, ng, tmp_path):
    _, lab = registries
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    lab.truncate = True  # the server drops the connection half-way through the file
    out = tmp_path / "w.jsonl"
    status, text = ng("download_dataset_from_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+output_fpath={out}")
    assert status == 2 and "127.0.0.1" in text, text
    assert not out.exists() and leftovers(tmp_path) == []


def test_interrupt_mid_stream_leaves_no_partial_file(tmp_path):
    out = tmp_path / "data.jsonl"

    def fetch(tmp_dir: Path) -> Path:
        (tmp_dir / "data.jsonl").write_bytes(b"half a file")
        raise KeyboardInterrupt  # Ctrl-C while the bytes arrive

    with pytest.raises(KeyboardInterrupt):
        atomic_download(out, fetch, lambda path: None)
    assert list(tmp_path.iterdir()) == []


def test_delete_asks_and_refuses_without_a_terminal(registries, ng, monkeypatch):
    _, lab = registries
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.2", f"+input_jsonl_fpath={EXAMPLE}")
    ng("upload_dataset_to_gitlab", "+dataset_name=weather_big", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # CI: no terminal
    status, text = ng("delete_dataset_from_gitlab", "+dataset_name=weather")
    assert status == 2 and "+yes=true" in text and len(lab.packages) == 3
    status, text = ng("delete_dataset_from_gitlab", "+dataset_name=weather", "+yes=true")
    assert status == 0 and "0.0.1, 0.0.2" in text
    assert [p["name"] for p in lab.packages.values()] == ["weather_big"]  # exact name only


def test_hf_round_trip_private_repo_in_collection(registries, ng, tmp_path):
    hub, _ = registries
    status, text = upload_to_hf(ng)
    assert status == 0, text
    repo = hub.repos[REPO_ID]
    assert repo["private"] and repo["type"] == "dataset" and repo["files"]["example.jsonl"] == EXAMPLE.read_bytes()
    assert [c["items"] for c in hub.collections.values()] == [[REPO_ID]]
    out = tmp_path / "pulled.jsonl"
    status, text = ng(
        "download_dataset_from_hf", f"+repo_id={REPO_ID}", "+artifact_fpath=example.jsonl", f"+output_fpath={out}"
    )
    assert status == 0, text
    assert out.read_bytes() == EXAMPLE.read_bytes() and leftovers(tmp_path) == []
    status, text = upload_to_hf(ng)
    assert status == 2 and "already has example.jsonl" in text and "+overwrite=true" in text
    assert upload_to_hf(ng, ("+overwrite=true",))[0] == 0
    assert [len(c["items"]) for c in hub.collections.values()] == [1]


def test_hf_corrupted_download_writes_nothing(registries, ng, tmp_path):
    hub, _ = registries
    upload_to_hf(ng)
    hub.corrupt = True
    out = tmp_path / "pulled.jsonl"
    status, text = ng(
        "download_dataset_from_hf", f"+repo_id={REPO_ID}", "+artifact_fpath=example.jsonl", f"+output_fpath={out}"
    )
    assert status == 2 and "checksum mismatch" in text, text
    assert not out.exists() and leftovers(tmp_path) == []


def test_missing_repo_file_and_wrong_token(registries, ng, tmp_path, monkeypatch):
    upload_to_hf(ng)
    out = tmp_path / "x.jsonl"
    status, text = ng(
        "download_dataset_from_hf", f"+repo_id={REPO_ID}", "+artifact_fpath=nope.jsonl", f"+output_fpath={out}"
    )
    assert status == 2 and "no file 'nope.jsonl'" in text
    status, text = ng(
        "download_dataset_from_hf", "+repo_id=my-org/absent", "+artifact_fpath=a.jsonl", f"+output_fpath={out}"
    )
    assert status == 2 and "repository not found" in text
    monkeypatch.setenv("GITLAB_TOKEN", "glpat-wrong-token")
    status, text = ng(
        "upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}"
    )
    assert (
        status == 2
        and "refused the token (HTTP 401)" in text
        and "gitlab_token" in text
        and "glpat-wrong-token" not in text
    )


def test_network_errors_name_the_host(registries, ng, tmp_path, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: connection refused
        monkeypatch.setenv("HF_ENDPOINT", f"http://{dead}")
        monkeypatch.setenv("GITLAB_URL", f"http://{dead}")
        status, text = ng(
            "download_dataset_from_hf",
            f"+repo_id={REPO_ID}",
            "+artifact_fpath=example.jsonl",
            f"+output_fpath={tmp_path / 'x'}",
        )
        assert status == 2 and f"cannot reach the Hugging Face Hub at {dead}" in text and "HF_ENDPOINT" in text, text
        status, text = ng(
            "download_dataset_from_gitlab", "+dataset_name=w", "+version=0.0.1", f"+output_fpath={tmp_path / 'x'}"
        )
        assert status == 2 and f"cannot reach GitLab at {dead}" in text and "gitlab_url" in text, text


def test_gitlab_to_hf_migration(registries, ng, tmp_path, monkeypatch):
    hub, lab = registries
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.2", f"+input_jsonl_fpath={EXAMPLE}")
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # no terminal: refused before anything is uploaded
    status, text = ng(
        "gitlab_to_hf_dataset",
        "+hf_organization=my-org",
        "+dataset_name=weather",
        f"+resource_config_path={RESOURCE_CONFIG}",
    )
    assert status == 2 and "+yes=true" in text and hub.repos == {} and len(lab.packages) == 2
    status, text = ng(
        "gitlab_to_hf_dataset",
        "+hf_organization=my-org",
        "+dataset_name=weather",
        f"+resource_config_path={RESOURCE_CONFIG}",
        "+yes=true",
    )
    assert status == 0, text
    assert hub.repos[REPO_ID]["files"]["example.jsonl"] == EXAMPLE.read_bytes() and lab.packages == {}
    status, text = ng(
        "gitlab_to_hf_dataset",
        "+hf_organization=my-org",
        "+dataset_name=weather",
        f"+resource_config_path={RESOURCE_CONFIG}",
        "+yes=true",
    )
    assert status == 2 and "not found" in text  # nothing left to migrate; nothing uploaded


def test_tokens_from_env_yaml_environment_and_login_file(registries, ng, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    assert token_for("hf") is None
    status, text = ng("login", "+service=hf", f"+token={HF_CANARY}")
    assert status == 0
    path = tmp_path / "ng_home" / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token_for("hf") == HF_CANARY
    assert upload_to_hf(ng)[0] == 0  # the login file's token reaches the Hub
    monkeypatch.setenv("HF_TOKEN", "hf_from_environment")
    assert token_for("hf") == "hf_from_environment"
    (tmp_path / "env.yaml").write_text("hf_token: hf_from_env_yaml\n")
    assert token_for("hf") == "hf_from_env_yaml" and token_for("hf", "explicit") == "explicit"
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    monkeypatch.delenv("GITLAB_TOKEN")
    status, text = ng("login", "+service=gitlab")
    assert status == 2 and "+token=" in text
    assert ng("logout", "+service=hf") == (0, f"forgot hf in {path}\n")
    assert json.loads(path.read_text()) == {}


def test_prepare_data_downloads_declared_datasets(registries, ng, tmp_path):
    ng("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.0.1", f"+input_jsonl_fpath={EXAMPLE}")
    upload_to_hf(ng)
    config = tmp_path / "agent.yaml"
    config.write_text(
        "weather_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n      datasets:\n      "
        f"  - {{name: from_hf, type: train, jsonl_fpath: {tmp_path}/data/hf.jsonl, huggingface: {{repo_id: {REPO_ID},"
        " artifact_fpath: example.jsonl}}\n        - {name: from_gitlab, type: validation, jsonl_fpath:"
        f" {tmp_path}/data/gl.jsonl, gitlab: {{dataset_name: weather, version: 0.0.1, artifact_fpath:"
        " example.jsonl}}\n"
    )
    args = (f"+config_paths=[{config}]", f"+output_dirpath={tmp_path}/prepared", "+mode=train_preparation")
    status, text = ng("prepare_data", *args)
    assert status == 2 and "+should_download=true" in text
    status, text = ng("prepare_data", *args, "+should_download=true")
    assert status == 0, text
    for name in ("hf.jsonl", "gl.jsonl"):
        assert (tmp_path / "data" / name).read_bytes() == EXAMPLE.read_bytes()
    assert len((tmp_path / "prepared" / "train.jsonl").read_text().splitlines()) == 5


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.integration
def test_new_user_path_gitlab_to_hub_to_rollouts(tmp_path):
    """The registry round trip as a user types it: push to GitLab, migrate to the Hub, pull back, collect rollouts."""
    hub, lab = FakeHub(HF_CANARY), FakeGitlab(GL_CANARY)
    bin_dir = Path(sys.executable).parent
    with serve(hub.app()) as hub_url, serve(lab.app()) as lab_url:
        (tmp_path / "env.yaml").write_text(
            f"hf_token: {HF_CANARY}\nhf_organization: my-org\nhf_endpoint: {hub_url}\n"
            f"gitlab_url: {lab_url}\ngitlab_project_id: {lab.project_id}\n"
        )
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "GITLAB_TOKEN", "HF_ENDPOINT")}
        env.update(NEMO_GYM_HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf_home"))

        def cli(name: str, *args: str, stdin: str | None = None) -> str:
            done = subprocess.run(
                [str(bin_dir / f"ng_{name}"), *args],
                cwd=tmp_path,
                env=env,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert HF_CANARY not in done.stdout + done.stderr and GL_CANARY not in done.stdout + done.stderr
            return done.stdout

        cli(
            "login", "+service=gitlab", f"+token={GL_CANARY}"
        )  # the GitLab token from ng_login, the Hub's from env.yaml
        cli("upload_dataset_to_gitlab", "+dataset_name=weather", "+version=0.1.0", f"+input_jsonl_fpath={EXAMPLE}")
        cli("gitlab_to_hf_dataset", "+dataset_name=weather", f"+resource_config_path={RESOURCE_CONFIG}", "+yes=true")
        assert lab.packages == {} and REPO_ID in hub.repos
        pulled = tmp_path / "data" / "weather.jsonl"
        cli(
            "download_dataset_from_hf",
            f"+repo_id={REPO_ID}",
            "+artifact_fpath=example.jsonl",
            f"+output_fpath={pulled}",
        )
        assert pulled.read_bytes() == EXAMPLE.read_bytes()

    rollouts = tmp_path / "rollouts.jsonl"
    with NgRun(
        "+config_paths=[tests/configs/weather_scripted.yaml]",
        "+skip_venv=true",
        env={"NEMO_GYM_HOME": env["NEMO_GYM_HOME"]},
    ) as run:
        head = run.wait_ready()
        cli(
            "collect_rollouts",
            "+agent_name=weather_agent",
            f"+input_jsonl_fpath={pulled}",
            f"+output_jsonl_fpath={rollouts}",
            "+progress=false",
            f"+head_server_url={head}",
        )
    rows = read_jsonl(rollouts)
    assert len(rows) == 5 and all(r["reward"] == 1.0 for r in rows)
