"""The picture of nemo_gym's folders in docs/architecture.md, drawn from the code's imports.

    .venv/bin/python scripts/draw_layers.py           # print the Mermaid block
    .venv/bin/python scripts/draw_layers.py --write   # replace it in docs/architecture.md
    .venv/bin/python scripts/draw_layers.py --check # exit 1 when the picture there is not the code's (a test runs this)

Rooms are the folders of nemo_gym/ (and any top module); an arrow A --> B says that some module of A imports one of B
(at any depth: inside functions too). Arrows implied by a longer path are left out (the transitive reduction), so
the picture shows each room on top of what it uses directly. Rooms are grouped by their layer
(nemo_gym.common.layout.LAYERS).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nemo_gym.common.layout import LAYERS, layer_of  # noqa: E402

DOC = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- layers: begin (scripts/draw_layers.py --write) -->", "<!-- layers: end -->"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((REPO / "nemo_gym").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if "templates" in parts:
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def room_edges() -> dict[str, set[str]]:
    """room -> the rooms it imports from."""
    mods = modules()
    graph: dict[str, set[str]] = {room(m): set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parents, base] if base else parents)
                targets = [base]
            for target in targets:
                if target.startswith("nemo_gym.") and room(target) in graph and room(target) != room(name):
                    graph[room(name)].add(room(target))
    return graph


def reduced(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The transitive reduction of an acyclic graph: an arrow stays when no longer path joins its ends."""

    def reach(start: str, skip: tuple[str, str]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in graph[node]:
                if (node, nxt) != skip and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return {a: {b for b in targets if b not in reach(a, (a, b))} for a, targets in graph.items()}


def label(room_name: str) -> str:
    """`collect/` for a folder, `config.py` for a top module, `__init__.py` for the package itself."""
    if room_name == "nemo_gym":
        return "__init__.py"
    folder = REPO / room_name.replace(".", "/")
    return room_name.removeprefix("nemo_gym.") + ("/" if folder.is_dir() else ".py")


def mermaid() -> str:
    graph = reduced(room_edges())
    short = lambda r: "package" if r == "nemo_gym" else r.removeprefix("nemo_gym.")  # noqa: E731
    lines = ["```mermaid", "flowchart TD"]
    for layer in LAYERS:
        rooms = sorted(r for r in graph if layer_of(r) == layer or (r == "nemo_gym" and layer == "core"))
        lines.append(f"  subgraph {layer}")
        lines += [f"    {short(r).replace('.', '_')}[{label(r)}]" for r in rooms]
        lines.append("  end")
    for source in sorted(graph):
        for target in sorted(graph[source]):
            lines.append(f"  {short(source).replace('.', '_')} --> {short(target).replace('.', '_')}")
    lines.append("```")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    picture = mermaid()
    if not (args.write or args.check):
        print(picture)
        return 0
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    updated = f"{head}{BEGIN}\n{picture}\n{END}{tail}"
    if args.check:
        if updated != text:
            print(
                f"{DOC}: the picture of the folders is not the code's: run .venv/bin/python scripts/draw_layers.py"
                " --write",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
