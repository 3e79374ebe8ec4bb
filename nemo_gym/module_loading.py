"""Importing a Python file of a server folder by its path.

Server folders are not packages: `ng_run`, `ng_test` and pytest import `app.py` by its path, so a server
cannot `import wordle_game` from its own folder. `import_sibling(__file__, "wordle_game.py")` imports the
file next to the caller under a name unique to its folder and keeps it in `sys.modules`, so every importer
(the server process, its tests) gets the same module object:

    game = import_sibling(__file__, "wordle_game.py")   # in resources_servers/wordle/app.py
    app = import_file(SERVER_DIR / "app.py")            # in resources_servers/wordle/tests/test_app.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["import_file", "import_sibling", "module_name"]


def module_name(path: Path) -> str:
    """A module name unique to the file: `nemo_gym_file_<type>_<folder>_<stem>` for `<type>/<folder>/<stem>.py`."""
    path = Path(path).resolve()
    parts = [path.parent.parent.name, path.parent.name, path.stem]
    return "nemo_gym_file_" + "_".join("".join(c if c.isalnum() else "_" for c in part) for part in parts)


def import_file(path: str | Path) -> ModuleType:
    """The module of the Python file at `path`, imported once (cached in `sys.modules` by `module_name`).

    Raises:
        ImportError: `path` is not an importable Python file.
        Exception: whatever executing the module raises (it is then not cached).
    """
    path = Path(path).resolve()
    name = module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ImportError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_sibling(anchor: str | Path, filename: str) -> ModuleType:
    """The module of `filename` in the folder of the file `anchor` (pass `__file__`)."""
    return import_file(Path(anchor).resolve().with_name(filename))
