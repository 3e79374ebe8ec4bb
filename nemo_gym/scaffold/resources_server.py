"""`ng_init_resources_server`: scaffold a complete, working resources server folder.

The files come from `nemo_gym/templates/resources_server/*.tmpl`, with `{{name}}`, `{{class_name}}` and
`{{description}}` filled in. The scaffold is a word-counting task (one tool, a binary reward) that passes
`ng_test +should_validate_data=true` as written; its author then edits the tool, the rows and `verify`.
"""

from __future__ import annotations

import json
import keyword
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.env.dataset_metrics import dataset_metrics, metrics_path

__all__ = ["EXACT_ANSWER_TEMPLATES", "InitOptions", "init_resources_server", "init_main", "TEMPLATES_DIR"]

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates" / "resources_server"
# the exact-answer server of `ng_init_benchmark` (no tools; `expected_answer` a string), the same files
EXACT_ANSWER_TEMPLATES = TEMPLATES_DIR.parent / "exact_answer_server"

# template file → path inside the new server folder ({name} is the server name)
FILES = {
    "app.py.tmpl": "app.py",
    "config.yaml.tmpl": "configs/{name}.yaml",
    "example.jsonl.tmpl": "data/example.jsonl",
    "requirements.txt.tmpl": "requirements.txt",
    "test_app.py.tmpl": "tests/test_app.py",
    "verifier_cases.jsonl.tmpl": "tests/verifier_cases.jsonl",
    "README.md.tmpl": "README.md",
}


class InitOptions(BaseModel):
    """Parameters of `ng_init_resources_server`."""

    model_config = ConfigDict(extra="forbid")
    entrypoint: str = Field(
        description="folder to create, resources_servers/<name>; <name> must be a Python identifier"
    )
    description: str = Field(
        "Word counting with a tool", description="one line on what the environment does (config and README)"
    )


def class_name(name: str) -> str:
    """`word_count` → `WordCountServer`."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) + "Server"


def server_name(entrypoint: str) -> str:
    """The server name of `resources_servers/<name>`.

    Raises:
        ConfigError: another folder than resources_servers/, or a name that is not a Python identifier.
    """
    parts = Path(entrypoint.strip().rstrip("/")).parts
    if len(parts) != 2 or parts[0] != "resources_servers":
        raise ConfigError(
            f"+entrypoint={entrypoint}: expected resources_servers/<name>, e.g."
            " +entrypoint=resources_servers/word_count"
        )
    name = parts[1]
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ConfigError(
            f"+entrypoint={entrypoint}: {name!r} is not a Python identifier (letters, digits, _; not starting with a"
            f" digit), e.g. {_suggest(name)}"
        )
    return name


def _suggest(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in name).strip("_") or "my_env"
    return "env_" + cleaned if cleaned[0].isdigit() or keyword.iskeyword(cleaned) else cleaned


def render(template: str, values: dict[str, str]) -> str:
    """`template` with each `{{key}}` replaced by `values[key]`."""
    for key, value in values.items():
        template = template.replace("{{" + key + "}}", value)
    return template


def init_resources_server(
    entrypoint: str,
    description: str = "Word counting with a tool",
    *,
    repo_root: Path = REPO_ROOT,
    templates: Path = TEMPLATES_DIR,
) -> Path:
    """Create the server folder `repo_root/entrypoint` from the templates of `templates` (`TEMPLATES_DIR`: the word
    counter; `EXACT_ANSWER_TEMPLATES`: exact-answer grading). Returns the folder.

    Raises:
        ConfigError: bad entrypoint or name (see `server_name`), or the folder exists already.
    """
    name = server_name(entrypoint)
    folder = repo_root / "resources_servers" / name
    if folder.exists():
        raise ConfigError(
            f"{folder} exists already; not overwriting it. Choose another name or delete the folder first."
        )
    values = {"name": name, "class_name": class_name(name), "description": description.replace('"', "'")}
    for template, target in FILES.items():
        path = folder / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render((templates / template).read_text(), values))
    write_example_metrics(folder)
    return folder


def write_example_metrics(folder: Path) -> Path:
    """`data/example_metrics.json` of the scaffold, as `ng_prepare_data +mode=example_validation` writes it."""
    examples = folder / "data" / "example.jsonl"
    rows = read_jsonl(examples)
    spec = {
        "name": "example",
        "type": "example",
        "jsonl_fpath": f"resources_servers/{folder.name}/data/example.jsonl",
        "num_repeats": 1,
        "license": "Apache 2.0",
    }
    path = metrics_path(examples)
    path.write_text(json.dumps({**spec, **dataset_metrics(rows)}, indent=4) + "\n")
    return path


def init_main(options: InitOptions) -> int:
    """`ng_init_resources_server`: the folder created under the current directory (as NeMo Gym creates it: the
    repository's root when run there, else the user's project), what it holds and the next steps. Returns 0."""
    root = Path.cwd()
    folder = init_resources_server(options.entrypoint, options.description, repo_root=root)
    rel = folder.relative_to(root)
    print(f"Created {rel}/ with:")
    for target in [*FILES.values(), "data/example_metrics.json"]:
        print(f"  {rel}/{target.format(name=folder.name)}")
    print("Next steps:")
    print(f"  ng_test +entrypoint={rel} +should_validate_data=true")
    print(
        "  ng_run"
        f' "+config_paths=[{rel}/configs/{folder.name}.yaml,responses_api_models/vllm_model/configs/vllm_model.yaml]"'
    )
    return 0
