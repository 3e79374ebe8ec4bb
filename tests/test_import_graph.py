"""The import graph of the nemo_gym package, built from the sources with `ast`: no cycle, no import that crosses the
layers of `nemo_gym.common.layout.LAYERS` upwards (the core never imports an extra or the cli), every module in a
layer, no module at the top of nemo_gym/ but its `__init__`, and no cycle between the rooms of the tree (each folder of
nemo_gym/): the folders stack; and no module imports another's private name (`_name`).

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

from nemo_gym.common.layout import LAYERS, REPO_ROOT, layer_of

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


@pytest.mark.long
def test_the_graph_sees_function_level_and_relative_imports():
    """The builder itself: a function-level import and the package's modules are in the graph."""
    found = {(e.source, e.target) for e in edges()}
    assert ("nemo_gym.cli.train", "nemo_gym.train.recipes") in found  # inside main(): torch only when training here
    assert ("nemo_gym.cli", "nemo_gym.config.commands") in found
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
    """The core imports no extra and no cli module; the extras import no cli module (nemo_gym.common.layout.LAYERS)."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}  # top layer first
    upwards = [
        f"{edge} ({layer_of(edge.source)} -> {layer_of(edge.target)})"
        for edge in edges()
        if rank[layer_of(edge.target)] < rank[layer_of(edge.source)]
    ]
    assert upwards == []


def test_every_layer_entry_names_a_module_or_package():
    for prefixes in LAYERS.values():
        for prefix in prefixes:
            assert prefix in modules() or any(name.startswith(prefix + ".") for name in modules()), prefix


def test_every_module_is_in_a_layer():
    """A new folder of nemo_gym/ is placed in a layer (nemo_gym.common.layout.LAYERS), never left out."""
    unplaced = []
    for name in modules():
        try:
            layer_of(name)
        except ValueError:
            unplaced.append(name)
    assert unplaced == []


def test_nemo_gym_holds_folders_only():
    """The tree shows the layers and jobs: every module of nemo_gym/ is in a folder (a layer's entry of LAYERS), none
    at its top but the package's `__init__` (its old import paths, `nemo_gym.MOVED`)."""
    top = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert top == [], f"move {top} into the folder of its job (nemo_gym.common.layout.LAYERS)"


def room(module: str) -> str:
    """The room of a module: its folder under nemo_gym/ (`nemo_gym.collect.engine` → `nemo_gym.collect`), or itself
    for a top module."""
    return ".".join(module.split(".")[:2])


def test_the_folders_stack_without_a_cycle():
    """The folders taken as rooms (every import between two rooms an arrow): no arrow runs back up, i.e.
    no cycle of rooms, so each folder sits above what it uses."""
    graph: dict[str, set[str]] = {}
    for edge in edges():
        if room(edge.source) != room(edge.target):
            graph.setdefault(room(edge.source), set()).add(room(edge.target))
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle = exc.args[1][::-1]
        where = [
            next(str(e) for e in edges() if room(e.source) == a and room(e.target) == b)
            for a, b in zip(cycle, cycle[1:])
        ]
        pytest.fail("rooms in a cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(where))


def test_the_command_registry_sits_at_the_bottom():
    """nemo_gym.config.commands names every command's main and options as strings: it imports only the config and the
    errors, and nothing in nemo_gym but the cli package imports nemo_gym.cli."""
    registry_imports = {e.target for e in edges() if e.source == "nemo_gym.config.commands"}
    assert registry_imports == {"nemo_gym.config", "nemo_gym.common.errors"}
    assert [str(e) for e in edges() if layer_of(e.target) == "cli" and layer_of(e.source) != "cli"] == []


def _is_private(name: str) -> bool:
    """`_name` is private; a dunder (`__version__`, `__all__`) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(path: Path, name: str, root: Path = REPO_ROOT) -> list[str]:
    """`file:line imports <module>.<_name>` for each private name the module `name` (at `path`) imports from another
    nemo_gym module. A package's `__init__` may import the private names of its own modules (its conventions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = node.module or ""
        if node.level:
            parents = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*parents, source] if source else parents)
        if source.split(".")[0] != "nemo_gym" or source == name:
            continue
        own_package = path.name == "__init__.py" and source.startswith(name + ".")
        for alias in node.names:
            if _is_private(alias.name) and not own_package:
                found.append(f"{path.relative_to(root)}:{node.lineno} imports {source}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name():
    """A name that starts with `_` is its module's own: another module that needs it gets it public (documented, in
    `__all__`) or moved where both use it. Dunders (`__version__`) are public; a package's `__init__` may import
    its own modules' private names."""
    assert [hit for name, path in modules().items() for hit in private_imports(path, name)] == []


def test_the_private_import_check_sees_one(tmp_path):
    """The check itself: absolute and relative imports of a private name are found, a dunder and the package's own
    `__init__` are not."""
    module = tmp_path / "nemo_gym" / "pkg" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text("from nemo_gym.other import _helper, public, __version__\nfrom .sibling import _x\n")
    init = module.parent / "__init__.py"
    init.write_text("from nemo_gym.pkg.mod import _inner\nfrom nemo_gym.other import _outer\n")
    relative = [hit.split(" imports ")[1] for hit in private_imports(module, "nemo_gym.pkg.mod", tmp_path)]
    assert relative == ["nemo_gym.other._helper", "nemo_gym.pkg.sibling._x"]
    assert [hit.split(" imports ")[1] for hit in private_imports(init, "nemo_gym.pkg", tmp_path)] == [
        "nemo_gym.other._outer"
    ]


def test_training_recipes_are_siblings():
    """The recipes of ng_train (GRPO, sft / pretrain, on-policy distillation) import none of each other; the training
    loop imports none of them (nemo_gym.train.recipes picks one)."""
    recipes = {"nemo_gym.train.grpo", "nemo_gym.train.supervised", "nemo_gym.train.distill"}
    crossing = [
        str(e) for e in edges() if (e.source in recipes or e.source == "nemo_gym.train.loop") and e.target in recipes
    ]
    assert crossing == []


@pytest.mark.parametrize("old", sorted(__import__("nemo_gym").MOVED))
def test_old_import_paths_still_import(old):
    """An old module path (`nemo_gym.MOVED`, docs/architecture.md "Old import paths") imports with a DeprecationWarning
    naming the new place, and its public names are the new modules' objects."""
    import importlib
    import sys

    from nemo_gym import MOVED

    homes = [importlib.import_module(home) for home in MOVED[old]]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"^{old} moved to {MOVED[old][0]} "):
        module = importlib.import_module(old)
    public = [name for home in homes for name in getattr(home, "__all__", [])]
    assert public and all(
        getattr(module, name) is next(getattr(h, name) for h in homes if hasattr(h, name)) for name in public
    )
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018
