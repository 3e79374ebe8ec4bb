"""bfloat16 training on a CPU: the GPU path's precision code (DeepSpeed's bf16 optimizer, ZeRO 0 and 3) runs here too.

`trainer.engine.dtype: bfloat16` without CUDA is allowed with a warning (nemo_gym.train.config.check_hardware, tested
in tests/test_weight_sync_broadcast.py); here the engine itself: parameters and the exported state dict in bf16, a step
under ZeRO 0 and under ZeRO 3 from the same weights gives the same loss (the forward is the same) and moves the
weights, and the loss is close to float32's (bf16 keeps 8 significant bits: relative 2^-8 per rounding).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import fixed_batch, make_tiny_model  # noqa: E402

from nemo_gym.train.config import EngineConfig, LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def first_step(
    model_path, dtype: str, zero_stage: int
) -> tuple[PolicyEngine, dict[str, float], dict[str, torch.Tensor]]:
    engine = PolicyEngine(
        EngineConfig(
            model_path=str(model_path), dtype=dtype, zero_stage=zero_stage, micro_batch_size=2, learning_rate=1e-2
        ),
        LossOptions(),
    )
    before = {name: tensor.float() for name, tensor in engine.export_state_dict().items()}
    return engine, engine.train_step(fixed_batch()), before


@pytest.mark.long
def test_bf16_engine_steps_under_zero_0_and_3(tiny_model):
    losses = {}
    for stage in (0, 3):
        engine, metrics, before = first_step(tiny_model, "bfloat16", stage)
        after = engine.export_state_dict()
        assert engine.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        assert all(tensor.dtype == torch.bfloat16 for tensor in after.values())
        assert any(not torch.equal(after[name].float(), before[name]) for name in before)
        assert metrics["grad_norm"] > 0 and metrics["num_tokens"] == 6
        losses[stage] = metrics["loss"]
    _, float32, _ = first_step(tiny_model, "float32", 0)
    assert losses[3] == pytest.approx(losses[0], rel=1e-3)
    # with ratio 1 the loss's value depends on the weights through the TIS weight exp(log π - rollout log-prob) only:
    # bf16 rounding of the weights and activations moves it by well under 1 %
    assert losses[0] == pytest.approx(float32["loss"], rel=1e-2)
