"""The import graph of the nemo_gym package, built from the sources with `ast`: no cycle, and no import that crosses
the layers of `nemo_gym.layout.LAYERS` upwards (the core never imports an extra or the cli).

Every import counts: at module level, inside functions, under `if TYPE_CHECKING:`; relative imports are resolved.
An import of `a.b.c` is an edge to the deepest module of nemo_gym it names (`from a.b import c` to `a.b.c` when
that is a module, else to `a.b`).
"""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from nemo_gym.layout import LAYERS, REPO_ROOT, layer_of

PACKAGE = REPO_ROOT / "nemo_gym"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line} imports {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _deepest_module(name: str) -> str | None:
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: `from . import x` in package a.b is a.b.x; each further dot goes one package up
        parents = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parents, base] if base else parents)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]


@cache
def edges() -> tuple[Edge, ...]:
    found = []
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for imported in _imported_names(node, package):
                target = _deepest_module(imported) if imported.split(".")[0] == "nemo_gym" else None
                if target and target != name:
                    found.append(Edge(name, target, path, node.lineno))
    return tuple(found)


def test_the_graph_sees_function_level_and_relative_imports():
    """The builder itself: a function-level import and the package's modules are in the graph."""
    found = {(e.source, e.target) for e in edges()}
    assert ("nemo_gym.cli.train", "nemo_gym.train.recipes") in found  # inside main(): torch only when training here
    assert ("nemo_gym.cli", "nemo_gym.commands") in found
    assert len(modules()) > 100


def test_no_import_cycle():
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for edge in edges():
        graph[edge.source].add(edge.target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle = exc.args[1][::-1]  # [a, b, ..., a]: each imports the next
        where = [next(str(e) for e in edges() if e.source == a and e.target == b) for a, b in zip(cycle, cycle[1:])]
        pytest.fail("import cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(where))


def test_no_import_crosses_the_layers_upwards():
    """The core imports no extra and no cli module; the extras import no cli module (nemo_gym.layout.LAYERS)."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}  # top layer first
    upwards = [f"{edge} ({layer_of(edge.source)} -> {layer_of(edge.target)})" for edge in edges() if rank[layer_of(edge.target)] < rank[layer_of(edge.source)]]
    assert upwards == []


def test_every_layer_entry_names_a_module_or_package():
    for prefixes in LAYERS.values():
        for prefix in prefixes:
            assert prefix in modules() or any(name.startswith(prefix + ".") for name in modules()), prefix


def test_the_command_registry_sits_at_the_bottom():
    """nemo_gym.commands names every command's main and options as strings: it imports only the config and the errors,
    and nothing in nemo_gym but the cli package imports nemo_gym.cli."""
    assert {e.target for e in edges() if e.source == "nemo_gym.commands"} == {"nemo_gym.config", "nemo_gym.errors"}
    assert [str(e) for e in edges() if layer_of(e.target) == "cli" and layer_of(e.source) != "cli"] == []


def test_training_recipes_are_siblings():
    """The recipes of ng_train (GRPO, sft / pretrain, on-policy distillation) import none of each other; the training
    loop imports none of them (nemo_gym.train.recipes picks one)."""
    recipes = {"nemo_gym.train.grpo", "nemo_gym.train.supervised", "nemo_gym.train.distill"}
    crossing = [str(e) for e in edges() if (e.source in recipes or e.source == "nemo_gym.train.loop") and e.target in recipes]
    assert crossing == []
