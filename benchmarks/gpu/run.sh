#!/usr/bin/env bash
# The GPU suite in one command, on a CUDA machine with this repository:
#     bash benchmarks/gpu/run.sh
# On a lent machine, with vLLM carried in: `bash benchmarks/gpu/device.sh run`, the last of the calls that
# `bash benchmarks/gpu/carry.sh` prints (docs/gpus.md); it runs this with the carried vLLM and a budget that fits the call.
# Stages (benchmarks/gpu/suite.py; each under `timeout`, a failed one does not stop the others, 570 s in all):
#   env       nvidia-smi, python, torch
#   setup     the trainer's python .venv-gpu and vLLM for CUDA (benchmarks/gpu/setup.sh: carried, built, or none)
#   tests     pytest -m gpu tests/test_gpu.py: vLLM on CUDA in bf16 and float32 with token ids and log-probs, the
#             weight syncs into the CUDA vLLM (cuda_ipc, gloo; nccl with two GPUs) with log-probs agreeing after each,
#             ng_train bf16 with ZeRO 0 and 3 attached to one ng_run, CUDA IPC and DeepSpeed without vLLM
#   main_job  benchmarks/gpu/main_job.sh: the main job on the GPU with the real SmolLM2 (ng_run, collection, profile,
#             2 GRPO steps that train)
#   bench     benchmarks/gpu/bench.py: weight-sync seconds by path, generation tokens/s through vllm_model against
#             vLLM's offline LLM.generate, the gym's share of collection time, s per GRPO step vs TRL
# Figures, logs and summary.json go to results/bench/gpu/ (--out); the summary is printed at the end.
# Environment: NG_GPU_PYTHON (use this python instead of .venv-gpu), NG_GPU_ENGINE_PYTHON (vLLM's python),
# NG_GPU_VLLM_SITE (vLLM carried in: setup puts it in .venv-gpu), NG_GPU_BUDGET_S (default 570),
# NG_GPU_STAGES (default env,setup,tests,main_job,bench).
set -uo pipefail
cd "$(dirname "$0")/../.."
exec python3 benchmarks/gpu/suite.py --budget-s "${NG_GPU_BUDGET_S:-570}" --stages "${NG_GPU_STAGES:-env,setup,tests,main_job,bench}" "$@"
