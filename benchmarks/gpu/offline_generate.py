"""vLLM's offline `LLM.generate` on given prompt ids, timed: the reference for the HTTP path's tokens/s (bench.py).

    <vLLM's python> benchmarks/gpu/offline_generate.py <request.json> <answer.json>

Runs in the python that has vLLM (vllm_model's engine python, which may have no nemo_gym): the standard library and
vLLM only. request.json: {"model", "dtype", "memory_utilization", "max_model_len", "prompts": [[ids], ...],
"seeds": [...], "max_tokens", "temperature"}. The engine is built as vllm_model builds it (enforce_eager, log-probs
of the distribution sampled from, one log-prob per token asked as vllm_model asks), one warm-up call, then the timed
call: answer.json {"tokens": generated tokens, "seconds": wall of the timed call, "vllm": version}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(request_path: str, answer_path: str) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    request = json.loads(Path(request_path).read_text())
    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],
        gpu_memory_utilization=request["memory_utilization"],
        max_model_len=request["max_model_len"],
        enforce_eager=True,
        logprobs_mode="processed_logprobs",
        seed=0,
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    params = [
        SamplingParams(temperature=request["temperature"], max_tokens=request["max_tokens"], seed=seed, logprobs=0)
        for seed in request["seeds"]
    ]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    started = time.monotonic()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.monotonic() - started
    tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    Path(answer_path).write_text(json.dumps({"tokens": tokens, "seconds": seconds, "vllm": vllm.__version__}))


if __name__ == "__main__":  # vLLM spawns its engine process: the work only under this guard
    main(sys.argv[1], sys.argv[2])
