"""NeMo Gym 0.7.0's run-level Agent Skills in ng_collect_rollouts (`+skills.path=<dir>`, nemo_gym.collect.skills):
every row sent to an agent carries `skills_ref` {path, hash, skills}, its hash 0.7.0's content digest (the same
SkillsRef as 0.7.0's own `load_skill_directory`, run in its venv); a bad directory is refused before any rollout,
naming `+skills.path`; a materialized task takes no skills; another skills variant is another input (no resume
into the earlier output). Collections go through test_collect's agent (it echoes the row) on a real head server."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from nemo_gym_peer07 import peer07_json
from ng_process import BIN
from test_collect import collect, config, gym, rows_of, write_input  # noqa: F401  (gym: the fixture)

from nemo_gym.collect.skills import load_skill_directory
from nemo_gym.common.errors import ConfigError, DataError


def write_skills(root: Path) -> Path:
    """Two skills: weather (description, metadata.version, a script beside it) and math (a BOM, name only)."""
    (root / "weather" / "scripts").mkdir(parents=True)
    (root / "weather" / "SKILL.md").write_text(
        "---\nname: weather\ndescription: Look the weather up.\nmetadata:\n  version: 1.2\n---\nCall get_weather.\n"
    )
    (root / "weather" / "scripts" / "check.py").write_text("print('ok')\n")
    (root / "math").mkdir()
    (root / "math" / "SKILL.md").write_text("\ufeff---\nname: math\n---\nShow the steps.\n", encoding="utf-8")
    return root


def test_every_row_sent_carries_the_skills_ref_and_a_changed_skill_is_another_input(tmp_path, gym):  # noqa: F811
    skills = write_skills(tmp_path / "skills")
    write_input(tmp_path / "in.jsonl", 3)
    cfg = config(tmp_path, gym, skills={"path": str(skills)}, num_repeats=2)
    collect(cfg)
    stamps = [row["skills_ref"] for row in rows_of(cfg.output_jsonl_fpath)]
    assert len(stamps) == 6 and all(stamp == stamps[0] for stamp in stamps)
    assert stamps[0]["path"] == str(skills) and len(stamps[0]["hash"]) == 12
    assert stamps[0]["skills"] == [
        {"name": "math", "description": None, "version": None},
        {"name": "weather", "description": "Look the weather up.", "version": "1.2"},
    ]
    # a skill edited in place (its supporting file) is another variant: another hash, and the earlier output is
    # not resumed with it
    (skills / "weather" / "scripts" / "check.py").write_text("print('changed')\n")
    assert load_skill_directory(str(skills)).hash != stamps[0]["hash"]
    with pytest.raises(ConfigError, match="different input"):
        collect(cfg)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({}, "does not exist"),
        ({"SKILLS": "a file"}, "is a file"),
        ({"SKILLS/": None}, "holds no skill"),
        ({"SKILLS/a/README.md": "x"}, "has no SKILL.md"),
        ({"SKILLS/a/SKILL.md": "name: a\n"}, "has no YAML front matter"),
        ({"SKILLS/a/SKILL.md": "---\nname: a\n"}, "no closing '---'"),
        ({"SKILLS/a/SKILL.md": "---\n- a\n---\n"}, "must be a mapping"),
        ({"SKILLS/a/SKILL.md": "---\ndescription: d\n---\n"}, "has no name"),
    ],
)
def test_a_bad_skills_directory_is_refused_naming_the_key(tmp_path, layout, message):
    for relative, text in layout.items():
        path = tmp_path / relative
        if text is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^\+skills\.path: .*{message}"):
        load_skill_directory(str(tmp_path / "SKILLS"))


def test_the_command_line_takes_skills_path_and_refuses_a_typo_and_a_bad_directory_before_any_rollout(tmp_path):
    rows = write_input(tmp_path / "in.jsonl", 1)
    for argument, message in (
        ("+skills.pth=x", "pth"),
        (f"+skills.path={tmp_path}/nowhere", r"\+skills\.path: .*does not exist"),
    ):
        done = subprocess.run(
            [str(BIN / "ng_collect_rollouts"), f"+input_jsonl_fpath={rows}", f"+output_jsonl_fpath={tmp_path}/o.jsonl"]
            + ["+agent_name=agent", "+head_server_url=http://127.0.0.1:9", argument],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and re.search(message, done.stderr), (argument, done.stderr)
        assert not (tmp_path / "o.jsonl").exists()


def test_materialized_tasks_take_no_skills(tmp_path, gym):  # noqa: F811
    tasks = tmp_path / "in.jsonl"
    tasks.write_text(json.dumps({"task_id": {"taskset": "t", "task_id": "0"}, "task_input": {}}) + "\n")
    cfg = config(tmp_path, gym, skills={"path": str(write_skills(tmp_path / "skills"))})
    with pytest.raises(DataError, match=r"in\.jsonl:1: \+skills are not applied to a NeMo Gym 0\.7\.0 materialized"):
        collect(cfg)


PEER_SKILLS = """
import json, sys
from nemo_gym.skills import load_skill_directory
print(json.dumps(load_skill_directory(sys.argv[1]).model_dump()))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(120)
def test_the_skills_ref_is_0_7_0s(tmp_path):
    """0.7.0's own `load_skill_directory` (in its venv) on the same directory gives the same SkillsRef: path, hash
    and metadata."""
    skills = str(write_skills(tmp_path / "skills"))
    assert peer07_json(PEER_SKILLS, skills, timeout=100) == load_skill_directory(skills).model_dump()
