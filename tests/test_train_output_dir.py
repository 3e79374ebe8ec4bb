"""ng_train into an output_dir that an earlier run used (YAML or @config.toml): it resumes a checkpoint of the same
config (and says so), does nothing when that run is finished, and otherwise stops before anything starts, naming
+trainer.output_dir and +overwrite=true; it appended its steps to the old metrics and overwrote checkpoints and
final/ silently. Real runs: ng_train's SFT mode on a tiny model (no servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("deepspeed")

# tiny_chat_model: a fixture
from test_train_supervised import chat_rows, tiny_chat_model, write_jsonl  # noqa: E402,F401

from nemo_gym.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def sft_config(tmp_path: Path, model: Path, out: Path) -> Path:
    data = write_jsonl(tmp_path / "train.jsonl", chat_rows(8))
    trainer = {
        "algorithm": "sft",
        "input_jsonl_fpath": str(data),
        "output_dir": str(out),
        "num_steps": 2,
        "batch_size": 4,
        "engine": {"model_path": str(model), "learning_rate": 1e-2, "micro_batch_size": 2},
        "logging": {"console": False},
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({"trainer": trainer}))
    return path


def steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_used_output_dir_is_resumed_or_refused(tiny_chat_model, tmp_path, capsys):
    out = tmp_path / "out"
    config = f"+config_paths=[{sft_config(tmp_path, tiny_chat_model, out)}]"
    assert main("train", [config]) == 0 and steps(out) == [1, 2]
    capsys.readouterr()

    assert main("train", [config]) == 0 and steps(out) == [1, 2]  # the same command again: its run is finished
    assert (
        f"ng_train: {out} holds this config's finished run (checkpoint at step 2, num_steps 2; final model in"
        f" {out / 'final'}): nothing to train" in capsys.readouterr().out
    )

    assert main("train", [config, "+trainer.num_steps=3"]) == 0 and steps(out) == [
        1,
        2,
        3,
    ]  # train on: resumed, said on the console
    printed = capsys.readouterr().out
    assert (
        f"ng_train: {out} holds a checkpoint of this config at step 2: resuming from it to step 3" in printed
        and "resumed from" in printed
    )

    assert main("train", [config, "+trainer.engine.learning_rate=1e-3"]) == 2 and steps(out) == [
        1,
        2,
        3,
    ]  # another config: refused, nothing touched
    error = capsys.readouterr().err
    assert (
        f"trainer.output_dir: {out} holds the outputs of another training run (metrics of 3 step(s), a checkpoint at"
        " step 3, a final model; " in error
    )
    assert "trainer.engine.learning_rate was 0.01, is 0.001" in error
    assert (
        "+trainer.output_dir=<new folder>" in error and "+overwrite=true" in error and "+trainer.resume=true" in error
    )

    assert main("train", [config, "+trainer.engine.learning_rate=1e-3", "+overwrite=true"]) == 0 and steps(out) == [
        1,
        2,
    ]  # started over
    assert f"+overwrite=true: deleted the outputs of the earlier run in {out}" in capsys.readouterr().out
    assert len(list((out / "tensorboard").iterdir())) == 1  # one TensorBoard file, not one per run


def test_a_prime_toml_into_a_used_output_dir_stops_before_anything_starts(
    tiny_chat_model, tmp_path, monkeypatch, capsys
):
    """`ng_train @config.toml` writes to results/train/<env name>; another run there is refused before ng_run starts."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results" / "train" / "smollm2-reasoning-gym"
    assert main("train", [f"+config_paths=[{sft_config(tmp_path, tiny_chat_model, out)}]"]) == 0
    capsys.readouterr()
    from nemo_gym.prime.config import TEMPLATE

    (tmp_path / "config.toml").write_text(TEMPLATE)
    assert main("train", ["@config.toml", "+trainer.num_steps=1"]) == 2
    error = capsys.readouterr().err
    assert "holds the outputs of another training run" in error and "trainer.algorithm was 'sft', is 'grpo'" in error
    assert not (out / "ng_run.log").exists()  # no server was started
