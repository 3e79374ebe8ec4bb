"""ZeRO stages 1-3 of the policy engine (nemo_gym.train.engine) on one CPU process, checked against ZeRO 0.

The same tiny random Llama, batch and config (float32, AdamW, lr 1e-2) under ZeRO 0 and under each stage give the
same step: the loss metrics, the pre-clip gradient norm, the clipped gradients AdamW is handed, the updated weights,
the HF export and a checkpoint round trip. ZeRO 0 in float32 clips in the engine's own AdamW pre-hook; stages 1-3
leave the clip and the norm to DeepSpeed's ZeRO optimizer (`gradient_clipping`, `get_global_grad_norm()`), which
computes the norm before clipping (deepspeed 0.19.8: `_global_grad_norm` is set before `unscale_and_clip_grads`).

Measured on this batch: the gradients of stages 1 and 0 are bit-identical, those of stage 3 differ by ≤ 9e-8 per
element. The exact (float64) norm is 5.5774793; stages 1-3 report it to 1e-8 while ZeRO 0's `clip_grad_norm_`
(float32) reports 5.5774608 (-3.3e-6 relative), hence rel=1e-4 on the norm. The weights after one step differ
from ZeRO 0's by ≤ 1.2e-7 (stages 1, 2) and ≤ 2.2e-6 (stage 3, tied embedding); after two steps by ≤ 2.2e-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import engine_config, fixed_batch, make_tiny_model  # noqa: E402

from nemo_gym.train.config import LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402

# The step's pre-clip norm is ≈ 5.577, so clipping to 1e-3 is on and a step that skipped it would hand AdamW
# gradients 5577 times too large (AdamW's first step ≈ lr·sign(g) hides that scale from the weights, not from the hook).
MAX_GRAD_NORM = 1e-3
WEIGHTS_TOL = {"atol": 1e-5, "rtol": 1e-5}


@dataclass
class Stepped:
    """An engine after one `train_step(fixed_batch())`."""

    engine: PolicyEngine
    metrics: dict[str, float]
    weights: dict[str, torch.Tensor]  # export_state_dict() after the step
    stepped_grad_norms: list[float]  # L2 norm of the gradients the inner AdamW stepped with, one per step


def make_engine(model_path, zero_stage: int) -> PolicyEngine:
    return PolicyEngine(
        engine_config(model_path, zero_stage=zero_stage, max_grad_norm=MAX_GRAD_NORM), LossOptions(tis_cap=None)
    )


def record_stepped_grad_norms(engine: PolicyEngine) -> list[float]:
    """Norms of the gradients the torch AdamW steps with, seen by a step pre-hook. Under ZeRO 1-3 DeepSpeed wraps
    our AdamW (`engine.optimizer.optimizer`, over its flat fp32 partitions) and calls its `step()` after clipping."""
    inner = engine.optimizer if engine.config.zero_stage == 0 else engine.optimizer.optimizer
    assert isinstance(inner, torch.optim.AdamW)
    seen: list[float] = []

    def hook(optimizer, args, kwargs) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        seen.append(float(torch.nn.utils.get_total_norm(grads)))

    inner.register_step_pre_hook(hook)
    return seen


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def zero0(tiny_model) -> tuple[Stepped, dict[str, torch.Tensor]]:
    """The ZeRO-0 reference after one step, and its weights after a second step on the same batch."""
    engine = make_engine(tiny_model, 0)
    initial = engine.export_state_dict()
    metrics = engine.train_step(fixed_batch())
    weights = engine.export_state_dict()
    # the step moved the weights: AdamW's first step is ≈ lr·sign(g) = 1e-2 per element, 1000 × the tolerance
    assert max(float((weights[name] - initial[name]).abs().max()) for name in initial) > 5e-3
    engine.train_step(fixed_batch())
    return Stepped(engine, metrics, weights, []), engine.export_state_dict()


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda stage: f"zero{stage}")
def stepped(request, tiny_model) -> Stepped:
    engine = make_engine(tiny_model, request.param)
    seen = record_stepped_grad_norms(engine)
    metrics = engine.train_step(fixed_batch())
    return Stepped(engine, metrics, engine.export_state_dict(), seen)


def test_loss_metrics_match_zero0(stepped, zero0):
    reference = zero0[0].metrics
    without_norm = {k: v for k, v in stepped.metrics.items() if k != "grad_norm"}
    assert without_norm == pytest.approx({k: v for k, v in reference.items() if k != "grad_norm"}, rel=1e-5)


def test_grad_norm_is_the_pre_clip_norm_and_adamw_gets_clipped_gradients(stepped, zero0):
    pre_clip = stepped.metrics["grad_norm"]
    assert pre_clip == pytest.approx(zero0[0].metrics["grad_norm"], rel=1e-4)  # ≈ 5.577, not the clipped 1e-3
    # DeepSpeed scales by max_norm / (norm + 1e-6), as clip_grad_norm_ does; the hook's float32 norm of the
    # clipped gradients is ~1e-5 low (float32 rounding over 115k elements, measured), well inside rel=1e-4
    assert len(stepped.stepped_grad_norms) == 1
    assert stepped.stepped_grad_norms[0] == pytest.approx(pre_clip * MAX_GRAD_NORM / (pre_clip + 1e-6), rel=1e-4)


def test_updated_weights_match_zero0(stepped, zero0):
    torch.testing.assert_close(stepped.weights, zero0[0].weights, **WEIGHTS_TOL)


def test_save_hf_reloads_with_the_same_weights(stepped, tmp_path):
    from transformers import AutoModelForCausalLM

    out = stepped.engine.save_hf(tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    torch.testing.assert_close(reloaded, stepped.weights, atol=0, rtol=0)  # float32 through safetensors: exact


@pytest.mark.long
def test_checkpoint_restores_weights_and_optimizer(stepped, zero0, tiny_model, tmp_path):
    stepped.engine.save_checkpoint(tmp_path / "ckpt", "step_1")
    resumed = make_engine(tiny_model, stepped.engine.config.zero_stage)
    resumed.load_checkpoint(tmp_path / "ckpt", "step_1")
    assert resumed.step == 1
    torch.testing.assert_close(resumed.export_state_dict(), stepped.weights, atol=0, rtol=0)
    # the next step needs AdamW's moments back (without them it would be a first step again, ≈ lr·sign(g) away)
    resumed.train_step(fixed_batch())
    torch.testing.assert_close(resumed.export_state_dict(), zero0[1], **WEIGHTS_TOL)
