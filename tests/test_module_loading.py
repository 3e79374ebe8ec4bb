"""nemo_gym.serving.module_loading: the files of a server folder imported as the submodules of one package per
folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.module_loading import folder_package, import_file, import_sibling, module_name

REPO = Path(__file__).resolve().parents[1]
WORDLE = REPO / "resources_servers" / "wordle"


def folder(root: Path, files: dict[str, str]) -> Path:
    """A server-like folder `root/envs/demo` holding `files` (name -> source)."""
    path = root / "envs" / "demo"
    path.mkdir(parents=True)
    for name, source in files.items():
        (path / name).write_text(source)
    return path


def test_app_imports_its_sibling_relatively() -> None:
    app = import_file(WORDLE / "app.py")
    game = import_file(WORDLE / "wordle_game.py")
    assert app.game is game and app.__package__ == "nemo_gym_file_resources_servers_wordle"
    assert (app.__name__, game.__name__) == (
        "nemo_gym_file_resources_servers_wordle.app",
        "nemo_gym_file_resources_servers_wordle.wordle_game",
    )
    assert sys.modules[app.__package__].__path__ == [str(WORDLE)]


def test_a_sibling_imports_another_sibling_relatively(tmp_path: Path) -> None:
    demo = folder(
        tmp_path,
        {
            "app.py": "from .rules import RULE\n",
            "rules.py": "from . import words\nRULE = words.WORD.upper()\n",
            "words.py": "WORD = 'abc'\n",
        },
    )
    app = import_file(demo / "app.py")
    assert app.RULE == "ABC" and import_file(demo / "rules.py").words is import_file(demo / "words.py")


def test_every_importer_gets_the_same_module_objects() -> None:
    server_class = load_server_class(WORDLE / "app.py")  # how ng_run's server process and ng_test load app.py
    app = import_file(WORDLE / "app.py")  # how the folder's tests load it
    assert sys.modules[server_class.__module__] is app and app.WordleServer is server_class
    assert import_sibling(WORDLE / "app.py", "wordle_game.py") is app.game  # the deprecated helper agrees
    assert sys.modules[module_name(WORDLE / "wordle_game.py")] is app.game


@pytest.mark.parametrize("statement", ["from . import missing\n", "from .missing import thing\n"])
def test_a_missing_sibling_is_a_clear_import_error(tmp_path: Path, statement: str) -> None:
    demo = folder(tmp_path, {"app.py": "from . import helper\n", "helper.py": statement})
    with pytest.raises(ImportError, match=r"imports `\.missing`, but .*envs/demo has no file missing\.py"):
        import_file(demo / "app.py")
    assert module_name(demo / "app.py") not in sys.modules


def test_same_file_names_in_two_folders_do_not_clash(tmp_path: Path) -> None:
    wordle = import_file(WORDLE / "app.py")
    blackjack = import_file(REPO / "resources_servers/blackjack/app.py")
    assert wordle is not blackjack and wordle.WordleServer and blackjack.BlackjackServer
    first = folder(tmp_path / "one", {"app.py": "VALUE = 1\n"})
    second = folder(tmp_path / "two", {"app.py": "VALUE = 2\n"})  # the same `envs/demo` under another root
    assert (import_file(first / "app.py").VALUE, import_file(second / "app.py").VALUE) == (1, 2)
    assert folder_package(first) is not folder_package(second)
    assert module_name(Path("a-b/c.d/app.py")).startswith("nemo_gym_file_a_b_c_d")


def test_a_folder_file_runs_as_a_script(tmp_path: Path) -> None:
    script = (
        "from nemo_gym.serving.module_loading import script_package\n\nif not __package__:\n    __package__ ="
        " script_package(__file__)\n\nfrom . import words  # noqa: E402\n\nprint(words.WORD, __package__)\n"
    )
    demo = folder(tmp_path, {"generate.py": script, "words.py": "WORD = 'abc'\n"})
    done = subprocess.run([sys.executable, str(demo / "generate.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "abc" and done.stdout.split()[1].startswith("nemo_gym_file_envs_demo")


def test_a_failing_module_is_not_cached(tmp_path: Path) -> None:
    bad = folder(tmp_path, {"bad.py": "raise RuntimeError('boom')\n"}) / "bad.py"
    for _ in range(2):  # the second import runs the file again
        with pytest.raises(RuntimeError, match="boom"):
            import_file(bad)
    with pytest.raises(ImportError, match="not a Python file"):
        import_file(tmp_path / "missing.py")


def test_an_edited_file_is_imported_again_an_unchanged_one_is_not(tmp_path):
    folder = tmp_path / "resources_servers" / "edited"
    folder.mkdir(parents=True)
    (folder / "app.py").write_text("VALUE = 1\n")
    first = import_file(folder / "app.py")
    assert import_file(folder / "app.py") is first and first.VALUE == 1
    (folder / "app.py").write_text("VALUE = 22\n")
    assert import_file(folder / "app.py").VALUE == 22
