"""nemo_gym.module_loading: a file of a server folder imported once under a name unique to its folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.module_loading import import_file, import_sibling, module_name

REPO = Path(__file__).resolve().parents[1]


def test_a_sibling_is_one_module_object_for_every_importer() -> None:
    app = import_file(REPO / "resources_servers/wordle/app.py")
    game = import_sibling(REPO / "resources_servers/wordle/app.py", "wordle_game.py")
    assert app.game is game and import_file(REPO / "resources_servers/wordle/wordle_game.py") is game
    assert game.__name__ == "nemo_gym_file_resources_servers_wordle_wordle_game"


def test_same_file_names_in_two_folders_do_not_clash() -> None:
    wordle = import_file(REPO / "resources_servers/wordle/app.py")
    blackjack = import_file(REPO / "resources_servers/blackjack/app.py")
    assert wordle is not blackjack and wordle.WordleServer and blackjack.BlackjackServer
    assert module_name(Path("a-b/c.d/app.py")) == "nemo_gym_file_a_b_c_d_app"


def test_a_failing_module_is_not_cached(tmp_path: Path) -> None:
    bad = tmp_path / "env" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("raise RuntimeError('boom')\n")
    for _ in range(2):  # the second import runs the file again
        with pytest.raises(RuntimeError, match="boom"):
            import_file(bad)
    with pytest.raises(ImportError):
        import_file(tmp_path / "missing.py")
