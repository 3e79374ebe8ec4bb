"""ng_train's `trainer:` section: an unknown key gets a "did you mean" among the keys of its section, at any depth,
as every other config key does (it got pydantic's "Extra inputs are not permitted")."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.cli import main

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = "+config_paths=[configs/train/quickstart_grpo.yaml]"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "+trainer.num_step=2",
            (
                "trainer.num_step: not a key of trainer (did you mean 'num_steps'?); its keys: algorithm,"
                " input_jsonl_fpath"
            ),
        ),
        (
            "+trainer.engine.learning_rat=1e-5",
            "trainer.engine.learning_rat: not a key of trainer.engine (did you mean 'learning_rate'?)",
        ),
        (
            "+trainer.engine.lora={rnak: 4}",
            (
                "trainer.engine.lora.rnak: not a key of trainer.engine.lora (did you mean 'rank'?); its keys: rank,"
                " alpha, target_modules, dropout"
            ),
        ),
        ("+trainer.eval.intervl=2", "trainer.eval.intervl: not a key of trainer.eval (did you mean 'interval'?)"),
        ("+trainer.num_steps=0", "trainer.num_steps: Input should be greater than or equal to 1"),
    ],
)
def test_unknown_trainer_keys_get_a_suggestion(override, expected, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main("train", [QUICKSTART, override]) == 2
    error = capsys.readouterr().err
    assert expected in error and "Extra inputs are not permitted" not in error
