#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package index (like the GPU machines lent here: Python 3.12, a CUDA torch,
# transformers, peft, numpy, pytest... but no vLLM, DeepSpeed, FastAPI, pydantic, Hydra): what nemo_gym's trainer,
# the gpu tests and the benchmark import that such an image lacks, into ./.whl, at the versions this repository's
# .venv has (pydantic and pydantic-core must match). Run it where a package index is reachable, then carry .whl
# (about 10 MiB) to the GPU machine; benchmarks/gpu/setup.sh installs it there when no index is reachable.
#     bash benchmarks/gpu/wheelhouse.sh        # needs .venv (scripts/setup.sh) for the versions
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
TARGET_PYTHON=${NG_WHEEL_PYTHON_VERSION:-3.12}
BINARY=(fastapi starlette uvicorn httptools pydantic pydantic-core annotated-types typing-inspection python-multipart
        openai jiter distro sniffio httpx2 httpcore2 truststore opentelemetry-api typing-extensions hydra-core omegaconf orjson jsonschema jsonschema-specifications referencing rpds-py hjson dill)
SOURCE_ONLY=(deepspeed antlr4-python3-runtime)   # no wheels on the index: built here (pure Python; DeepSpeed without its ops)
pins=$(.venv/bin/python - "${BINARY[@]}" "${SOURCE_ONLY[@]}" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
PYEOF
)
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
binary_pins=$(echo "$pins" | grep -v -E "^($(IFS='|'; echo "${SOURCE_ONLY[*]}"))(==|$)")
source_pins=$(echo "$pins" | grep -E "^($(IFS='|'; echo "${SOURCE_ONLY[*]}"))(==|$)")
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp "${platforms[@]}" -d .whl $binary_pins
# shellcheck disable=SC2086
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w .whl $source_pins
ls .whl
du -sh .whl
