#!/usr/bin/env bash
# The GPU suite's setup stage (benchmarks/gpu/run.sh runs it under its time limit): on a CUDA machine, the trainer's
# python `$NG_GPU_VENV` (default .venv-gpu) and vLLM for CUDA, one of three ways:
#   - vLLM carried in (NG_GPU_VLLM_SITE: its folder, /tmp/vllm-site on the lent machines; benchmarks/gpu/device.sh sets
#     it): .venv-gpu is a venv on the image's python (its CUDA torch) that sees that vLLM and the carried wheels of
#     NG_GPU_WHEELS (default .whl) where the image lacks them (benchmarks/gpu/overlay.py). The suite then runs every
#     vllm_model with engine_python .venv-gpu/bin/python: one environment, one torch on both sides of the weight sync,
#     no venv built, no package index asked;
#   - a package index reachable: the engine venv, vLLM for CUDA, built by nemo_gym itself
#     (nemo_gym.model_servers.vllm_engine.ensure_engine_venv("vllm"), the venv vllm_model uses where nvidia-smi exists),
#     and .venv-gpu with nemo_gym (editable) + the training and test packages at the engine venv's torch version;
#   - neither: .venv-gpu on the image's python with the wheels of .whl (benchmarks/gpu/wheelhouse.sh) and no vLLM; the
#     tests and benchmark parts that need it skip, saying so.
# Exit 77 (skip) on a machine without nvidia-smi.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=${NG_GPU_VENV:-.venv-gpu}
PY=${NG_GPU_BASE_PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIP: no nvidia-smi: not a CUDA machine"
  exit 77
fi
online=0
if [ -z "${NG_GPU_VLLM_SITE:-}" ]; then
  timeout 30 "$PY" -m pip index versions uv >/dev/null 2>&1 && online=1
  echo "package index reachable: $online"
fi

if [ "$online" = 1 ]; then
  command -v uv >/dev/null 2>&1 || "$PY" -m pip install -q uv || exit 1
  UV=$(command -v uv || echo "$("$PY" -c 'import sys,os;print(os.path.join(os.path.dirname(sys.executable),"uv"))')")
  [ -x "$VENV/bin/python" ] || "$UV" venv -q --python "$PY" "$VENV" || exit 1
  "$UV" pip install -q --python "$VENV/bin/python" -e . || exit 1   # nemo_gym's own dependencies (no torch)
  echo "building the engine venv (vllm for CUDA) ..."
  engine=$("$VENV/bin/python" -c 'from nemo_gym.model_servers.vllm_engine import ensure_engine_venv; print(ensure_engine_venv("vllm"))') || exit 1
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
  sites=()
  if [ -n "${NG_GPU_VLLM_SITE:-}" ]; then sites=(--site "$NG_GPU_VLLM_SITE"); fi
  "$PY" benchmarks/gpu/overlay.py --venv "$VENV" --base-python "$PY" "${sites[@]}" --wheels "${NG_GPU_WHEELS:-.whl}" || exit 1
  if [ -n "${NG_GPU_VLLM_SITE:-}" ]; then
    "$VENV/bin/python" -c 'import vllm, torch; print("NOTE: vLLM", vllm.__version__, "from", vllm.__file__.rsplit("/", 2)[0], "on torch", torch.__version__, "(engine_python:", __import__("sys").executable + ")")' || exit 1
  else
    echo "NOTE: no package index and no carried vLLM: .venv-gpu on $PY's torch; no vLLM for CUDA (its tests skip)"
  fi
fi
"$VENV/bin/python" -c 'import torch, deepspeed, transformers; print("trainer venv:", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)' || exit 1
