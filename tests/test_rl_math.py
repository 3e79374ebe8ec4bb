"""Advantage estimators and policy losses of `nemo_gym.rl`: worked examples by hand, then against TRL.

Hand examples use ε_low = 0.2, ε_high = 0.28 (the LossConfig defaults) and single-token rollouts where that keeps
the arithmetic short. "grad" is d loss / d logprobs; for -r·A, d/d logp = -r·A since dr/dlogp = r.
"""

from __future__ import annotations

import math

import pytest
import torch

from nemo_gym.rl import (
    LossConfig,
    compute_advantages,
    masked_mean,
    policy_loss,
    token_entropy,
    token_logprobs,
    zero_variance_groups,
)

LN = math.log


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected), atol=atol, rtol=0)


def _single_tokens(ratios, advantages, **cfg):
    """Rollouts of one token each, logprobs = log(ratio) and old_logprobs = 0, so r = ratio."""
    logprobs = torch.tensor([[LN(r)] for r in ratios], requires_grad=True)
    old = torch.zeros_like(logprobs)
    mask = torch.ones_like(logprobs)
    loss, metrics = policy_loss(logprobs, old, torch.tensor(advantages), mask, LossConfig(**cfg))
    loss.backward()
    return loss, metrics, logprobs.grad.squeeze(1)


# ---------------------------------------------------------------- advantages


def test_grpo_advantage_worked_example():
    # group 1 [1, 0, 0, 1]: mean 0.5, unbiased var (4 × 0.25) / 3 = 1/3, std 0.577350, 0.5 / 0.577350 = 0.866025
    # group 2 all 0.5: r - mean = 0, std 0 → 0 / (0 + eps) = 0 (not NaN)
    adv = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]), "grpo")
    _close(adv, [[0.866025, -0.866025, -0.866025, 0.866025], [0.0, 0.0, 0.0, 0.0]])


def test_dr_grpo_advantage_worked_example():
    # [3, 1, 2]: mean 2 → [1, -1, 0]; no std division
    _close(compute_advantages(torch.tensor([[3.0, 1.0, 2.0]]), "dr_grpo"), [[1.0, -1.0, 0.0]])


def test_rloo_advantage_worked_example():
    # [3, 1, 2]: 3 - mean(1, 2) = 1.5; 1 - mean(3, 2) = -1.5; 2 - mean(3, 1) = 0
    _close(compute_advantages(torch.tensor([[3.0, 1.0, 2.0]]), "rloo"), [[1.5, -1.5, 0.0]])


def test_reinforce_pp_advantage_uses_batch_std_not_group_std():
    # groups [1, 0] and [1, 1] → centred [[0.5, -0.5], [0, 0]]
    # batch std of (0.5, -0.5, 0, 0): mean 0, Σx² = 0.5, unbiased var 0.5 / 3 = 1/6, std 0.408248
    # 0.5 / 0.408248 = 1.224745; grpo would divide group 1 by its own std 0.707107 instead → 0.707107
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    _close(compute_advantages(rewards, "reinforce_pp"), [[1.224745, -1.224745], [0.0, 0.0]])
    _close(compute_advantages(rewards, "grpo"), [[0.707107, -0.707107], [0.0, 0.0]])


def test_zero_variance_groups():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.3, 0.3, 0.3 + 1e-10]])
    assert zero_variance_groups(rewards).tolist() == [True, False, True]


@pytest.mark.parametrize(
    "rewards, estimator",
    [
        (torch.tensor([1.0, 0.0]), "grpo"),  # not 2-D
        (torch.tensor([[1.0], [0.0]]), "grpo"),  # group of 1: no baseline
        (torch.tensor([[1.0, float("nan")]]), "grpo"),  # failed rollout must be dropped, not NaN
        (torch.tensor([[1.0, 0.0]]), "ppo"),  # unknown estimator
    ],
)
def test_advantage_input_errors(rewards, estimator):
    with pytest.raises(ValueError):
        compute_advantages(rewards, estimator)


# ---------------------------------------------------------------- log-probs and entropy


def test_token_logprobs_and_entropy_worked_example():
    # logits [0, ln 3] → p = [1/4, 3/4]; log p(token 1) = ln 0.75 = -0.287682
    # uniform logits over 4 → H = ln 4 = 1.386294; [0, ln 3] → H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    logits = torch.tensor([[[0.0, LN(3.0), -1e9, -1e9], [0.0, 0.0, 0.0, 0.0]]])
    _close(token_logprobs(logits, torch.tensor([[1, 2]])), [[-0.287682, -1.386294]])
    _close(token_entropy(logits), [[0.562335, 1.386294]])


def test_token_logprobs_stable_for_huge_logits_and_bf16():
    logits = torch.tensor([[[1000.0, 0.0]]])
    _close(token_logprobs(logits, torch.tensor([[1]])), [[-1000.0]])
    _close(token_entropy(logits), [[0.0]])
    assert token_logprobs(logits.bfloat16(), torch.tensor([[0]])).dtype == torch.float32


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    _close(masked_mean(values, mask), 2.0)  # (1 + 2 + 3) / 3
    _close(masked_mean(values, mask, dim=1), [1.5, 3.0])
    _close(masked_mean(values, torch.zeros_like(mask)), 0.0)


# ---------------------------------------------------------------- losses by hand


def test_ppo_clip_higher_all_four_regions():
    # per token: -min(r A, clip(r, 0.8, 1.28) A)
    #   r 1.5,  A +1: min(1.5, 1.28)   = 1.28  → -1.28, clipped high, grad 0
    #   r 0.5,  A +1: min(0.5, 0.8)    = 0.5   → -0.5,  grad -0.5
    #   r 0.5,  A -1: min(-0.5, -0.8)  = -0.8  → +0.8,  clipped low, grad 0
    #   r 1.5,  A -1: min(-1.5, -1.28) = -1.5  → +1.5,  grad +1.5
    #   r 1.25, A +1: inside [0.8, 1.28] → -1.25, grad -1.25 (symmetric ε = 0.2 would clip it at 1.2)
    # token mean: (-1.28 - 0.5 + 0.8 + 1.5 - 1.25) / 5 = -0.73 / 5 = -0.146; grads / 5
    loss, m, grad = _single_tokens([1.5, 0.5, 0.5, 1.5, 1.25], [1.0, 1.0, -1.0, -1.0, 1.0])
    _close(loss, -0.146)
    _close(grad, [0.0, -0.1, 0.0, 0.3, -0.25])
    _close([m["clip_fraction_low"], m["clip_fraction_high"]], [0.2, 0.2])
    _close([m["ratio_mean"], m["ratio_max"], m["ratio_min"]], [1.05, 1.5, 0.5])  # (1.5+0.5+0.5+1.5+1.25)/5
    # symmetric clipping for contrast: r 1.25 now clipped at 1.2 → -1.2 and no gradient
    loss_sym, _, grad_sym = _single_tokens([1.25], [1.0], clip_eps_high=0.2)
    _close(loss_sym, -1.2)
    _close(grad_sym, [0.0])


def test_cispo_keeps_gradient_of_clipped_tokens():
    # logprobs [-1, -2], ratios [1.5, 0.5] (old = logp - ln r), A [+1, -1]
    # per token -sg(min(r, 1.28)) A logp: -(1.28)(1)(-1) = 1.28; -(0.5)(-1)(-2) = -1.0; mean 0.14
    # grad = -sg(w) A / 2: [-0.64, +0.25] — the capped token still gets a gradient (ppo would give 0)
    logprobs = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
    old = torch.tensor([[-1.0 - LN(1.5)], [-2.0 - LN(0.5)]])
    loss, m = policy_loss(logprobs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), LossConfig(loss_type="cispo"))
    loss.backward()
    _close(loss, 0.14)
    _close(logprobs.grad.squeeze(1), [-0.64, 0.25])
    _close(m["clip_fraction_high"], 0.5)


def test_gspo_sequence_ratio_and_clipping():
    # rollout 1: token log-ratios [ln 2, 0] → s = exp(ln 2 / 2) = √2 = 1.414214 > 1.28, A +1 → -1.28, grad 0
    # rollout 2: log-ratios [0.1, -0.1] → s = exp(0) = 1, A -1 → +1.0; d/dlogp_t (-s A) = s / |o| = 0.5 per token
    # sequence normalisation: (-1.28 + 1.0) / 2 = -0.14; grads of rollout 2: 0.5 / 2 = 0.25
    # (token-level ppo would clip only rollout 1's first token: r = 2 and 1)
    logprobs = torch.tensor([[LN(2.0), 0.0], [0.1, -0.1]], requires_grad=True)
    cfg = LossConfig(loss_type="gspo", normalization="sequence")
    loss, m = policy_loss(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), cfg)
    loss.backward()
    _close(loss, -0.14)
    _close(logprobs.grad, [[0.0, 0.0], [0.25, 0.25]])
    _close([m["clip_fraction_high"], m["ratio_max"]], [0.5, 1.414214])


def test_importance_sampling_loss_is_unclipped():
    # -r A with r [2, 0.5], A [1, 1]: mean(-2, -0.5) = -1.25; grads -r A / 2 = [-1, -0.25]
    loss, m, grad = _single_tokens([2.0, 0.5], [1.0, 1.0], loss_type="importance_sampling")
    _close(loss, -1.25)
    _close(grad, [-1.0, -0.25])
    assert m["clip_fraction_high"] == m["clip_fraction_low"] == 0.0


def test_tis_weight_is_capped_and_detached():
    # on-policy (r = 1), A = 1; old - rollout = [ln 3, ln 0.5, 0] → weights [3, 0.5, 1] → cap 2 → [2, 0.5, 1]
    # per token -w: mean (-2 - 0.5 - 1) / 3 = -1.166667; grads -w / 3; mean weight 3.5 / 3; 1 of 3 capped
    logprobs = torch.zeros(3, 1, requires_grad=True)
    rollout = torch.tensor([[-LN(3.0)], [-LN(0.5)], [0.0]])
    loss, m = policy_loss(
        logprobs, logprobs.detach(), torch.ones(3), torch.ones(3, 1), LossConfig(tis_cap=2.0), rollout_logprobs=rollout
    )
    loss.backward()
    _close(loss, -3.5 / 3)
    _close(logprobs.grad.squeeze(1), [-2 / 3, -0.5 / 3, -1 / 3])
    _close([m["tis_weight_mean"], m["tis_fraction_capped"]], [3.5 / 3, 1 / 3])
    _close([m["rollout_logprob_abs_diff_max"]], [LN(3.0)])
    # tis_cap=None: no weight, only the mismatch is logged
    loss_off, m_off = policy_loss(
        logprobs, logprobs.detach(), torch.ones(3), torch.ones(3, 1), LossConfig(tis_cap=None), rollout_logprobs=rollout
    )
    _close(loss_off, -1.0)
    assert "tis_weight_mean" not in m_off and "rollout_logprob_abs_diff_mean" in m_off


def test_k3_kl_value_and_gradient():
    # logp = ln 0.5, ref = ln 0.25: δ = ref - logp = ln 0.5 = -0.693147
    # k3 = e^δ - δ - 1 = 0.5 + 0.693147 - 1 = 0.193147; with A = 0, loss = 0.1 × 0.193147 = 0.0193147
    # d k3 / d logp = -e^δ + 1 = 0.5 → grad 0.1 × 0.5 = 0.05
    logprobs = torch.tensor([[LN(0.5)]], requires_grad=True)
    loss, m = policy_loss(
        logprobs,
        logprobs.detach(),
        torch.zeros(1),
        torch.ones(1, 1),
        LossConfig(kl_coef=0.1),
        ref_logprobs=torch.tensor([[LN(0.25)]]),
    )
    loss.backward()
    _close(m["kl"], 0.193147)
    _close(loss, 0.0193147)
    _close(logprobs.grad, [[0.05]])


def test_entropy_bonus():
    # A = 0; entropies [1, 2] → token mean 1.5; loss = -0.01 × 1.5 = -0.015
    entropy = torch.tensor([[1.0, 2.0]], requires_grad=True)
    logprobs = torch.zeros(1, 2, requires_grad=True)
    cfg = LossConfig(entropy_coef=0.01)
    loss, m = policy_loss(logprobs, logprobs.detach(), torch.zeros(1), torch.ones(1, 2), cfg, entropy=entropy)
    loss.backward()
    _close(loss, -0.015)
    _close(m["entropy"], 1.5)
    _close(entropy.grad, [[-0.005, -0.005]])


def test_token_vs_sequence_normalisation_with_different_lengths():
    # on-policy importance_sampling: per-token loss -A. Rollout 1: 1 token, A +1; rollout 2: 3 tokens, A -1
    # token:    (-1 + 1 + 1 + 1) / 4 tokens          = 0.5
    # sequence: (-1 / 1 + 3 / 3) / 2 sequences       = 0.0
    logprobs = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    for normalization, expected in (("token", 0.5), ("sequence", 0.0)):
        cfg = LossConfig(loss_type="importance_sampling", normalization=normalization)
        loss, _ = policy_loss(logprobs, logprobs.detach(), adv, mask, cfg)
        _close(loss, expected)


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_micro_batches_with_global_counts_equal_one_big_batch(normalization):
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(4, 6, generator=gen) * 3).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(4, 6, generator=gen)
    rollout = old + 0.1 * torch.randn(4, 6, generator=gen)
    adv = torch.randn(4, generator=gen)
    lengths = torch.tensor([6, 1, 4, 2])  # micro-batch 1 has 7 tokens, micro-batch 2 has 6
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    cfg = LossConfig(normalization=normalization)
    kw = {"num_tokens_global": mask.sum().item(), "num_sequences_global": 4.0}

    big, _ = policy_loss(logprobs, old, adv, mask, cfg, rollout_logprobs=rollout)
    (big_grad,) = torch.autograd.grad(big, logprobs)
    parts = [
        policy_loss(logprobs[s], old[s], adv[s], mask[s], cfg, rollout_logprobs=rollout[s], **kw)[0]
        for s in (slice(0, 2), slice(2, 4))
    ]
    (acc_grad,) = torch.autograd.grad(parts[0] + parts[1], logprobs)
    _close(parts[0] + parts[1], big.item(), atol=1e-6)
    torch.testing.assert_close(acc_grad, big_grad, atol=1e-7, rtol=0)

    # the test can fail: averaging micro-batches normalised by their own counts is not the big-batch loss
    local = [policy_loss(logprobs[s], old[s], adv[s], mask[s], cfg)[0] for s in (slice(0, 2), slice(2, 4))]
    big_no_tis, _ = policy_loss(logprobs, old, adv, mask, cfg)
    if normalization == "token":
        assert abs((local[0] + local[1]).item() / 2 - big_no_tis.item()) > 1e-3


def test_per_token_advantages_equal_broadcast_ones_when_constant_per_row():
    """[batch, seq] advantages (on-policy distillation) that are constant along each row give the [batch] loss."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]], requires_grad=True)
    old = torch.tensor([[-1.2, -2.0, -0.4], [-0.3, -0.9, -1.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    for loss_type in ("importance_sampling", "ppo"):
        config = LossConfig(loss_type=loss_type, tis_cap=None)
        per_row, _ = policy_loss(logprobs, old, torch.tensor([1.0, -0.5]), mask, config)
        per_token, _ = policy_loss(logprobs, old, torch.tensor([[1.0] * 3, [-0.5] * 3]), mask, config)
        assert per_token.item() == pytest.approx(per_row.item())
    # importance_sampling, token mean over 2 tokens: A = [[2, -1]], ratios exp(0) = 1 → -(1·2 + 1·(-1)) / 2 = -0.5
    loss, _ = policy_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.tensor([[2.0, -1.0]]),
        torch.ones(1, 2),
        LossConfig(loss_type="importance_sampling", tis_cap=None),
    )
    assert loss.item() == pytest.approx(-0.5)


def test_policy_loss_input_errors():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="kl_coef"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy_coef"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), LossConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(3), torch.ones(2, 3), LossConfig())
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(2, 4), torch.ones(2, 3), LossConfig())
    with pytest.raises(ValueError, match="mask"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 4), LossConfig())
    with pytest.raises(ValueError):
        LossConfig(loss_type="grpo")  # type: ignore[arg-type]


# ---------------------------------------------------------------- against TRL's GRPOTrainer._compute_loss
#
# TRL's loss lives in `GRPOTrainer._compute_loss(model, inputs)`, which recomputes the log-probs with the model.
# So we build a real GRPOTrainer around a tiny randomly initialised Llama (no download) and a word-level
# tokenizer built in memory, hand `_compute_loss` the same random batch (old log-probs, vLLM log-probs via the
# TIS ratio, reference log-probs, advantages, masks of different lengths), and compare its loss and the model's
# parameter gradients with ours computed from `token_logprobs` of the same model. Between cases we switch the
# plain attributes `_compute_loss` reads (`loss_type`, `importance_sampling_level`, `beta`, ...); the trainer's
# generation path is never run.

PROMPT_LEN, COMPLETION_LEN, BATCH, VOCAB = 3, 5, 4, 34


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    pytest.importorskip("trl")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<pad>": VOCAB - 2, "<eos>": VOCAB - 1}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=VOCAB - 2,
        eos_token_id=VOCAB - 1,
    )
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        per_device_train_batch_size=BATCH,
        num_generations=BATCH,
        max_completion_length=COMPLETION_LEN,
        epsilon=0.2,
        epsilon_high=0.28,
        report_to=[],
        use_cpu=True,
        logging_strategy="no",
        save_strategy="no",
        bf16=False,  # fp32 on both sides (TRL defaults to bf16)
    )
    trainer = GRPOTrainer(
        model=LlamaForCausalLM(config),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "t1 t2"}] * BATCH),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _trl_batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, VOCAB - 2, (BATCH, PROMPT_LEN), generator=gen)
    completion_ids = torch.randint(0, VOCAB - 2, (BATCH, COMPLETION_LEN), generator=gen)
    lengths = torch.tensor([5, 2, 4, 1])
    completion_mask = (torch.arange(COMPLETION_LEN)[None, :] < lengths[:, None]).long()
    noise = torch.randn(3, BATCH, COMPLETION_LEN, generator=gen)
    return prompt_ids, completion_ids, completion_mask, torch.randn(BATCH, generator=gen), noise


def _our_logprobs(model, prompt_ids, completion_ids, completion_mask):
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([torch.ones_like(prompt_ids), completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    positions = slice(PROMPT_LEN - 1, -1)  # logits at t predict token t + 1
    return logits[:, positions], token_logprobs(logits[:, positions], completion_ids)


def _grads(model):
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


TRL_CASES = {
    # id: (our LossConfig kwargs, TRL attributes, what the case shows)
    "ppo_token_global=dapo": (dict(normalization="token"), dict(loss_type="dapo")),
    "ppo_token_local=bnpo": (dict(normalization="token"), dict(loss_type="bnpo")),
    "ppo_sequence=grpo": (dict(normalization="sequence"), dict(loss_type="grpo")),
    "gspo_sequence=grpo_sequence_level": (
        dict(loss_type="gspo", normalization="sequence"),
        dict(loss_type="grpo", importance_sampling_level="sequence"),
    ),
    "cispo_token_global=cispo": (dict(loss_type="cispo"), dict(loss_type="cispo", epsilon_high=1.28)),
    "ppo_tis_kl=dapo_vllm_is_beta": (
        dict(tis_cap=2.0, kl_coef=0.04),
        dict(loss_type="dapo", beta=0.04, use_vllm=True, vllm_importance_sampling_correction=True),
    ),
    "ppo_entropy=bnpo_entropy_coef": (
        dict(entropy_coef=0.01),
        dict(loss_type="bnpo", entropy_coef=0.01, _entropy_bonus_enabled=True),
    ),
}


@pytest.mark.parametrize("case", list(TRL_CASES))
def test_policy_loss_matches_trl_grpo_trainer(trl_trainer, case):
    ours_cfg, trl_attrs = TRL_CASES[case]
    trainer, model = trl_trainer, trl_trainer.model
    defaults = dict(
        loss_type="dapo",
        importance_sampling_level="token",
        beta=0.0,
        use_vllm=False,
        epsilon_high=0.28,
        vllm_importance_sampling_correction=False,
        entropy_coef=0.0,
        _entropy_bonus_enabled=False,
    )
    for name, value in (defaults | trl_attrs).items():
        setattr(trainer, name, value)
    # TRL >= 1.x multiplies the k3 term by the ratio by default (DeepSeek-V3.2 "unbiased KL"); we keep the plain
    # k3 of DeepSeekMath Eq. 4, which is TRL's use_bias_correction_kl=False.
    trainer.args.use_bias_correction_kl = False

    prompt_ids, completion_ids, completion_mask, advantages, noise = _trl_batch(seed=len(case))
    logits, logprobs = _our_logprobs(model, prompt_ids, completion_ids, completion_mask)
    old = logprobs.detach() + 0.3 * noise[0]  # ratios spread over roughly [0.4, 2.5]: both clips are hit
    rollout = old + 0.5 * noise[1]  # vLLM mismatch: some TIS weights above the cap 2.0
    ref = logprobs.detach() + 0.2 * noise[2]
    mask = completion_mask.float()
    cfg = LossConfig(**(dict(tis_cap=None) | ours_cfg))
    ours, metrics = policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        cfg,
        rollout_logprobs=rollout if cfg.tis_cap else None,
        ref_logprobs=ref if cfg.kl_coef else None,
        entropy=token_entropy(logits) if cfg.entropy_coef else None,
        num_tokens_global=mask.sum().item() if trl_attrs["loss_type"] in ("dapo", "cispo") else None,
    )
    ours.backward()
    our_grads = _grads(model)
    assert 0.0 < metrics["clip_fraction_low"] + metrics["clip_fraction_high"] < 1.0 or cfg.loss_type == "gspo"

    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
        # TRL computes this in `_generate_and_score_completions` (mode "token_truncate", no lower clip):
        "importance_sampling_ratio": torch.clamp(torch.exp(old - rollout), max=2.0),
    }
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = _grads(model)

    torch.testing.assert_close(ours.detach(), theirs.detach(), atol=1e-6, rtol=1e-5)
    assert len(our_grads) == len(their_grads) > 0
    for mine, trl_grad in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(mine, trl_grad, atol=1e-7, rtol=1e-5)
