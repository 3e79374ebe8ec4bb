#!/usr/bin/env bash
# The main job, end to end, on the embedded default (no GPU, no API key, no hub access):
#   install -> prepare the tasks -> ng_run configs/quickstart.yaml -> ng_collect_rollouts (4 repeats) -> ng_profile
#   -> ng_train (a short GRPO run on the profiled tasks whose pass rate is strictly between 0 and 1, attached to the
#   same servers; a group whose rollouts all get the same reward is refilled from further tasks, DAPO's dynamic
#   sampling, so that every step has groups to train on) -> stop the servers.
# Outputs land in $OUT (results/quickstart/); the trained model in $OUT/train/final. Settings: OUT, REPEATS (4),
# PARALLEL (16), MAX_OUTPUT_TOKENS (256), TRAIN_STEPS (2), TASKS_PER_GENERATOR (25 tasks from each of reasoning_gym's four
# generators). A rerun resumes the collection and trains again.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh
OUT=${OUT:-results/quickstart}
REPEATS=${REPEATS:-4}
PARALLEL=${PARALLEL:-16}
MAX_OUTPUT_TOKENS=${MAX_OUTPUT_TOKENS:-256}
TRAIN_STEPS=${TRAIN_STEPS:-2}
TASKS_PER_GENERATOR=${TASKS_PER_GENERATOR:-25}
mkdir -p "$OUT"
times=("install $(( $(date +%s) - t0 ))s")
stage() { local now; now=$(date +%s); times+=("$1 $(( now - t ))s"); t=$now; }
t=$(date +%s)

echo "== 1/6 prepare: reasoning_gym tasks from the generators of resources_servers/reasoning_gym/configs/quickstart_tasks.yaml, mcqa's example rows"
.venv/bin/python -W ignore::SyntaxWarning resources_servers/reasoning_gym/prepare.py "+config_paths=[resources_servers/reasoning_gym/configs/quickstart_tasks.yaml]" "+output_jsonl_fpath=$OUT/reasoning_gym_tasks.jsonl" \
  "++generators.0.size=$TASKS_PER_GENERATOR" "++generators.1.size=$TASKS_PER_GENERATOR" "++generators.2.size=$TASKS_PER_GENERATOR" "++generators.3.size=$TASKS_PER_GENERATOR"
.venv/bin/python scripts/quickstart_tasks.py "$OUT/reasoning_gym_tasks.jsonl" "$OUT/tasks.jsonl"
echo "   mcqa: NeMo Gym's rows, each after one worked example answered \\boxed{B} (SmolLM2 then answers in the box);"
echo "   graded as NeMo Gym grades them (strict_single_letter_boxed): the right letter in the box, or 0"
stage prepare

echo "== 2/6 ng_run: SmolLM2-135M-Instruct on vLLM (CPU), simple_agent, reasoning_gym, mcqa (first start builds environments)"
.venv/bin/ng_run "+config_paths=[configs/quickstart.yaml]" +head_server.port=0 > "$OUT/ng_run.log" 2>&1 &
NG_RUN_PID=$!
trap 'kill -INT $NG_RUN_PID 2>/dev/null || true; wait $NG_RUN_PID 2>/dev/null || true' EXIT
until grep -q "servers ready in" "$OUT/ng_run.log"; do
  if ! kill -0 $NG_RUN_PID 2>/dev/null; then cat "$OUT/ng_run.log"; echo "ng_run failed (log above)"; exit 1; fi
  sleep 2
done
cat "$OUT/ng_run.log"
HEAD_URL=$(sed -n 's/.*Head server: \(http[^ ]*\).*/\1/p' "$OUT/ng_run.log" | head -1)
stage servers

echo "== 3/6 ng_collect_rollouts: every task x $REPEATS repeats"
.venv/bin/ng_collect_rollouts "+head_server_url=$HEAD_URL" "+input_jsonl_fpath=$OUT/tasks.jsonl" "+output_jsonl_fpath=$OUT/rollouts.jsonl" \
  "+num_repeats=$REPEATS" "+num_samples_in_parallel=$PARALLEL" "+responses_create_params={temperature: 1.0, max_output_tokens: $MAX_OUTPUT_TOKENS}"
stage collection

echo "== 4/6 ng_profile"
.venv/bin/ng_profile "+input_jsonl_fpath=$OUT/tasks.jsonl" "+rollouts_jsonl_fpath=$OUT/rollouts.jsonl" "+output_jsonl_fpath=$OUT/profile.jsonl" +pass_threshold=1.0
stage profile

echo "== 5/6 ng_train: $TRAIN_STEPS GRPO steps on the profiled tasks with 0 < pass rate < 1 (configs/train/main_job_grpo.yaml), on the same servers;"
echo "   a group whose rollouts all get the same reward is refilled from further tasks (dynamic sampling: up to 4 collections a step)"
.venv/bin/ng_train "+config_paths=[configs/train/main_job_grpo.yaml]" "+trainer.head_server_url=$HEAD_URL" "++trainer.input_jsonl_fpath=$OUT/profile.jsonl" \
  "++trainer.output_dir=$OUT/train" "++trainer.num_steps=$TRAIN_STEPS" +overwrite=true
stage training

echo "== 6/6 stopping servers"
kill -INT $NG_RUN_PID; wait $NG_RUN_PID || true
trap - EXIT
echo "Main job done in $(( $(date +%s) - t0 )) s (${times[*]})."
echo "Rollouts: $OUT/rollouts.jsonl  Profile: $OUT/profile.jsonl  Training metrics: $OUT/train/metrics.jsonl  Trained model: $OUT/train/final"
