"""`ng_init +template=<name> +name=<project>`: create a runnable project folder from a template.

A template is a folder `nemo_gym/templates/projects/<template name>/` with a `template.yaml`
(`description: <one line>`, `kind: rl | train`) and the project's files. Files ending in `.tmpl` are rendered
with Python's `string.Template` and written without the suffix; every other file is copied verbatim (mode
bits kept). `$name` is the project name (also in file and folder names, e.g. `configs/$name.yaml.tmpl`);
`$$` is a literal dollar sign. The project is assembled in a hidden sibling folder and renamed into place at
the end, so a failed init leaves nothing behind, and an existing folder is never touched.

    ng_init +template=list                          # every template: name, kind, description
    ng_init +template=rl-tools +name=my_agent       # ./my_agent/
    ng_init +template=sql +name=text2sql +output_dir=projects
"""

from __future__ import annotations

import keyword
import os
import shutil
import string
import tempfile
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import did_you_mean

__all__ = [
    "PROJECT_TEMPLATES_DIR",
    "TemplateInfo",
    "ProjectInitOptions",
    "list_templates",
    "find_template",
    "check_project_name",
    "init_project",
    "format_template_list",
    "init_main",
]

PROJECT_TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates" / "projects"
TEMPLATE_SPEC = "template.yaml"
TEMPLATE_SUFFIX = ".tmpl"
SKIPPED_NAMES = frozenset(
    {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".DS_Store"}
)  # build litter, never copied
SKIPPED_SUFFIXES = (".pyc", ".pyo")


class TemplateInfo(BaseModel):
    """A template's `template.yaml`, plus where it lives."""

    model_config = ConfigDict(extra="forbid")
    description: str = Field(min_length=1, description="one line on what the project is (shown by +template=list)")
    kind: Literal["rl", "train"] = Field(
        description="rl: ng_run + ng_collect_rollouts (and ng_train); train: an ng_train recipe"
    )
    name: str = Field("", exclude=True, description="the template's folder name")
    folder: Path = Field(Path(), exclude=True, description="the template's folder")


class ProjectInitOptions(BaseModel):
    """Parameters of `ng_init`."""

    model_config = ConfigDict(extra="forbid")
    template: str = Field(
        description="template to copy, or 'list' to print every template with its kind and description"
    )
    name: str | None = Field(
        None,
        description=(
            "project folder to create and name used inside it (a Python identifier: letters, digits, _); required"
            " unless +template=list"
        ),
    )
    output_dir: str = Field(".", description="folder in which the project folder is created (created if missing)")


def _read_info(folder: Path) -> TemplateInfo:
    path = folder / TEMPLATE_SPEC
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with keys description and kind, got {type(data).__name__}")
    try:
        info = TemplateInfo.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"key '{'.'.join(map(str, e['loc']))}': {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path}: {problems}") from exc
    return info.model_copy(update={"name": folder.name, "folder": folder})


def list_templates(root: Path = PROJECT_TEMPLATES_DIR) -> list[TemplateInfo]:
    """Every template under `root` (a folder with a `template.yaml`), sorted by name.

    Raises:
        ConfigError: a `template.yaml` that is not valid (names the file and key).
    """
    if not root.is_dir():
        return []
    return [_read_info(folder) for folder in sorted(root.iterdir()) if (folder / TEMPLATE_SPEC).is_file()]


def find_template(name: str, root: Path = PROJECT_TEMPLATES_DIR) -> TemplateInfo:
    """The template called `name`.

    Raises:
        ConfigError: no such template (with a suggestion and the list of names).
    """
    templates = {t.name: t for t in list_templates(root)}
    if name not in templates:
        raise ConfigError(
            f"+template={name}: no such template{did_you_mean(name, templates)}. Templates:"
            f" {', '.join(templates) or 'none'} (ng_init +template=list)"
        )
    return templates[name]


def check_project_name(name: str | None) -> str:
    """`name` when it is a Python identifier that is not a keyword (it names config keys, folders and modules).

    Raises:
        ConfigError: a missing or unsafe name, with a suggestion.
    """
    if not name:
        raise ConfigError(
            "+name is required: the project folder to create, e.g. ng_init +template=first-rl +name=my_project"
        )
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        cleaned = "".join(c if c.isascii() and c.isalnum() else "_" for c in name).strip("_") or "my_project"
        suggestion = "project_" + cleaned if cleaned[0].isdigit() or keyword.iskeyword(cleaned) else cleaned
        raise ConfigError(
            f"+name={name}: {name!r} is not identifier-safe; it names the folder, the server instances and the config"
            " keys, so use ASCII letters, digits and _ (not starting with a digit, not a Python keyword), e.g."
            f" +name={suggestion}"
        )
    return name


def _render(text: str, values: dict[str, str], source: Path) -> str:
    try:
        return string.Template(text).substitute(values)
    except KeyError as exc:
        raise ConfigError(
            f"{source}: unknown placeholder ${exc.args[0]}; known: {', '.join('$' + k for k in values)} (write $$ for a"
            " literal $)"
        ) from exc
    except ValueError as exc:  # "Invalid placeholder in string: line 3, col 5"
        raise ConfigError(f"{source}: {exc} (write $$ for a literal $)") from exc


def _copy_tree(template: Path, target: Path, values: dict[str, str]) -> list[Path]:
    """Render/copy every file of `template` into `target`; returns the written paths relative to `target`."""
    written = []
    for source in sorted(template.rglob("*")):
        rel = source.relative_to(template)
        if (
            rel == Path(TEMPLATE_SPEC)
            or any(part in SKIPPED_NAMES for part in rel.parts)
            or source.suffix in SKIPPED_SUFFIXES
            or source.is_dir()
        ):
            continue
        out_rel = Path(_render(str(rel), values, source))
        if source.name.endswith(TEMPLATE_SUFFIX):
            out_rel = out_rel.with_name(out_rel.name[: -len(TEMPLATE_SUFFIX)])
            (target / out_rel).parent.mkdir(parents=True, exist_ok=True)
            (target / out_rel).write_text(_render(source.read_text(), values, source))
            shutil.copymode(source, target / out_rel)
        else:
            (target / out_rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / out_rel)
        written.append(out_rel)
    return written


def init_project(
    template: str, name: str | None, output_dir: str | Path = ".", *, root: Path = PROJECT_TEMPLATES_DIR
) -> Path:
    """Create the project folder `output_dir/name` from template `template`. Returns the folder.

    Raises:
        ConfigError: an unknown template, a name that is not identifier-safe, the folder exists already, or a
            template file with a bad placeholder.
    """
    info = find_template(template, root)
    name = check_project_name(name)
    parent = Path(output_dir).expanduser().resolve()
    target = parent / name
    if target.exists() or target.is_symlink():
        raise ConfigError(
            f"{target} exists already; not overwriting it. Choose another +name, another +output_dir, or delete the"
            " folder first."
        )
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    try:
        _copy_tree(info.folder, staging, {"name": name})
        staging.chmod(0o755)  # mkdtemp makes it 0700; a project folder is an ordinary folder
        if target.exists():  # created meanwhile by someone else: still never overwrite
            raise ConfigError(f"{target} exists already; not overwriting it.")
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def format_template_list(templates: list[TemplateInfo]) -> str:
    """One line per template: name, kind, description (aligned)."""
    width = max([len(t.name) for t in templates] + [8])
    return "\n".join(f"{t.name:<{width}}  {t.kind:<5}  {t.description}" for t in templates)


def init_main(options: ProjectInitOptions) -> int:
    if options.template == "list":
        templates = list_templates()
        print(format_template_list(templates) if templates else f"no templates found under {PROJECT_TEMPLATES_DIR}")
        return 0
    folder = init_project(options.template, options.name, options.output_dir)
    info = find_template(options.template)
    shown = os.path.relpath(folder) if folder.is_relative_to(Path.cwd()) else str(folder)
    print(f"Created {shown}/ from template {info.name} ({info.kind}): {info.description}")
    for path in sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file()):
        print(f"  {path}")
    print(f"Next: cd {shown} and follow README.md (it lists the exact commands).")
    return 0
