#!/usr/bin/env bash
# The lent GPU machine's side of the calls that benchmarks/gpu/carry.sh prints (docs/gpus.md, "A session with a lent GPU"):
#     bash benchmarks/gpu/device.sh stash .vc0 [.vw1 ...]   # every call but the last: keep its parts in /tmp/vc, /tmp/vw
#     bash benchmarks/gpu/device.sh run [run.sh's arguments] # the last call: install, then the whole suite
# `run`: stashes the parts carried with it; installs vLLM 0.24.0 into /tmp/vllm-site (the install.sh that
# ../shared/gpu/carry_vllm.sh wrote: joins /tmp/vc, checks its sha256, installs the wheels); joins /tmp/vw and checks
# it (the trainer's wheels); then runs `bash benchmarks/gpu/run.sh` with
#   NG_GPU_VLLM_SITE=/tmp/vllm-site: setup makes .venv-gpu on the image's python with that vLLM and the wheels, and every
#     vllm_model of the suite runs vLLM with engine_python .venv-gpu/bin/python (no venv built, no package index);
#   NG_GPU_WHEELS=/tmp/vw-unpack/.whl, VLLM_USE_FLASHINFER_SAMPLER=0 (FlashInfer is not carried),
#   NEMO_GYM_HOME=/tmp/ng-home (the converted SmolLM2 stays there between the calls of a lease),
#   NG_GPU_BUDGET_S: NG_GPU_CALL_S (590) less what the installs took, so the call ends within the device's 600 s;
#   results into $OUT/gpu (the folder the device sends back), else results/bench/gpu.
# On the same warm machine again (e.g. `NG_GPU_STAGES=bench bash benchmarks/gpu/device.sh run`), nothing is installed twice.
set -euo pipefail
started=$SECONDS
TMP=${NG_CARRY_TMP:-/tmp}  # /tmp: carry_vllm.sh's install.sh reads /tmp/vc (another folder only in the CPU test of stash)

stash() {
  local part dest
  for part in "$@"; do
    case $part in
      .vc[0-9]* | */.vc[0-9]*) dest=$TMP/vc ;;
      .vw[0-9]* | */.vw[0-9]*) dest=$TMP/vw ;;
      *) echo "not a carried part: $part" >&2; exit 2 ;;
    esac
    mkdir -p "$dest"
    cp "$part"/part.* "$dest"/
    if [ -f "$part/SHA256" ]; then cp "$part/SHA256" "$dest/SHA256"; fi
    echo "stashed $part in $dest ($(du -sh "$dest" | cut -f1) there)"
  done
}

has_vllm() { PYTHONPATH=/tmp/vllm-site python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' 2>/dev/null; }

run() {
  local parts=() part install
  cd "$(dirname "$0")/../.."
  for part in .vc[0-9]* .vw[0-9]*; do
    if [ -d "$part" ]; then parts+=("$part"); fi
  done
  if [ ${#parts[@]} -gt 0 ]; then stash "${parts[@]}"; fi
  if ! has_vllm; then
    install=$(ls .vc[0-9]*/install.sh 2>/dev/null | head -1 || true)
    if [ -z "$install" ]; then echo "no vLLM in /tmp/vllm-site and no .vcK/install.sh carried in this call" >&2; exit 1; fi
    echo "== installing vLLM ($install)"
    bash "$install"
  fi
  if [ ! -d "$TMP/vw-unpack/.whl" ] && compgen -G "$TMP/vw/part.*" >/dev/null; then
    cat "$TMP"/vw/part.* >"$TMP/vw.tar"
    if ! echo "$(cat "$TMP/vw/SHA256")  $TMP/vw.tar" | sha256sum -c --quiet; then
      echo "the wheel parts are missing or damaged: carry every .vwK in one warm lease" >&2
      ls -la "$TMP/vw" >&2
      exit 1
    fi
    mkdir -p "$TMP/vw-unpack" && tar xf "$TMP/vw.tar" -C "$TMP/vw-unpack" && rm "$TMP/vw.tar"
  fi
  export NG_GPU_VLLM_SITE=/tmp/vllm-site VLLM_USE_FLASHINFER_SAMPLER=0
  export NG_GPU_WHEELS=${NG_GPU_WHEELS:-$TMP/vw-unpack/.whl} NEMO_GYM_HOME=${NEMO_GYM_HOME:-/tmp/ng-home}
  export NG_GPU_BUDGET_S=${NG_GPU_BUDGET_S:-$(( ${NG_GPU_CALL_S:-590} - (SECONDS - started) - 10 ))}
  local out=${OUT:+$OUT/gpu}
  echo "== installs took $((SECONDS - started)) s; the suite gets ${NG_GPU_BUDGET_S} s"
  exec bash benchmarks/gpu/run.sh --out "${out:-results/bench/gpu}" "$@"
}

case ${1:-} in
  stash) shift; stash "$@" ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash benchmarks/gpu/device.sh stash <parts...> | run [run.sh arguments]" >&2; exit 2 ;;
esac
