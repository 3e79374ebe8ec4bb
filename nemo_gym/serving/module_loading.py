"""Importing the Python files of a server folder as the submodules of one package per folder.

A server folder (`resources_servers/wordle/`, ...) has no `__init__.py` and is not on `sys.path`: `ng_run`,
`ng_test` and pytest import its `app.py` by path. `import_file(path)` registers a package for the file's folder
under a name unique to that folder (`nemo_gym_file_resources_servers_wordle`, with `__path__ = [folder]`) and
imports the file as its submodule (`nemo_gym_file_resources_servers_wordle.app`). So the files of a folder
import each other with relative imports, which type checkers follow, and every importer (the server process,
the folder's tests, `ng_test`) gets the same module objects from `sys.modules`:

    from .wordle_game import WordleGame                  # in resources_servers/wordle/app.py
    from . import wordle_game                            # the same module object
    app = import_file(SERVER_DIR / "app.py")             # in resources_servers/wordle/tests/test_app.py

A file of the folder that is also run as a script (`python resources_servers/code_exec/prepare.py`) sets its
package before its relative imports (PEP 366): `if not __package__: __package__ = script_package(__file__)`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["folder_package", "import_file", "import_sibling", "module_name", "script_package"]

PREFIX = "nemo_gym_file_"


def _package_base_name(folder: Path) -> str:
    """`nemo_gym_file_<type>_<folder>` for the folder `<type>/<folder>/`, non-alphanumerics as `_`."""
    return PREFIX + "_".join(
        "".join(c if c.isalnum() else "_" for c in part) for part in (folder.parent.name, folder.name)
    )


def _is_package_of(name: str, folder: Path) -> bool:
    module = sys.modules.get(name)
    return module is not None and list(getattr(module, "__path__", [])) == [str(folder)]


def _package_name(folder: Path) -> str:
    """The package name of `folder`: its base name, or, when another folder holds that name (two `<type>/<name>/`
    folders under different roots, e.g. in tests), the base name with a hash of the folder's path."""
    name = _package_base_name(folder)
    if name in sys.modules and not _is_package_of(name, folder):
        name = f"{name}_{hashlib.sha1(str(folder).encode()).hexdigest()[:10]}"
    return name


def folder_package(folder: str | Path) -> ModuleType:
    """The package of the folder `folder` (registered in `sys.modules` on first use; its `__init__.py` is not run).

    Raises:
        ImportError: `folder` is not a directory.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise ImportError(f"cannot import from {folder}: not a directory")
    name = _package_name(folder)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
    assert spec is not None and spec.submodule_search_locations is not None
    spec.submodule_search_locations.append(str(folder))
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return package


def module_name(path: str | Path) -> str:
    """The module name of the Python file at `path`: `<package of its folder>.<stem>`, e.g.
    `nemo_gym_file_resources_servers_wordle.wordle_game`."""
    path = Path(path).resolve()
    return f"{_package_name(path.parent)}.{path.stem}"


def script_package(file: str | Path) -> str:
    """The package name of the folder of `file` (pass `__file__`), for a folder's file run as a script (PEP 366).

    Raises:
        ImportError: see `folder_package`.
    """
    return folder_package(Path(file).resolve().parent).__name__


def import_file(path: str | Path) -> ModuleType:
    """The module of the Python file at `path`, a submodule of its folder's package, imported once (`sys.modules`)
    and again only when the file changed since (its modification time or size), so that a process checking a folder
    twice (ng_test's checks, an edited `app.py` in a notebook) sees the edit.

    Raises:
        ImportError: `path` is not a Python file, or it (or a file it imports) imports a file of its folder
            that does not exist (the message names both).
        Exception: whatever executing the module raises (it is then not cached).
    """
    path = Path(path).resolve()
    if path.suffix != ".py" or not path.is_file() or "." in path.stem:
        raise ImportError(f"cannot import {path}: not a Python file")
    name = f"{folder_package(path.parent).__name__}.{path.stem}"
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = sys.modules.get(name)
    if cached is not None and getattr(cached, "__nemo_gym_file_stamp__", stamp) == stamp:
        return cached
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    module.__nemo_gym_file_stamp__ = stamp
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        _raise_missing_sibling(exc, path, name.rpartition(".")[0])
        raise
    setattr(sys.modules[name.rpartition(".")[0]], path.stem, module)  # as the import system does, for `from . import x`
    return module


def _raise_missing_sibling(exc: BaseException, path: Path, package: str) -> None:
    """Re-raise a relative import of a file that the folder lacks (`from .x import y`, `from . import x`) as an
    ImportError naming that file; else return."""
    relative = None
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith(package + "."):
        relative = exc.name.removeprefix(package)  # from .x import y
    elif (
        isinstance(exc, ImportError)
        and exc.name == package
        and (found := re.match(r"cannot import name '(\w+)'", str(exc)))
    ):
        relative = "." + found.group(1)  # from . import x
    if relative:
        raise ImportError(
            f"{path} (or a file it imports) imports `{relative}`, but {path.parent} has no file"
            f" {relative[1:].replace('.', '/')}.py",
            name=package + relative,
            path=str(path),
        ) from exc


def import_sibling(anchor: str | Path, filename: str) -> ModuleType:
    """The module of `filename` in the folder of the file `anchor` (pass `__file__`): `import_file` of that file.

    Deprecated: a server folder's files import each other with relative imports (`from . import wordle_game`).
    Kept for existing server folders; it gives the same module object as the relative import.

    Raises:
        ImportError, Exception: see `import_file`.
    """
    return import_file(Path(anchor).resolve().with_name(filename))
