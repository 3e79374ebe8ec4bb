"""Path containment: `nemo_gym.common.paths.resolve_inside` and every call site where a user-, file- or
network-supplied name becomes a path, each fed hostile names (`..`, absolute paths elsewhere, symlinks out)."""

from __future__ import annotations

import json
import os

import pytest

from nemo_gym.cli import main
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.paths import PathEscapeError, check_name, resolve_inside
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances


# -- the helper ---------------------------------------------------------------------------------------------------
def test_resolve_inside_accepts_names_inside(tmp_path):
    (tmp_path / "a").mkdir()
    assert resolve_inside(tmp_path, "a/b.txt") == tmp_path.resolve() / "a" / "b.txt"
    assert resolve_inside(tmp_path, "a/../c") == tmp_path.resolve() / "c"  # `..` that stays inside is fine
    assert resolve_inside(tmp_path, ".") == tmp_path.resolve()
    assert resolve_inside(tmp_path, str(tmp_path / "a")) == tmp_path.resolve() / "a"  # absolute, but inside
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert resolve_inside(tmp_path, "link/x") == tmp_path.resolve() / "a" / "x"  # a symlink that stays inside


@pytest.mark.parametrize("name", ["..", "../x", "a/../../x", "/etc/passwd", "", "a\0b", "link_out/x", "link_out"])
def test_resolve_inside_refuses_escapes(tmp_path, name):
    base = tmp_path / "base"
    base.mkdir()
    (base / "link_out").symlink_to(tmp_path)  # a symlink whose target is outside base
    with pytest.raises(PathEscapeError):
        resolve_inside(base, name, what="test name")


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "a\\b", "a\0"])
def test_check_name_refuses_anything_but_one_component(name):
    with pytest.raises(PathEscapeError, match="not a plain name"):
        check_name(name, what="tag")
    assert check_name("step_000003") == "step_000003"


# -- ng_runs ids and records ----------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("run_id", ["..", "../victim", "*", "/tmp"])
def test_ng_runs_refuses_hostile_ids(home, tmp_path, run_id, capsys):
    victim = home / "victim"
    victim.mkdir(parents=True)
    (home / "train_runs" / "train-1").mkdir(parents=True)
    assert main("runs", ["delete", run_id, "+force=true"]) == 2
    assert victim.is_dir() and (home / "train_runs" / "train-1").is_dir()
    assert "run" in capsys.readouterr().err


def test_ng_runs_refuses_a_record_whose_id_leaves_its_folder(home, capsys):
    """A hand-edited run.json with id "../../victim": listing skips it, delete refuses it, nothing outside goes."""
    from nemo_gym.runs.background import list_records

    victim = home / "victim"
    victim.mkdir(parents=True)
    record_dir = home / "train_runs" / "train-20260101-000000-abcd"
    record_dir.mkdir(parents=True)
    record = {
        "id": "../victim",
        "command": "train",
        "argv": [],
        "cwd": "/",
        "log": "/dev/null",
        "started": "",
        "started_at": 0.0,
    }
    (record_dir / "run.json").write_text(json.dumps(record))
    assert list_records() == []
    assert main("runs", ["delete", record_dir.name, "+force=true"]) == 2
    assert "is not the name of its folder" in capsys.readouterr().err
    assert victim.is_dir() and record_dir.is_dir()


# -- checkpoint tags read from latest_step; ng_export's output
# ----------------------------------------------------------
def test_export_refuses_a_latest_step_that_leaves_the_checkpoints_folder(tmp_path):
    from nemo_gym.model_files.export import resolve_source

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "mp_rank_00_model_states.pt").parent.mkdir()
    (elsewhere / "mp_rank_00_model_states.pt").write_bytes(b"")
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for tag in ("../../elsewhere", str(elsewhere), ".."):
        (checkpoints / "latest_step").write_text(tag)
        with pytest.raises(PathEscapeError, match="checkpoint tag"):
            resolve_source(str(tmp_path / "run"))


def test_export_output_through_a_symlink_into_the_source_is_refused(tmp_path):
    from nemo_gym.model_files.export import export_model

    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"")
    (tmp_path / "out").symlink_to(source)
    with pytest.raises(ConfigError, match="overlaps the source"):
        export_model(str(source), tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in source.iterdir()) == ["config.json", "model.safetensors"]


def test_trainer_resume_refuses_a_hostile_latest_step(tmp_path):
    """`ng_train +trainer.resume=true` reads the tag from latest_step: a path there is refused before any load."""
    pytest.importorskip("torch")
    from nemo_gym.train.config import EngineConfig, LoggingOptions, TrainerConfig
    from nemo_gym.train.grpo import GRPORecipe
    from nemo_gym.train.loop import TrainingLoop

    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "latest_step").write_text("../../../etc")
    cfg = TrainerConfig(
        input_jsonl_fpath="unused",
        output_dir=str(tmp_path / "out"),
        engine=EngineConfig(model_path="unused"),
        resume=True,
        logging=LoggingOptions(console=False, tensorboard=False),
    )
    trainer = TrainingLoop(GRPORecipe(cfg, []))
    assert trainer.engine is None  # never reached: the tag is checked first
    with pytest.raises(PathEscapeError, match="latest_step: checkpoint tag '../../../etc' is not a plain name"):
        trainer.resume()


# -- server folders and entrypoints from a config
# ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "yaml_text, message",
    [
        (
            "x:\n  resources_servers:\n    example_single_tool_call: {entrypoint: ../../nemo_gym/cli.py}\n",
            "entrypoint' '../../nemo_gym/cli.py' points outside",
        ),
        (
            "x:\n  resources_servers:\n    example_single_tool_call: {entrypoint: /etc/passwd}\n",
            "entrypoint' '/etc/passwd' points outside",
        ),
        (
            "x:\n  resources_servers:\n    ../responses_api_agents/simple_agent: {entrypoint: app.py}\n",
            "implementation name '../responses_api_agents/simple_agent' points outside",
        ),
    ],
)
def test_config_refuses_entrypoints_outside_their_folder(tmp_path, yaml_text, message):
    (tmp_path / "c.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(".", "\\.")):
        server_instances(load_config(["+config_paths=[c.yaml]"], cwd=tmp_path))


def test_config_refuses_an_entrypoint_symlink_out_of_the_folder(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    (tmp_path / "outside.py").write_text("raise SystemExit('must not be imported')\n")
    (folder / "app.py").symlink_to(tmp_path / "outside.py")
    (tmp_path / "c.yaml").write_text(
        f"x:\n  resources_servers:\n    mine: {{entrypoint: app.py, implementation_dir: {folder}}}\n"
    )
    with pytest.raises(ConfigError, match="points outside"):
        server_instances(load_config(["+config_paths=[c.yaml]"], cwd=tmp_path))


# -- template (scaffold) names -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "entrypoint", ["resources_servers/..", "resources_servers/../../tmp/x", "/tmp/x", "resources_servers/a/../b"]
)
def test_scaffold_refuses_hostile_names(tmp_path, entrypoint):
    from nemo_gym.scaffold.resources_server import init_resources_server

    with pytest.raises(ConfigError):
        init_resources_server(entrypoint, repo_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- dataset registries: names from the network or the config
# -----------------------------------------------------------
def test_gitlab_file_name_from_the_registry_cannot_leave_the_download_folder(tmp_path, monkeypatch):
    """The registry lists a file called `..`: the download is refused, nothing is written outside the folder."""
    from live_servers import serve
    from registry_fakes import FakeGitlab

    from nemo_gym.datasets.gitlab import GitlabRegistry, download_to_dir

    lab = FakeGitlab("glpat-test")
    with serve(lab.app()) as url:
        registry = GitlabRegistry(url=url, token="glpat-test", project_id=lab.project_id)
        data = tmp_path / "rows.jsonl"
        data.write_text('{"a": 1}\n')
        registry.upload("weather", "0.0.1", data)
        (package,) = lab.packages.values()
        for record in package["files"]:
            record["file_name"] = record["file_name"].replace("rows.jsonl", "..")
        target = tmp_path / "downloads"
        target.mkdir()
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(PathEscapeError, match="file name '..'"):
            download_to_dir(registry, "weather", "0.0.1", None, target)
        assert sorted(p.name for p in tmp_path.iterdir()) == before and list(target.iterdir()) == []
        with pytest.raises(PathEscapeError, match="dataset_name"):
            registry.download("../weather", "0.0.1", tmp_path / "x.jsonl")


def test_hf_artifact_path_cannot_leave_the_download_folder(tmp_path, monkeypatch):
    from live_servers import serve
    from registry_fakes import FakeHub

    from nemo_gym.datasets.hf import HubDatasets

    hub = FakeHub("hf_test")
    monkeypatch.chdir(tmp_path)
    with serve(hub.app()) as url:
        datasets = HubDatasets(token="hf_test", endpoint=url)
        datasets.file_info = lambda repo_id, path: (
            object()
        )  # the Hub claims the file exists: the name is checked anyway
        with pytest.raises(PathEscapeError, match="artifact_fpath '../../evil.jsonl' points outside"):
            datasets.download("org/repo", "../../evil.jsonl", tmp_path / "out" / "rows.jsonl")
    assert not (tmp_path / "evil.jsonl").exists() and not (tmp_path / "out" / "rows.jsonl").exists()
    assert list((tmp_path / "out").iterdir()) == [] and os.listdir(tmp_path) == [
        "out"
    ]  # no temporary folder left either
