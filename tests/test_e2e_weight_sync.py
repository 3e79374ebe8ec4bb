"""End to end: vLLM's log-probs agree with the trainer's, and weight sync changes what vLLM serves.

One vllm_model server (embedded SmolLM2-135M, vLLM in float32; the session's `smollm2_vllm`, tests/conftest.py,
shared with tests/test_e2e_vllm.py) and one `PolicyEngine` on the same converted HF folder (float32) serve every test
of the module:
- agreement: vLLM generates with token information; the trainer's log-probs of exactly those generated ids
  (`PolicyEngine.logprobs`) match vLLM's `generation_log_probs`;
- weight sync: the engine's `lm_head` is scaled, `FilesystemWeightSync.push` writes the folder (`save_hf`) and
  calls `POST /reload_weights`; vLLM's log-probs then match the modified model and not the original; reloading
  the original folder brings the original log-probs back;
- multi-turn exactness: a three-turn rollout's training sequence is, token by token, the ids and
  log-probs the model server returned for its calls, tool outputs masked out; its first step's importance ratio
  (trainer / sampler) is 1 within LOGPROB_TOLERANCE.

Tolerance: both sides compute in float32, but with different kernels (vLLM's CPU attention and GEMMs vs
PyTorch's) and summation orders; LOGPROB_TOLERANCE is the bound on max |Δ log-prob| over the generated tokens.
Run: `.venv/bin/python -m pytest tests/test_e2e_weight_sync.py -m e2e -q -s` (`-s` prints the measured figures).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from test_e2e_vllm import WEATHER_TOOL

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from nemo_gym.train.batch import TrainingSequence, collate, rollout_to_sequence  # noqa: E402
from nemo_gym.train.config import EngineConfig, LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402
from nemo_gym.train.weight_sync import FilesystemWeightSync, http_reloader  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 1200
LOGPROB_TOLERANCE = 1e-4
LM_HEAD_SCALE = 1.5  # logits × 1.5: same greedy tokens, clearly different log-probs
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def policy(smollm2_vllm) -> tuple[str, Path]:
    """(base URL of the session's vllm_model server in float32 (tests/conftest.py), the HF folder vLLM serves)."""
    return smollm2_vllm.url, smollm2_vllm.model_dir


@pytest.fixture(scope="module")
def engine(policy: tuple[str, Path]) -> PolicyEngine:
    """The trainer's policy on the folder vLLM serves (created after vLLM started: it sets RANK etc. in os.environ)."""
    return PolicyEngine(EngineConfig(model_path=str(policy[1]), dtype="float32", micro_batch_size=1), LossOptions())


def generate(url: str, temperature: float, max_tokens: int = 24) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, generation ids, vLLM's generation log-probs) of one chat completion of MESSAGES."""
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": temperature, "seed": 0}
    message = (
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
        .raise_for_status()
        .json()["choices"][0]["message"]
    )
    return message["prompt_token_ids"], message["generation_token_ids"], message["generation_log_probs"]


def trainer_logprobs(engine: PolicyEngine, prompt_ids: list[int], generation_ids: list[int]) -> torch.Tensor:
    """[n_gen] the engine's log-probs of exactly `generation_ids` after `prompt_ids`."""
    n_prompt, n_gen = len(prompt_ids), len(generation_ids)
    sequence = TrainingSequence(prompt_ids + generation_ids, [0] * n_prompt + [1] * n_gen, [0.0] * (n_prompt + n_gen))
    batch = collate([sequence], [0.0])
    return engine.logprobs(batch)[0][batch.loss_mask[0].bool()]


def max_diff(engine: PolicyEngine, generation: tuple[list[int], list[int], list[float]]) -> float:
    prompt_ids, generation_ids, vllm_logprobs = generation
    assert generation_ids and len(vllm_logprobs) == len(generation_ids)
    return float(
        (trainer_logprobs(engine, prompt_ids, generation_ids) - torch.tensor(vllm_logprobs, dtype=torch.float32))
        .abs()
        .max()
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_vllm_and_trainer_logprobs_agree_in_float32(policy, engine, temperature: float):
    generation = generate(policy[0], temperature)
    diff = max_diff(engine, generation)
    print(f"temperature {temperature}: {len(generation[1])} tokens, max |vLLM - trainer| log-prob = {diff:.2e}")
    assert diff < LOGPROB_TOLERANCE


def test_weight_sync_reload_changes_served_logprobs(policy, engine, tmp_path):
    url, original_dir = policy
    lm_head = engine.module.get_output_embeddings().weight
    original = lm_head.detach().clone()

    def set_lm_head(weight: torch.Tensor) -> None:
        with torch.no_grad():
            lm_head.copy_(weight)

    try:
        set_lm_head(original * LM_HEAD_SCALE)
        started = time.monotonic()
        step_dir = FilesystemWeightSync(tmp_path / "weights", http_reloader(url)).push(engine, step=1)
        print(f"save_hf + reload: {time.monotonic() - started:.1f} s")
        modified = generate(url, temperature=0.0)
        diff_modified = max_diff(engine, modified)
        set_lm_head(original)
        diff_to_original = max_diff(engine, modified)
        print(f"after reload of {step_dir.name}: vs modified {diff_modified:.2e}, vs original {diff_to_original:.2e}")
        assert diff_modified < LOGPROB_TOLERANCE
        assert diff_to_original > 1e-2  # vLLM no longer serves the original weights

        answer = (
            httpx.post(f"{url}/reload_weights", json={"model_dir": str(original_dir)}, timeout=600)
            .raise_for_status()
            .json()
        )
        assert answer["model_dir"] == str(original_dir) and answer["seconds"] > 0
        print(f"reload of the original folder: {answer['seconds']:.2f} s")
        diff_back = max_diff(engine, generate(url, temperature=0.0))
        print(f"after reloading the original: vs original {diff_back:.2e}")
        assert diff_back < LOGPROB_TOLERANCE
    finally:
        set_lm_head(original)


# -- multi-turn exactness ---------------------------------------------------------------------
def respond(url: str, items: list[dict], **params) -> list[dict]:
    """The output items of one `/v1/responses` call on `items` (earlier turns' items carry their token ids)."""
    body = {"input": items, "max_output_tokens": 32, "temperature": 1.0, **params}
    answer = httpx.post(f"{url}/v1/responses", json=body, timeout=300).raise_for_status().json()
    return answer["output"]


def assert_trained_on_exactly_the_sampled_ids(rollout: dict) -> TrainingSequence:
    """The rollout's training sequence, after checking it token by token against the model server's training
    information: the ids are the last call's prompt + generation, every call's generation ids sit at their own
    positions with the loss mask 1 and vLLM's log-probs, and every other position (prompt, tool output, the template's
    tokens between turns) has mask 0 and log-prob 0."""
    calls = [item for item in rollout["response"]["output"] if item.get("generation_token_ids") is not None]
    sequence = rollout_to_sequence(rollout)
    last = calls[-1]
    assert sequence.input_ids == last["prompt_token_ids"] + last["generation_token_ids"]
    expected_mask = [0] * len(sequence.input_ids)
    expected_logprobs = [0.0] * len(sequence.input_ids)
    for call in calls:
        start = len(call["prompt_token_ids"])
        generated = call["generation_token_ids"]
        assert (
            sequence.input_ids[start : start + len(generated)] == generated
        )  # the sampled ids, where they were sampled
        expected_mask[start : start + len(generated)] = [1] * len(generated)
        expected_logprobs[start : start + len(generated)] = call["generation_log_probs"]
    assert sequence.loss_mask == expected_mask
    assert sequence.rollout_logprobs == expected_logprobs
    assert sequence.num_generated_tokens == sum(len(call["generation_token_ids"]) for call in calls)
    return sequence


def test_three_turn_tool_rollout_trains_on_exactly_the_sampled_ids_with_tool_outputs_masked(policy):
    """Two tool calls (forced: SmolLM2 does not call tools by itself), their outputs, then a free answer: three
    model calls whose ids and log-probs are the training sequence's, token by token, and whose tool outputs lie
    in the masked spans between the turns."""
    url, model_dir = policy
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    items: list[dict] = [{"role": "user", "content": "What is the weather in Paris and in Lima?"}]
    outputs = []
    for turn, choice in enumerate(["required", "required", "auto"]):
        output = respond(url, items, tools=[WEATHER_TOOL], tool_choice=choice, max_output_tokens=48)
        items += output
        for call in (item for item in output if item["type"] == "function_call"):
            result = {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": json.dumps({"turn": turn, "weather": f"rain, 1{turn} C"}),
            }
            items.append(result)
            outputs.append(result["output"])
    rollout = {"response": {"output": items[1:]}}
    calls = [item for item in items if item.get("generation_token_ids") is not None]
    assert len(calls) == 3 and [c["type"] for c in calls[:2]] == ["function_call"] * 2, [c["type"] for c in calls]
    sequence = assert_trained_on_exactly_the_sampled_ids(rollout)
    for k, tool_output in enumerate(outputs):  # the tool's answer is in the masked span after call k
        span_start = len(calls[k]["prompt_token_ids"]) + len(calls[k]["generation_token_ids"])
        span = sequence.input_ids[span_start : len(calls[k + 1]["prompt_token_ids"])]
        assert set(sequence.loss_mask[span_start : span_start + len(span)]) == {0}
        assert tool_output in tokenizer.decode(span), tokenizer.decode(span)


def test_first_step_importance_ratio_is_one_on_a_three_turn_rollout(policy, engine):
    """Three freely sampled turns with the environment's feedback between them (unconstrained sampling: a forced
    tool call samples from the grammar-masked distribution, whose log-probs are not the policy's): on the first
    step the trainer's log-probs of the trajectory reproduce vLLM's, so the importance ratio trainer / sampler (the
    TIS weight) is 1 within 1e-4 on every generated token, and the on-policy PPO ratio is exactly 1."""
    from nemo_gym.rl import policy_loss

    url, _ = policy
    items: list[dict] = [{"role": "user", "content": "Name a colour of the rainbow."}]
    for follow_up in ["Name another one.", "And a third one?", None]:
        items += respond(url, items, max_output_tokens=24)
        if follow_up:
            items.append({"role": "user", "content": follow_up})
    rollout = {"response": {"output": items[1:]}}
    sequence = assert_trained_on_exactly_the_sampled_ids(rollout)
    batch = collate([sequence], [1.0])
    mask = batch.loss_mask[0].bool()
    trainer = engine.logprobs(batch)
    ratio = torch.exp(trainer[0][mask] - batch.rollout_logprobs[0][mask])
    print(
        f"3 turns, {int(mask.sum())} generated tokens of {len(sequence.input_ids)}: max |ratio - 1| ="
        f" {(ratio - 1).abs().max():.2e}"
    )
    assert (ratio - 1).abs().max() < LOGPROB_TOLERANCE
    _, metrics = policy_loss(
        trainer, trainer, batch.advantages, batch.loss_mask, engine.loss_config, rollout_logprobs=batch.rollout_logprobs
    )
    assert metrics["ratio_min"] == metrics["ratio_max"] == 1.0 and metrics["num_tokens"] == int(mask.sum())
    assert (
        metrics["rollout_logprob_abs_diff_max"] < LOGPROB_TOLERANCE
        and abs(metrics["tis_weight_mean"] - 1) < LOGPROB_TOLERANCE
    )
