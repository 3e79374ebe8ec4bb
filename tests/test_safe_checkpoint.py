"""Checkpoints are never unpickled into code: DeepSpeed's checkpoint loads go through
`nemo_gym.train.safe_checkpoint` (torch.load weights_only=True, a short allow-list), for `ng_train` resume,
`ng_export` and the ART backend alike (all three call `PolicyEngine.load_checkpoint`).

A checkpoint file replaced by a pickle whose `__reduce__` would create a marker folder is refused with an error
naming the file, and the marker never appears. ZeRO 1-3 round trips with the safe loader are in
tests/test_train_zero.py and tests/test_train_resume.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import fixed_batch, make_tiny_model  # noqa: E402

from nemo_gym.common.paths import PathEscapeError  # noqa: E402
from nemo_gym.train.config import EngineConfig, LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402
from nemo_gym.train.safe_checkpoint import SafeCheckpointEngine, UnsafeCheckpointError, safe_torch_load  # noqa: E402


class RunsCode:
    """Unpickling this calls os.makedirs(marker): the stand-in for any command a tampered checkpoint would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(engine, checkpoint folder) after one step and a checkpoint `step_000001`."""
    folder = tmp_path_factory.mktemp("safe_checkpoint")
    engine = PolicyEngine(
        EngineConfig(model_path=str(make_tiny_model(folder / "model", seed=2)), learning_rate=1e-2, micro_batch_size=2),
        LossOptions(),
    )
    engine.train_step(fixed_batch())
    engine.save_checkpoint(folder / "checkpoints", "step_000001")
    return engine, folder / "checkpoints"


def tampered_copy(checkpoints: Path, tmp_path: Path, file_name: str) -> tuple[Path, Path]:
    """A copy of the checkpoint folder whose `file_name` is a torch.save'd `RunsCode`; (copy, marker)."""
    import shutil

    copy = tmp_path / "checkpoints"
    shutil.copytree(checkpoints, copy)
    marker = tmp_path / "code_ran"
    torch.save({"module": RunsCode(marker)}, copy / "step_000001" / file_name)
    return copy, marker


def test_the_engine_loads_through_the_safe_engine_and_round_trips(saved):
    engine, checkpoints = saved
    assert isinstance(engine.engine.checkpoint_engine, SafeCheckpointEngine)
    before = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    engine.train_step(fixed_batch())  # move away, then come back
    engine.load_checkpoint(checkpoints, "step_000001")
    assert engine.step == 1
    for name, p in engine.module.named_parameters():
        assert torch.equal(p, before[name]), name


def test_a_model_states_file_that_would_run_code_is_refused(saved, tmp_path):
    engine, checkpoints = saved
    copy, marker = tampered_copy(checkpoints, tmp_path, "mp_rank_00_model_states.pt")
    with pytest.raises(UnsafeCheckpointError, match="mp_rank_00_model_states.pt: refused to load") as info:
        engine.load_checkpoint(copy, "step_000001")
    assert "posix.makedirs" in str(info.value) or "os.makedirs" in str(info.value)  # torch names the refused global
    assert not marker.exists()


def test_ng_export_refuses_the_tampered_checkpoint(saved, tmp_path, capsys):
    from nemo_gym.cli import main

    _, checkpoints = saved
    copy, marker = tampered_copy(checkpoints, tmp_path, "mp_rank_00_model_states.pt")
    (copy / "step_000001" / "trainer_state.json").write_text('{"engine": %s}' % saved[0].config.model_dump_json())
    assert main("export", [str(copy / "step_000001"), f"+output={tmp_path / 'exported'}"]) == 2
    assert "refused to load" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "exported").exists()


def test_safe_load_refuses_a_bare_pickle_too(tmp_path):
    import pickle

    marker = tmp_path / "code_ran"
    path = tmp_path / "legacy.pt"
    path.write_bytes(pickle.dumps(RunsCode(marker)))  # the pre-zip torch format is a plain pickle
    with pytest.raises(UnsafeCheckpointError, match="legacy.pt: refused to load"):
        safe_torch_load(str(path))
    assert not marker.exists()


def test_a_checkpoint_tag_outside_the_folder_is_refused(saved):
    engine, checkpoints = saved
    with pytest.raises(PathEscapeError, match="checkpoint tag"):
        engine.load_checkpoint(checkpoints, "../../elsewhere")
