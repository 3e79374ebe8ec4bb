"""The DeepSpeed policy engine (nemo_gym.train.engine) on a tiny random Llama built from a config (no downloads)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from nemo_gym.train.batch import TrainingSequence, collate  # noqa: E402
from nemo_gym.train.config import EngineConfig, LoraOptions, LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine, lr_lambda  # noqa: E402


def make_tiny_model(path, *, tie: bool = True, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def fixed_batch():
    """Sequence 0 (advantage +1) and sequence 1 (advantage -1) share a prompt and differ in the generation."""
    good = TrainingSequence([1, 2, 3, 10, 11, 12], [0, 0, 0, 1, 1, 1], [-6.0, -6.0, -6.0, -6.0, -6.0, -6.0])
    bad = TrainingSequence([1, 2, 3, 20, 21], [0, 0, 0, 1, 1], [-6.0] * 5)
    third = TrainingSequence([1, 2, 3, 30], [0, 0, 0, 1], [-6.0] * 4)
    return collate([good, bad, third], [1.0, -1.0, 0.0])


def engine_config(path, **overrides) -> EngineConfig:
    values = {"model_path": str(path), "learning_rate": 1e-2, "micro_batch_size": 2, "seed": 0, **overrides}
    return EngineConfig(**values)


def masked_mean_logprob(engine: PolicyEngine, batch, row: int) -> float:
    logprobs = engine.logprobs(batch)
    mask = batch.loss_mask[row]
    return float((logprobs[row] * mask).sum() / mask.sum())


def surrogate(engine: PolicyEngine, batch) -> float:
    """The REINFORCE objective the step minimises: -Σ A·log π(token) / number of generated tokens."""
    logprobs = engine.logprobs(batch)
    return float(-(batch.advantages[:, None] * logprobs * batch.loss_mask).sum() / batch.loss_mask.sum())


def test_step_moves_weights_toward_rewarded_tokens(tiny_model):
    engine = PolicyEngine(engine_config(tiny_model), LossOptions(tis_cap=None))
    batch = fixed_batch()
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    good0, bad0, loss0 = (
        masked_mean_logprob(engine, batch, 0),
        masked_mean_logprob(engine, batch, 1),
        surrogate(engine, batch),
    )
    metrics = [engine.train_step(batch) for _ in range(3)]
    assert any(not torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    assert masked_mean_logprob(engine, batch, 0) > good0 + 0.1  # the +1 generation got likelier
    assert masked_mean_logprob(engine, batch, 1) < bad0 - 0.1  # the -1 generation got less likely
    assert surrogate(engine, batch) < loss0 - 0.1
    assert metrics[0]["num_tokens"] == 6 and metrics[0]["num_sequences"] == 3
    assert metrics[0]["grad_norm"] > 0 and metrics[0]["learning_rate"] == pytest.approx(1e-2)
    assert engine.step == 3


def test_checkpoint_resume_continues_exactly(tiny_model, tmp_path):
    batch = fixed_batch()
    config = engine_config(tiny_model, warmup_steps=2, lr_schedule="cosine", total_steps=6)
    first = PolicyEngine(config, LossOptions())
    first.train_step(batch)
    first.train_step(batch)
    first.save_checkpoint(tmp_path / "ckpt", "step_2")
    first.train_step(batch)

    resumed = PolicyEngine(config, LossOptions())
    resumed.load_checkpoint(tmp_path / "ckpt", "step_2")
    assert resumed.step == 2
    assert resumed.scheduler.get_last_lr() == pytest.approx(
        [1e-2 * lr_lambda(2, warmup_steps=2, total_steps=6, schedule="cosine")]
    )
    resumed.train_step(batch)
    for (name, a), (_, b) in zip(first.module.named_parameters(), resumed.module.named_parameters()):
        assert torch.equal(a, b), name
    state_a, state_b = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys() and state_a
    for key in state_a:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state_a[key][field], state_b[key][field]), (key, field)


def test_save_hf_is_untied_and_reloads_identically(tiny_model, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    engine = PolicyEngine(engine_config(tiny_model), LossOptions())
    engine.train_step(fixed_batch())
    out = engine.save_hf(tmp_path / "hf")
    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        assert "lm_head.weight" in handle.keys()
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = fixed_batch().input_ids
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, engine.module(input_ids=ids).logits, atol=1e-6)


def test_lora_trains_adapters_only_and_exports_merged(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = PolicyEngine(engine_config(tiny_model, lora=LoraOptions(rank=4, alpha=8)), LossOptions())
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    batch = fixed_batch()
    good0 = masked_mean_logprob(engine, batch, 0)
    for _ in range(3):
        engine.train_step(batch)
    assert masked_mean_logprob(engine, batch, 0) > good0
    out = engine.save_hf(tmp_path / "merged")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any("lora" in name for name in reloaded.state_dict())
    with torch.no_grad():
        assert torch.allclose(
            reloaded(input_ids=batch.input_ids).logits, engine.module(input_ids=batch.input_ids).logits, atol=1e-5
        )


def test_lr_schedule_warms_up_then_decays():
    values = [lr_lambda(s, warmup_steps=3, total_steps=13, schedule="linear") for s in range(14)]
    assert values[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # (s + 1) / (warmup + 1), then peak
    assert values[8] == pytest.approx(0.5) and values[13] == 0.0  # 1 - (8 - 3) / 10
    assert lr_lambda(8, warmup_steps=3, total_steps=13, schedule="cosine") == pytest.approx(0.5)


# -- gradient clipping (ZeRO 0, float32: PolicyEngine._clip_gradients, an AdamW step pre-hook) ---------------------
def reference_grad_norm(model_path, batch) -> float:
    """Global L2 norm of the step's gradient, computed on a plain HF copy of the model without DeepSpeed.

    With `tis_cap=None`, no KL and no entropy bonus, the PPO loss at ratio 1 has the gradient of the REINFORCE
    surrogate -Σ A·log π(token) / (generated tokens), so that is the loss here (log-probs by hand, no nemo_gym.rl).
    For `fixed_batch`: -(1·Σ log π(good, 3 tokens) - 1·Σ log π(bad, 2 tokens) + 0·log π(third, 1 token)) / 6.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]  # [B, T-1, V]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]  # [B, T-1]
    loss = -(batch.advantages[:, None] * logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
    loss.backward()
    return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))


def record_grad_norm_at_step(engine: PolicyEngine) -> list[float]:
    """Norms of the gradients AdamW steps with: a step pre-hook registered after the engine's own, so it runs
    after `_clip_gradients` (hooks run in registration order). With ZeRO 0 in float32, DeepSpeed hands back the
    plain torch AdamW as `engine.optimizer` (no wrapper), so this is the optimizer that updates the weights."""
    assert isinstance(engine.optimizer, torch.optim.AdamW)
    seen: list[float] = []

    def hook(optimizer, args, kwargs) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        seen.append(float(torch.nn.utils.get_total_norm(grads)))

    engine.optimizer.register_step_pre_hook(hook)
    return seen


def test_grad_norm_is_the_norm_before_clipping(tiny_model):
    # The real norm is ≈ 5.577 (measured; ≥ 0.1 asserted) and max_grad_norm is 1e-3, so a post-clip norm
    # (≈ 1e-3) returned by mistake would miss by 99.98 %; the pre-clip one matches the plain-model norm to float32
    # noise.
    batch = fixed_batch()
    expected = reference_grad_norm(tiny_model, batch)
    assert expected > 100 * 1e-3
    engine = PolicyEngine(engine_config(tiny_model, max_grad_norm=1e-3), LossOptions(tis_cap=None))
    metrics = engine.train_step(batch)  # micro-batches [good, bad] and [third] accumulate to the same gradient
    assert metrics["grad_norm"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6], ids=["clips", "no-op"])
def test_adamw_steps_with_clipped_gradients(tiny_model, max_grad_norm):
    # AdamW's first step is lr·m̂/(√v̂ + eps) ≈ lr·sign(g): it hides the gradient's scale, so look at the
    # gradients AdamW is handed instead. clip_grad_norm_ multiplies them by min(1, max_norm / (norm + 1e-6)):
    #   clips: norm n ≈ 5.577 → coefficient 1e-3 / 5.577001 → stepped norm 5.577·1e-3/5.577001 ≈ 9.9999982e-4
    # (= max_norm up to the 1e-6 guard: relative gap 1e-6 / n, ≤ 1e-5 for n ≥ 0.1; the exact formula is checked)
    #   no-op: 1e6 / (n + 1e-6) > 1 → coefficient 1 → stepped norm n, gradients untouched
    engine = PolicyEngine(engine_config(tiny_model, max_grad_norm=max_grad_norm), LossOptions(tis_cap=None))
    seen = record_grad_norm_at_step(engine)
    pre_clip = engine.train_step(fixed_batch())["grad_norm"]
    assert pre_clip > 0.1 and len(seen) == 1  # one optimizer step, one look at its gradients
    assert seen[0] == pytest.approx(pre_clip * min(1.0, max_grad_norm / (pre_clip + 1e-6)), rel=1e-5)
    assert seen[0] == pytest.approx(min(max_grad_norm, pre_clip), rel=1e-4)  # the headline: min(max_norm, norm)


def test_weight_sync_hands_the_server_an_absolute_folder(tiny_model, tmp_path, monkeypatch):
    """A relative output_dir (the templates' `results/train`) must still reach vllm_model as an absolute path: the
    server runs in another folder and refuses relative ones (422)."""
    from nemo_gym.train.weight_sync import FilesystemWeightSync

    monkeypatch.chdir(tmp_path)
    reloaded = []
    engine = PolicyEngine(engine_config(tiny_model), LossOptions())
    folder = FilesystemWeightSync("results/train/weights", reloaded.append).push(engine, step=1)
    assert reloaded == [tmp_path / "results" / "train" / "weights" / "step_000001"] == [folder]
    assert (folder / "model.safetensors").is_file()


def test_the_head_runs_from_the_first_trained_position_with_the_same_step(tiny_model):
    """`_target_logprobs` keeps the LM head from the batch's first trained column on (`logits_to_keep`): the log-probs
    there, the loss, the gradient and the step are those of the full [T, V] head; before it they are 0."""
    from nemo_gym.train.engine import first_target

    batch = fixed_batch()
    assert first_target(batch.loss_mask) == 2  # targets input_ids[:, 1:]; the generation starts at token 3
    assert first_target(torch.zeros(2, 5)) == 0
    kept, full = (PolicyEngine(engine_config(tiny_model), LossOptions(entropy_coef=0.01)) for _ in range(2))
    full._keeps_logits = False  # the slicing fallback (a model without logits_to_keep): every position's logits
    assert kept._keeps_logits
    with torch.no_grad():
        every = kept.logprobs(batch)
        ours, entropy = kept._target_logprobs(kept.module, batch, entropy=True)
    assert torch.allclose(ours * batch.loss_mask, every * batch.loss_mask, atol=1e-6)
    assert not ours[:, :2].any() and not entropy[:, :2].any() and entropy[:, 2:].gt(0).all()
    metrics_kept, metrics_full = kept.train_step(batch), full.train_step(batch)
    assert metrics_kept["grad_norm"] == pytest.approx(metrics_full["grad_norm"], rel=1e-5)
    for (name, a), (_, b) in zip(kept.module.named_parameters(), full.module.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
