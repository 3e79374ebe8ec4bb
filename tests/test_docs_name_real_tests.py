"""The tests that README.md and docs/*.md name beside their claims exist: a file `test_x.py` (under tests/ or a
server folder's tests/), and with `::name` a test function of it. `::name` alone names a test of the file named
last on the same line; a parametrized id (`[...]`) is not checked. And the code cites no document outside the
repository (design notes' numbered sections, issues): docstrings point to docs/architecture.md's sections."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from nemo_gym.common.layout import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(
    r"(?P<file>(?:[\w./-]*/)?test_\w+\.py)?::(?P<name>test_\w+)|(?P<alone>(?:[\w./-]*/)?test_\w+\.py)"
)


@cache
def known_test_files() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for path in REPO_ROOT.rglob("test_*.py"):
        if not {".venv", ".git", "node_modules"} & set(path.parts):
            found.setdefault(path.name, []).append(path)
    return found


def named_tests(doc: Path) -> list[tuple[int, str, str | None]]:
    """(line number, test file name, test name or None) of each reference in a document."""
    found = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        last_file = None
        for match in REFERENCE.finditer(line):
            file = match["file"] or match["alone"]
            if file:
                last_file = Path(file).name
            if last_file:
                found.append((number, last_file, match["name"]))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_named_test_exists(doc):
    missing = []
    for number, file, name in named_tests(doc):
        paths = known_test_files().get(file, [])
        if not paths:
            missing.append(f"{doc.name}:{number}: no test file {file}")
        elif name and not any(re.search(rf"^\s*(async )?def {name}\(", path.read_text(), re.M) for path in paths):
            missing.append(f"{doc.name}:{number}: {file} has no test {name}")
    assert not missing, "\n".join(missing)


def test_the_reader_of_references_finds_them(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "a claim (`tests/test_config.py::test_one`, `::test_two`) and `test_profile.py`\nno file `::test_three`\n"
    )
    assert named_tests(doc) == [
        (1, "test_config.py", "test_one"),
        (1, "test_config.py", "test_two"),
        (1, "test_profile.py", None),
    ]


def test_the_picture_of_the_folders_is_the_codes():
    """docs/architecture.md's picture of nemo_gym's folders is what scripts/draw_layers.py draws from the imports
    now."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "draw_layers.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# A reference to a document a reader of the repository does not have: the design notes' numbered sections
# ("ARCHITECTURE §3", "STYLE 10", "STYLE.md") and the issues the work came from ("issue 26", "Issue 8, item 4").
# A docstring points to docs/architecture.md's section instead, or says the reason in words.
OUTSIDE_REFERENCE = re.compile(r"ARCHITECTURE\s*§\s*\d*|\bSTYLE(?:\.md|\s+§?\d+)|(?i:\bissues?\s+#?\d+)")
CODE_FOLDERS = (
    "nemo_gym",
    "resources_servers",
    "responses_api_agents",
    "responses_api_models",
    "scripts",
    "benchmarks",
    "examples",
)


def outside_references(text: str) -> list[tuple[int, str]]:
    """(line number, the reference) of each reference to a document outside the repository."""
    return [
        (number, match[0])
        for number, line in enumerate(text.splitlines(), 1)
        for match in OUTSIDE_REFERENCE.finditer(line)
    ]


def test_code_cites_no_document_outside_the_repository():
    found = []
    for folder in CODE_FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if {".venv", "node_modules", "__pycache__"} & set(path.parts):
                continue
            found += [
                f"{path.relative_to(REPO_ROOT)}:{number}: {ref}" for number, ref in outside_references(path.read_text())
            ]
    assert not found, "cite docs/architecture.md's section, or say the reason, instead of:\n" + "\n".join(found)


def test_the_reader_of_outside_references_finds_them():
    text = (
        '"""Rows follow ARCHITECTURE §3 (STYLE 10, STYLE.md §4; issue 26, Issue 8 item 4, issues #12).\nRFC 9110'
        ' §10.2.3, DAPO §3.2, torchtune style 3, an issue with 2 servers; docs/architecture.md, Data formats."""'
    )
    assert [ref for _, ref in outside_references(text)] == [
        "ARCHITECTURE §3",
        "STYLE 10",
        "STYLE.md",
        "issue 26",
        "Issue 8",
        "issues #12",
    ]
