#!/usr/bin/env bash
# The GPU suite's setup stage (benchmarks/gpu/run.sh runs it under its time limit): on a CUDA machine, make
#   - the engine venv: vLLM for CUDA, built by nemo_gym itself (nemo_gym.vllm_engine.ensure_engine_venv("vllm"), the
#     venv vllm_model uses on a machine with nvidia-smi), and
#   - the trainer venv ($NG_GPU_VENV, default .venv-gpu): nemo_gym (editable) + the training and test packages, with
#     the same torch version as the engine venv's (vLLM pins its torch; one torch, hence one NCCL, on both sides of the
#     weight sync), from the package index's default build (CUDA on Linux).
# Without a package index (a machine that reaches none): .venv-gpu/bin/python runs the system python3 (its CUDA torch)
# with the wheels of ./.whl (benchmarks/gpu/wheelhouse.sh makes them) and this repository on PYTHONPATH; there is no
# vLLM then, and the tests and benchmark parts that need it skip, saying so. Exit 77 (skip) on a machine without nvidia-smi.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=${NG_GPU_VENV:-.venv-gpu}
PY=${NG_GPU_BASE_PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIP: no nvidia-smi: not a CUDA machine"
  exit 77
fi
online=0
timeout 30 "$PY" -m pip index versions uv >/dev/null 2>&1 && online=1
echo "package index reachable: $online"

if [ "$online" = 1 ]; then
  command -v uv >/dev/null 2>&1 || "$PY" -m pip install -q uv || exit 1
  UV=$(command -v uv || echo "$("$PY" -c 'import sys,os;print(os.path.join(os.path.dirname(sys.executable),"uv"))')")
  [ -x "$VENV/bin/python" ] || "$UV" venv -q --python "$PY" "$VENV" || exit 1
  "$UV" pip install -q --python "$VENV/bin/python" -e . || exit 1   # nemo_gym's own dependencies (no torch)
  echo "building the engine venv (vllm for CUDA) ..."
  engine=$("$VENV/bin/python" -c 'from nemo_gym.vllm_engine import ensure_engine_venv; print(ensure_engine_venv("vllm"))') || exit 1
  torch_version=$("$engine" -c 'import torch; print(torch.__version__.split("+")[0])') || exit 1
  echo "engine venv: $engine (vllm $("$engine" -c 'import vllm; print(vllm.__version__)'), torch $torch_version)"
  "$UV" pip install -q --python "$VENV/bin/python" "torch==$torch_version" deepspeed==0.19.8 "transformers>=4.57" "peft>=0.17" \
    "safetensors>=0.4" tensorboard trl==1.16.0 datasets pytest pytest-timeout reasoning-gym==0.1.25 matplotlib || exit 1
else
  has_cuda_torch=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
  if [ "$has_cuda_torch" != 1 ]; then
    echo "no package index and $PY has no CUDA torch: nothing to train with"
    exit 1
  fi
  # no venv: the image's python is often a venv itself, whose packages a --system-site-packages venv would not see.
  # .venv-gpu/bin/python is a wrapper: the image's python with .whl's packages and this repository on PYTHONPATH.
  site="$PWD/$VENV/site"
  mkdir -p "$VENV/bin" "$site"
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl || exit 1
  fi
  real=$("$PY" -c 'import sys; print(sys.executable)')
  printf '#!/bin/sh\nexport PYTHONPATH="%s:%s${PYTHONPATH:+:$PYTHONPATH}"\nexec "%s" "$@"\n' "$site" "$PWD" "$real" > "$VENV/bin/python"
  chmod +x "$VENV/bin/python"
  echo "NOTE: no package index: trainer venv on $PY's torch $("$PY" -c 'import torch; print(torch.__version__)'); no vLLM for CUDA (its tests skip)"
fi
"$VENV/bin/python" -c 'import torch, deepspeed, transformers; print("trainer venv:", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)' || exit 1
