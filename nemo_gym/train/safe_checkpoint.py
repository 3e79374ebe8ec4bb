"""DeepSpeed checkpoints loaded without unpickling code: a tampered checkpoint file is refused, never run.

DeepSpeed's own `TorchCheckpointEngine.load` calls `torch.load(..., weights_only=False)`: a checkpoint file
replaced by a pickle whose `__reduce__` runs a command would run it on `ng_train +trainer.resume=true`, `ng_export`
or an ART backend restart. `SafeCheckpointEngine` is that engine with one change: `load` uses
`torch.load(weights_only=True)` (torch's restricted unpickler: tensors, containers, numbers, strings) with the few
classes a DeepSpeed checkpoint of ours holds allow-listed by `torch.serialization.safe_globals`
(`CHECKPOINT_SAFE_GLOBALS`). Any other global in the file is refused with `UnsafeCheckpointError` before
anything in it is called. Saving is unchanged (`torch.save`).

Imported by `nemo_gym.train.engine` only (it imports DeepSpeed). `PolicyEngine` installs it on its DeepSpeed engine
(`install`), so every checkpoint load of ZeRO stages 0-3 (model
states, optimizer states, ZeRO partitions) goes through it.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from nemo_gym.common.errors import NemoGymError
from nemo_gym.train import crash_points

__all__ = ["CHECKPOINT_SAFE_GLOBALS", "UnsafeCheckpointError", "SafeCheckpointEngine", "safe_torch_load", "install"]


class UnsafeCheckpointError(NemoGymError):
    """A checkpoint file holds something other than tensors, plain containers and the allow-listed classes
    (e.g. a pickled callable): it is refused, and nothing in it ran."""


def _allowed_globals() -> list[Any]:
    """The non-default classes in the DeepSpeed checkpoints `PolicyEngine.save_checkpoint` writes: listed with
    `torch.serialization.get_unsafe_globals_in_checkpoint` over ZeRO 0-3 (with and without LoRA) on DeepSpeed 0.19.8;
    they sit in the ZeRO optimizer-state files. Plain data classes: unpickling them runs no code of the file's."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


CHECKPOINT_SAFE_GLOBALS: list[Any] = []  # filled on first use (DeepSpeed is imported lazily)


def safe_torch_load(path: str, map_location: Any = None) -> Any:
    """`torch.load(path, weights_only=True)` with `CHECKPOINT_SAFE_GLOBALS` allowed.

    Raises:
        UnsafeCheckpointError: the file holds another global (a class or callable to import); names the file.
    """
    if not CHECKPOINT_SAFE_GLOBALS:
        CHECKPOINT_SAFE_GLOBALS.extend(_allowed_globals())
    try:
        with torch.serialization.safe_globals(CHECKPOINT_SAFE_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # torch's message advises weights_only=False; keep only the reason ("Unsupported global: GLOBAL os.system ...")
        reason = next((line for line in lines if "GLOBAL" in line), lines[-1] if lines else type(exc).__name__)
        reason = reason.split("WeightsUnpickler error:", 1)[-1].strip()
        raise UnsafeCheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain data"
            f" ({reason.split(' was not an allowed global')[0]}). A checkpoint written by nemo_gym never does; the file"
            " was replaced or corrupted, so nothing in it was run"
        ) from None


class SafeCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine whose `load` is `safe_torch_load` (see the module docstring)."""

    crash_step: int | None = None  # the step being saved, for the test hook `checkpoint_file` (crash_points)

    def load(self, path: str, map_location: Any = None) -> Any:
        return safe_torch_load(path, map_location=map_location)

    def save(self, state_dict: Any, path: str) -> None:
        super().save(state_dict, path)
        if self.crash_step is not None:
            crash_points.reached("checkpoint_file", self.crash_step)


def install(engine: Any) -> None:
    """Replace the DeepSpeed engine's checkpoint engine by a `SafeCheckpointEngine`.

    Raises:
        TypeError: the engine uses another checkpoint engine (a fast/decoupled writer or DataStates), whose
            loads this module has not checked.
    """
    current = engine.checkpoint_engine
    if type(current) is not TorchCheckpointEngine:
        raise TypeError(
            f"unexpected DeepSpeed checkpoint engine {type(current).__name__}; only TorchCheckpointEngine is replaced"
            " by the safe loader"
        )
    safe = SafeCheckpointEngine(engine._config)
    engine.checkpoint_engine = safe
