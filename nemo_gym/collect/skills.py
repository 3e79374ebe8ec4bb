"""Agent Skills for a collection (NeMo Gym 0.7.0's run-level `skills`): `+skills.path=<dir>` names a directory of
skills in the Agent Skills standard (https://agentskills.io/specification: one folder per skill, each with a
`SKILL.md` whose YAML front matter has `name`, and optionally `description` and `metadata.version`).

The collector reads the directory once, before any rollout (`load_skill_directory`), and stamps every row it sends
to an agent with `skills_ref` `{path, hash, skills: [{name, description, version}]}`; agents that run a skill-aware
harness (0.7.0's claude_code_agent, codex_agent, ...) stage the directory for it, and the rollouts keep the stamp,
so variants of the skills can be told apart and compared. `hash` is 0.7.0's content digest (`skills.hash_skill_dir`:
sha256 over each file's relative path and bytes, in sorted order, first 12 hex digits), so a skill edited in place
gets another hash. A materialized task (0.7.0's taskset rows) takes no skills, as in 0.7.0.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.collect.prompt_templates import resolve_prompt_path
from nemo_gym.common.errors import ConfigError

__all__ = ["SKILLS_REF_KEY", "SkillsConfig", "SkillsRef", "hash_skill_dir", "load_skill_directory"]

SKILLS_REF_KEY = "skills_ref"  # the row field (0.7.0's SKILLS_REF_KEY_NAME)
SKILL_MD = "SKILL.md"
HASH_DIGITS = 12


class SkillsConfig(BaseModel):
    """`+skills`: `{path: <directory of skill directories>}`; relative: under $NEMO_GYM_EXTRA_ROOTS, else the working
    directory (as 0.7.0 resolves it)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="directory of Agent Skills standard skill directories (each with a SKILL.md)")


class SkillMetadata(BaseModel):
    name: str
    description: str | None = None
    version: str | None = None


class SkillsRef(BaseModel):
    """The stamp on each row and rollout: the path as given, the content hash, each skill's metadata (sorted by
    folder name)."""

    path: str
    hash: str
    skills: list[SkillMetadata]


def hash_skill_dir(root: Path) -> str:
    """0.7.0's content digest of a skills directory: sha256 over each file's path relative to `root` (POSIX) and its
    bytes, each followed by a NUL byte, files in sorted path order; its first HASH_DIGITS hex digits."""
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:HASH_DIGITS]


def _front_matter(skill_md: Path) -> dict[str, Any]:
    """The YAML between the `---` lines that open `skill_md` (a BOM is ignored).

    Raises:
        ConfigError: no front matter, none closed, not YAML, not a mapping.
    """
    lines = skill_md.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"+skills.path: {skill_md} has no YAML front matter (a first line '---', then name:)")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise ConfigError(f"+skills.path: {skill_md}: its front matter has no closing '---' line")
    try:
        data = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"+skills.path: {skill_md}: front matter is not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"+skills.path: {skill_md}: front matter must be a mapping, got {type(data).__name__}")
    return data


def _skill(skill_md: Path) -> SkillMetadata:
    data = _front_matter(skill_md)
    if not data.get("name"):
        raise ConfigError(f"+skills.path: {skill_md}: front matter has no name")
    metadata = data.get("metadata")  # the standard keeps the version under metadata:
    version = metadata.get("version") if isinstance(metadata, dict) else None
    description = data.get("description")
    return SkillMetadata(
        name=str(data["name"]),
        description=None if description is None else str(description),
        version=None if version is None else str(version),
    )


def load_skill_directory(path: str) -> SkillsRef:
    """The skills of the directory `path` (resolved as the module docstring says).

    Raises:
        ConfigError: (`+skills.path: ...`) the path is missing or not a directory, it holds no skill, a skill folder
            has no SKILL.md, or a SKILL.md has no valid front matter with a name.
    """
    root = resolve_prompt_path(path)
    if not root.is_dir():
        what = "is a file, not a directory of skill directories" if root.exists() else "does not exist"
        raise ConfigError(f"+skills.path: {root} {what} (from +skills.path={path})")
    skills = []
    for folder in sorted(d for d in root.iterdir() if d.is_dir()):
        if not (folder / SKILL_MD).is_file():
            raise ConfigError(f"+skills.path: {folder} has no {SKILL_MD}: each skill is a directory with one")
        skills.append(_skill(folder / SKILL_MD))
    if not skills:
        raise ConfigError(f"+skills.path: {root} holds no skill (a directory with a {SKILL_MD} in it)")
    return SkillsRef(path=path, hash=hash_skill_dir(root), skills=skills)
