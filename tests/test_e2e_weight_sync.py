"""End to end: vLLM's log-probs agree with the trainer's, and weight sync changes what vLLM serves.

One vllm_model server (embedded SmolLM2-135M, vLLM in float32) and one `PolicyEngine` on the same converted
HF folder (float32) serve every test of the module:
- agreement: vLLM generates with token information; the trainer's log-probs of exactly those generated ids
  (`PolicyEngine.logprobs`) match vLLM's `generation_log_probs`;
- weight sync: the engine's `lm_head` is scaled, `FilesystemWeightSync.push` writes the folder (`save_hf`) and
  calls `POST /reload_weights`; vLLM's log-probs then match the modified model and not the original; reloading
  the original folder brings the original log-probs back.

Tolerance: both sides compute in float32, but with different kernels (vLLM's CPU attention and GEMMs vs
PyTorch's) and summation orders; LOGPROB_TOLERANCE is the bound on max |Δ log-prob| over the generated tokens.
Run: `.venv/bin/python -m pytest tests/test_e2e_weight_sync.py -m e2e -q -s` (`-s` prints the measured figures).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from live_servers import serve_vllm_model

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from nemo_gym.train.batch import TrainingSequence, collate  # noqa: E402
from nemo_gym.train.config import EngineConfig, LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402
from nemo_gym.train.weight_sync import FilesystemWeightSync, http_reloader  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 1200
LOGPROB_TOLERANCE = 1e-4
LM_HEAD_SCALE = 1.5  # logits × 1.5: same greedy tokens, clearly different log-probs
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """(base URL of a running vllm_model in float32, the HF folder vLLM serves)."""
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    config = {
        "dtype": "float32", "max_model_len": 1024, "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "log_path": str(log_path), "startup_timeout_s": STARTUP_TIMEOUT_S,
    }  # fmt: skip
    with serve_vllm_model(config, STARTUP_TIMEOUT_S) as (url, server):
        yield url, Path(server.engine.model)


@pytest.fixture(scope="module")
def engine(policy: tuple[str, Path]) -> PolicyEngine:
    """The trainer's policy on the folder vLLM serves (created after vLLM started: it sets RANK etc. in os.environ)."""
    return PolicyEngine(EngineConfig(model_path=str(policy[1]), dtype="float32", micro_batch_size=1), LossOptions())


def generate(url: str, temperature: float, max_tokens: int = 24) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, generation ids, vLLM's generation log-probs) of one chat completion of MESSAGES."""
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": temperature, "seed": 0}
    message = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status().json()["choices"][0]["message"]
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
    return float((trainer_logprobs(engine, prompt_ids, generation_ids) - torch.tensor(vllm_logprobs, dtype=torch.float32)).abs().max())


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

        answer = httpx.post(f"{url}/reload_weights", json={"model_dir": str(original_dir)}, timeout=600).raise_for_status().json()
        assert answer["model_dir"] == str(original_dir) and answer["seconds"] > 0
        print(f"reload of the original folder: {answer['seconds']:.2f} s")
        diff_back = max_diff(engine, generate(url, temperature=0.0))
        print(f"after reloading the original: vs original {diff_back:.2e}")
        assert diff_back < LOGPROB_TOLERANCE
    finally:
        set_lm_head(original)

