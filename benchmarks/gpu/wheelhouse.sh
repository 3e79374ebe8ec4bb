#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package index (like the GPU machines lent here: Python 3.12, CUDA torch
# 2.11, transformers, peft, numpy, pytest... but no vLLM, DeepSpeed, FastAPI, pydantic, Hydra, TRL): what nemo_gym's
# servers and trainer, the gpu tests, the main job (reasoning_gym) and the benchmark (TRL 1.16 and its datasets) import,
# into ./.whl, at the versions this repository's .venv has. Run it where a package index is reachable (carry.sh does).
#     bash benchmarks/gpu/wheelhouse.sh        # needs .venv (scripts/setup.sh) for the versions
# Which: the dependency closure (from .venv's metadata) of ROOTS, less what the image has for sure (the closure of
# torch, transformers, peft and pytest: the image runs them), less what the carried vLLM brings
# (../shared/gpu/vllm-$VLLM_VERSION-extra-wheels.txt, when it exists). On the GPU, benchmarks/gpu/overlay.py installs
# only the wheels whose distribution is still missing there, so a guess too wide costs bytes, never a conflict.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then  # the wheels' versions are those of this checkout's .venv
  echo "$0: no .venv in $(pwd): run 'bash scripts/setup.sh' first (README's second command makes it)" >&2
  exit 1
fi
TARGET_PYTHON=${NG_WHEEL_PYTHON_VERSION:-3.12}
VLLM_LIST=${NG_VLLM_WHEEL_LIST:-../shared/gpu/vllm-${VLLM_VERSION:-0.24.0}-extra-wheels.txt}
ROOTS=(nemo-gym deepspeed trl datasets accelerate reasoning-gym matplotlib gguf pytest-timeout)
IMAGE_HAS=(torch transformers peft pytest numpy)
SOURCE_ONLY=(deepspeed antlr4-python3-runtime)   # no wheels on the index: built here (pure Python; DeepSpeed without its ops); others found so below
pins=$(.venv/bin/python - "$VLLM_LIST" "${#ROOTS[@]}" "${ROOTS[@]}" "${IMAGE_HAS[@]}" <<'PYEOF'
import re, sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

vllm_list, count = Path(sys.argv[1]), int(sys.argv[2])
roots, image = sys.argv[3 : 3 + count], sys.argv[3 + count :]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()

def closure(names):
    seen, todo = {}, list(names)
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        try:
            found = distribution(name)
        except PackageNotFoundError:
            seen[name] = None
            continue
        seen[name] = found.version
        for text in found.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": "", "python_version": "3.12"}):
                todo.append(requirement.name)
    return seen

skip = set(closure(image)) | {"nemo-gym", "uv"}  # uv builds server venvs; the GPU suite runs its servers with +skip_venv=true
if vllm_list.is_file():
    skip |= {norm(line.split("==")[0]) for line in vllm_list.read_text().split() if line.strip()}
for name, version in sorted(closure(roots).items()):
    if version and name not in skip and not name.startswith(("nvidia-", "torch", "triton")):
        print(f"{name}=={version}")
PYEOF
)
rm -rf .whl && mkdir -p .whl
platforms=()
for n in 28 27 17 24 31 34 35 39 5; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
pattern="^($(IFS='|'; echo "${SOURCE_ONLY[*]}"))=="
binary_pins=$(echo "$pins" | grep -v -E "$pattern" || true)
source_pins=$(echo "$pins" | grep -E "$pattern" || true)
# a pin with no wheel for the target (an sdist only, e.g. reasoning_gym's cellpylib) is built from source below
# shellcheck disable=SC2086
while ! out=$("$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp "${platforms[@]}" -d .whl $binary_pins 2>&1); do
  bad=$(echo "$out" | sed -n 's/.*No matching distribution found for \([^ ]*\).*/\1/p' | head -1)
  if [ -z "$bad" ]; then echo "$out" >&2; exit 1; fi
  binary_pins=$(echo "$binary_pins" | grep -v -x -F "$bad")
  source_pins=$(printf '%s\n%s' "$source_pins" "$bad")
done
# shellcheck disable=SC2086
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w .whl $source_pins
echo "$(ls .whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1)): $(echo $pins | tr '\n' ' ')"
