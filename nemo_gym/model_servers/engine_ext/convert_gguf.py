"""Convert a GGUF model to a float HF directory: a script run by the vLLM engine venv's python.

`nemo_gym.model_servers.embedded.ensure_converted` runs this file as `python -P convert_gguf.py GGUF OUT [--dtype
float32]` with
the engine venv's interpreter, which has torch, transformers, gguf and accelerate but not nemo_gym. So this file
imports only the standard library at module level, and the conversion's own packages inside `convert_gguf_to_hf`;
never nemo_gym (tests/test_other_interpreters.py checks both, and runs it where nemo_gym cannot be imported).

The written directory is untied: `lm_head.weight` is written explicitly (a copy of the embeddings) and
`tie_word_embeddings` is false, because vLLM keeps a stale output layer after a weight reload otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["convert_gguf_to_hf"]


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> None:
    """Write a float HF model directory (safetensors, config, tokenizer with its chat template) from a GGUF.

    Needs torch, transformers, gguf and accelerate (imported here, not at module level).

    Raises:
        OSError: the GGUF cannot be read or `out_dir` cannot be written.
        AttributeError: `dtype` is not a torch dtype name (e.g. "float32", "bfloat16").
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch_dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    # Untie explicitly: a real lm_head tensor (a copy) and tie_word_embeddings=false.
    state = {name: tensor.detach().to(torch_dtype).contiguous().clone() for name, tensor in model.state_dict().items()}
    if (
        "lm_head.weight" not in state
        or state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    ):
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    config.tie_word_embeddings = False
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out_dir)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Convert a GGUF model to a float HF directory (runs in the engine venv)."
    )
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    convert_gguf_to_hf(args.gguf, args.out_dir, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
