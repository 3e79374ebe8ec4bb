"""ng_export on a tiny random Llama: DeepSpeed checkpoints (LoRA and full) and HF folders → a servable HF folder that
transformers loads with the same logits as the trained module; explicit lm_head, untied config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import fixed_batch, make_tiny_model  # noqa: E402

from nemo_gym.cli import main  # noqa: E402
from nemo_gym.model_files.export import resolve_source  # noqa: E402
from nemo_gym.runs.background import RunRecord  # noqa: E402
from nemo_gym.train.config import EngineConfig, LoraOptions, TrainerConfig  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402
from nemo_gym.train.grpo import GRPORecipe  # noqa: E402
from nemo_gym.train.loop import TrainingLoop  # noqa: E402


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tie=True)


def train_and_checkpoint(tmp_path: Path, model: Path, *, lora: bool, steps: int = 2) -> tuple[Path, PolicyEngine]:
    """A trainer output_dir with a checkpoint written by TrainingLoop.save_checkpoint after `steps` optimizer steps."""
    engine_config = EngineConfig(
        model_path=str(model),
        learning_rate=1e-2,
        micro_batch_size=2,
        lora=LoraOptions(rank=4, alpha=8) if lora else None,
    )
    cfg = TrainerConfig(input_jsonl_fpath="unused.jsonl", output_dir=str(tmp_path / "out"), engine=engine_config)
    recipe = GRPORecipe(cfg, [])
    recipe.engine = PolicyEngine(engine_config, cfg.loss)
    trainer = TrainingLoop(recipe)
    for _ in range(steps):
        trainer.engine.train_step(fixed_batch())
    trainer.step = steps
    trainer.save_checkpoint()
    return Path(cfg.output_dir), trainer.engine


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=fixed_batch().input_ids).logits


def load_exported(folder: Path) -> torch.nn.Module:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        assert "lm_head.weight" in handle.keys() and not any("lora" in name for name in handle.keys())
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


@pytest.mark.long
def test_lora_checkpoint_exports_merged_with_the_engines_logits(tmp_path, tiny_model):
    out, engine = train_and_checkpoint(tmp_path, tiny_model, lora=True)
    assert main("export", [str(out), f"+output={tmp_path / 'merged'}"]) == 0  # output_dir → latest checkpoint
    exported = load_exported(tmp_path / "merged")
    assert torch.allclose(logits(exported), logits(engine.module), atol=1e-5)
    assert not torch.allclose(
        logits(exported), logits(load_exported_base(tiny_model)), atol=1e-3
    )  # the adapters are in


def load_exported_base(model: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


def test_full_checkpoint_by_tag_and_overwrite_rules(tmp_path, tiny_model, capsys):
    out, engine = train_and_checkpoint(tmp_path, tiny_model, lora=False, steps=1)
    tag_dir = out / "checkpoints" / "step_000001"
    assert resolve_source(str(out / "checkpoints")).path == tag_dir == resolve_source(str(tag_dir)).path
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    assert main("export", [str(tag_dir), f"+output={dest}"]) == 2 and "+overwrite=true" in capsys.readouterr().err
    assert (
        main("export", [str(tag_dir), f"+output={out / 'checkpoints'}"]) == 2 and "overlaps" in capsys.readouterr().err
    )
    assert main("export", [str(tag_dir), f"+output={dest}", "+overwrite=true"]) == 0
    assert not (dest / "keep.txt").exists()
    assert torch.allclose(logits(load_exported(dest)), logits(engine.module), atol=1e-6)


def test_hf_folder_is_copied_untied_and_a_run_id_names_its_output_dir(tmp_path, tiny_model):
    from safetensors import safe_open

    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(tiny_model, out / "final")  # tied, no lm_head.weight in the file (save_pretrained drops it)
    with safe_open(str(out / "final" / "model.safetensors"), "pt") as handle:
        assert "lm_head.weight" not in handle.keys()
    record = RunRecord(
        id="train-20261122-041500-ab12",
        command="train",
        argv=[],
        cwd=str(tmp_path),
        log="",
        started="",
        started_at=0.0,
        output_dir=str(out),
    )
    record.dir.mkdir(parents=True)
    record.save()
    assert main("export", ["train-20261122", "+output=" + str(tmp_path / "served")]) == 0  # a unique id prefix
    assert torch.allclose(logits(load_exported(tmp_path / "served")), logits(load_exported_base(tiny_model)), atol=1e-6)


def test_checkpoint_without_engine_config_uses_the_runs_config(tmp_path, tiny_model):
    out, engine = train_and_checkpoint(tmp_path, tiny_model, lora=True, steps=1)
    state_file = out / "checkpoints" / "step_000001" / "trainer_state.json"
    state_file.write_text(json.dumps({k: v for k, v in json.loads(state_file.read_text()).items() if k != "engine"}))
    argv = [
        f"+trainer.engine.model_path={tiny_model}",
        "+trainer.engine.lora.rank=4",
        "+trainer.engine.lora.alpha=8",
        "+trainer.input_jsonl_fpath=x.jsonl",
    ]
    record = RunRecord(
        id="train-1",
        command="train",
        argv=argv,
        cwd=str(tmp_path),
        log="",
        started="",
        started_at=0.0,
        output_dir=str(out),
    )
    record.dir.mkdir(parents=True)
    record.save()
    assert main("export", [str(out), f"+output={tmp_path / 'merged'}"]) == 0
    assert torch.allclose(logits(load_exported(tmp_path / "merged")), logits(engine.module), atol=1e-5)


def test_nothing_to_export(tmp_path, capsys):
    assert (
        main("export", [str(tmp_path), f"+output={tmp_path / 'x'}"]) == 2
        and "no model found" in capsys.readouterr().err
    )
    assert (
        main("export", ["train-nope", f"+output={tmp_path / 'x'}"]) == 2
        and "neither a folder nor" in capsys.readouterr().err
    )
