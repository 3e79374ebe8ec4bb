#!/usr/bin/env bash
# The GPU suite in one command, on a CUDA machine with this repository:
#     bash benchmarks/gpu/run.sh
# Stages (benchmarks/gpu/suite.py; each under `timeout`, a failed one does not stop the others, 570 s in all):
#   env    nvidia-smi, python, torch
#   setup  the engine venv (vLLM for CUDA) and the trainer venv .venv-gpu (benchmarks/gpu/setup.sh)
#   tests  pytest -m gpu tests/test_gpu.py (vLLM on CUDA in bf16 and float32, ng_train bf16 with ZeRO 0 and 3,
#          the broadcast weight sync's log-prob agreement, NCCL and two ranks when there are two GPUs)
#   bench  benchmarks/gpu/bench.py: generation and training tokens/s, weight-sync seconds, s per GRPO step vs TRL
# Figures, logs and summary.json go to results/bench/gpu/; the summary is printed at the end.
# Environment: NG_GPU_PYTHON (use this python instead of .venv-gpu), NG_GPU_BUDGET_S (default 570),
# NG_GPU_STAGES (default env,setup,tests,bench).
set -uo pipefail
cd "$(dirname "$0")/../.."
exec python3 benchmarks/gpu/suite.py --budget-s "${NG_GPU_BUDGET_S:-570}" --stages "${NG_GPU_STAGES:-env,setup,tests,bench}" "$@"
