"""`@reward(sandbox=True)`: the reward runs in code_exec's bubblewrap sandbox, not in the server process.

ReinforceNow runs such rewards inside the entry's Docker container (`docker` field), next to the files its
sandbox tools wrote. Here there is no Docker: each call is a fresh bwrap sandbox (no network, no host files,
CPU/memory/time limits; see resources_servers/code_exec/sandbox.py) holding a copy of `rewards.py`, a small
stand-in of `nemo_gym.rnow` / `rnow.core` (the decorators as no-ops, RewardArgs, get_response) and the
call's input; it prints the value as JSON. The `docker` image is not used (only required, as in rnow), so:
the sandbox sees the base Python's standard library only (no packages of requirements.txt), and no state of
sandbox tools is shared. When bwrap is missing the rollout fails with `sandbox_unavailable`, never by
running the reward unsandboxed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.rnow.decorators import RewardArgs, RewardSpec
from nemo_gym.rnow.scoring import RewardError
from nemo_gym.serving.module_loading import import_file

__all__ = ["SandboxedRewards"]

_STAND_IN = '''\
"""Stand-in of nemo_gym.rnow inside the sandbox: decorators that only return the function."""
class RewardArgs:
    def __init__(self, metadata=None, variables=None, secrets=None):
        self.metadata, self.variables, self.secrets = metadata or {}, variables or {}, secrets or {}
ToolArgs = RewardArgs
def _mark(fn=None, **options):
    return fn if fn is not None else (lambda f: f)
reward = tool = _mark
def get_response(messages):
    for m in reversed(messages):
        if m.get("role") == "assistant":
            c = m.get("content") or ""
            return "".join(p.get("text", "") for p in c if isinstance(p, dict)) if isinstance(c, list) else str(c)
    return ""
'''

_RUNNER = """\
import json, sys, types
sys.path.insert(0, "/work")
import _rnow_stand_in as stand_in
for name in ("nemo_gym", "nemo_gym.rnow", "rnow", "rnow.core", "rnow.core.reward", "rnow.core.tool", "rnow.models"):
    sys.modules[name] = stand_in
call = json.load(open("/work/_rnow_call.json"))
import rewards
value = getattr(rewards, call["name"])(stand_in.RewardArgs(call["metadata"], call["variables"]), call["messages"])
if hasattr(value, "__await__"):
    import asyncio
    async def _wait(v):
        return await v
    value = asyncio.run(_wait(value))
print("\\n" + json.dumps({"value": value}))
"""


class SandboxedRewards:
    """Runs sandbox rewards of the project at `project_dir` (a SandboxRunner for `nemo_gym.rnow.scoring`)."""

    def __init__(self, project_dir: str | Path, *, memory_mb: int = 512):
        self.rewards_source = (Path(project_dir) / "rewards.py").read_text()
        self.sandbox_module = import_file(REPO_ROOT / "resources_servers" / "code_exec" / "sandbox.py")
        self.memory_mb = memory_mb

    def check(self) -> None:
        """Raises SandboxUnavailableError when the sandbox cannot run here."""
        self.sandbox_module.Sandbox().check()

    async def __call__(
        self, spec: RewardSpec, args: RewardArgs, messages: list[dict[str, Any]], timeout_s: float
    ) -> Any:
        call = {"name": spec.name, "metadata": args.metadata, "variables": args.variables, "messages": messages}
        files = {
            "rewards.py": self.rewards_source,
            "_rnow_stand_in.py": _STAND_IN,
            "_rnow_runner.py": _RUNNER,
            "_rnow_call.json": json.dumps(call),
        }
        limits = self.sandbox_module.SandboxLimits(
            wall_time_s=timeout_s, cpu_time_s=max(1, int(timeout_s)), memory_mb=self.memory_mb
        )
        sandbox = self.sandbox_module.Sandbox(limits, max_concurrent=1)
        result = await asyncio.to_thread(sandbox.run_python, "_rnow_runner.py", files)
        if result.timed_out:
            raise TimeoutError
        last = result.stdout.strip().splitlines()[-1:] if result.stdout.strip() else []
        if not result.ok or not last:
            raise RewardError(
                f"sandboxed reward {spec.name!r} failed (exit {result.exit_code}, {result.killed_by or result.signal}):"
                f" {result.stderr[-1500:]}"
            )
        try:
            return json.loads(last[0])["value"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RewardError(f"sandboxed reward {spec.name!r} printed no value: {result.stdout[-500:]}") from exc
