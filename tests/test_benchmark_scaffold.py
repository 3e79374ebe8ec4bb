"""A benchmark from scaffold to rollouts: `ng_init_benchmark` (NeMo Gym 0.7.0's `gym env init --benchmark`),
`ng_prepare_benchmark` (`gym eval prepare`), a benchmark dataset's `prompt_config` applied by `ng_prepare_data`, and
`gym eval run --benchmark`; the errors of a prepare script; and 0.7.0 itself on our scaffold (peer)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nemo_gym_peer07 import peer07_env, peer07_site_packages, peer07_venv

from nemo_gym.cli import gym_router as gym
from nemo_gym.cli import legacy
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import load_config
from nemo_gym.datasets.catalog import catalog_entries
from nemo_gym.datasets.prepare import PrepareDataOptions, prepare_data
from nemo_gym.scaffold.environment import InitBenchmarkOptions, InitEnvironmentOptions, init_benchmark, init_environment

OURS = Path(sys.executable).parent  # our console scripts
PROMPT = "Answer the question. Return only the final answer.\n\n{}"


def prepare(argv: list[str]) -> int:
    return legacy.run("prepare_benchmark", argv)


def collate(config: Path, out: Path) -> list[dict]:
    """`ng_prepare_data +mode=train_preparation` of `config`: the prepared benchmark rows."""
    loaded = load_config([f"+config_paths=[{config}]"], resolve=False)
    options = PrepareDataOptions(output_dirpath=str(out), mode="train_preparation")
    return [json.loads(line) for line in prepare_data(loaded, options)["benchmark"].read_text().splitlines()]


def test_ng_init_benchmark_scaffolds_a_benchmark_that_is_listed_prepared_validated_and_collated(
    tmp_path, monkeypatch, capsys
):
    folder = init_benchmark(InitBenchmarkOptions(name="capitals"), repo_root=tmp_path)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "README.md", "config.yaml", "data/example.jsonl", "data/source.jsonl", "manifest.yaml", "prepare.py",
        "prompt.yaml",
    ]  # fmt: skip
    assert (tmp_path / "resources_servers" / "capitals" / "app.py").is_file()  # its exact-answer server
    [entry] = [e for e in catalog_entries([tmp_path]) if e.name == "capitals"]
    assert (entry.kind, entry.status, entry.integration_profile) == ("benchmark", "experimental", "custom-gym-verifier")
    # the server's own example rows are the benchmark's rows with the benchmark's prompt applied
    server_rows = [json.loads(line) for line in (tmp_path / "resources_servers/capitals/data/example.jsonl").open()]
    source = [json.loads(line) for line in (folder / "data" / "source.jsonl").open()]
    assert [r["responses_create_params"]["input"][0]["content"] for r in server_rows] == [
        PROMPT.format(r["question"]) for r in source
    ]
    # ng_prepare_benchmark runs prepare.py: a row added to the source reaches the prepared file
    with (folder / "data" / "source.jsonl").open("a") as rows:
        rows.write(json.dumps({"question": "What is 2 + 2?", "expected_answer": "4"}) + "\n")
    (folder / "data" / "example.jsonl").unlink()  # to be written into the benchmark's tree, wherever the command runs
    elsewhere = tmp_path / "elsewhere"  # paths found from the benchmark's tree, not the working directory
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert prepare([f"+config_paths=[{folder / 'config.yaml'}]"]) == 0
    assert f"Dataset prepared at: {folder / 'data' / 'example.jsonl'} (6 rows)" in capsys.readouterr().out
    collated = collate(folder / "config.yaml", tmp_path / "prepared")
    assert len(collated) == 6 and collated[-1]["agent_ref"] == {"name": "capitals_simple_agent"}
    assert collated[-1]["responses_create_params"] == {
        "input": [{"role": "user", "content": PROMPT.format("What is 2 + 2?")}]
    }
    assert collated[-1]["expected_answer"] == "4"
    monkeypatch.chdir(tmp_path)
    assert gym.gym_main(["env", "validate", "capitals"]) == 0
    assert "capitals: 6 rows (benchmark)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="benchmarks/capitals exists already"):
        init_benchmark(InitBenchmarkOptions(name="capitals"), repo_root=tmp_path)
    with pytest.raises(ConfigError, match=r"\+name=9x: '9x' is not a Python identifier"):
        init_benchmark(InitBenchmarkOptions(name="9x"), repo_root=tmp_path)


def test_gym_env_init_benchmark_takes_0_7_0s_options(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # written under the current directory, as 0.7.0 writes it
    argv = ["env", "init", "--benchmark", "scored", "--reward-range", "0", "10", "--profile", "custom-gym-verifier"]
    assert gym.gym_main(argv) == 0
    assert "gym eval prepare --benchmark scored" in capsys.readouterr().out
    manifest = yaml.safe_load((tmp_path / "benchmarks" / "scored" / "manifest.yaml").read_text())
    assert manifest["reward"] == {"range": [0.0, 10.0], "higher_is_better": True}
    assert (manifest["kind"], manifest["canonical_split"]) == ("benchmark", "TODO")  # for its author (gym env publish)
    assert gym.gym_main(["env", "init", "--benchmark", "x", "--environment", "y"]) == 2
    assert "--environment and --benchmark: each scaffolds its own resources server" in capsys.readouterr().err
    assert gym.gym_main(["env", "init", "--resources-server", "x", "--reuse-verifier", "mcqa"]) == 2
    assert "--reuse-verifier and the reward options require --environment or --benchmark" in capsys.readouterr().err
    assert gym.gym_main(["env", "init", "--benchmark", "reusing", "--reuse-verifier", "mcqa"]) == 0
    assert "graded by resources_servers/mcqa/ (reused: nothing written there)" in capsys.readouterr().out


MCQA_ROWS = [json.loads(line) for line in (REPO_ROOT / "resources_servers/mcqa/data/example.jsonl").open()]


def test_reuse_verifier_grades_a_benchmark_or_an_environment_with_an_existing_server(tmp_path, monkeypatch, capsys):
    """`--reuse-verifier mcqa`: no server is scaffolded; the config takes mcqa's and moves its agent under the
    workload's name with the workload's dataset; the rows start as mcqa's example rows, a benchmark's carrying their
    own input (prompt_source: prepared, no prompt.yaml)."""
    folder = init_benchmark(InitBenchmarkOptions(name="mcq_bench", reuse_verifier="mcqa"), repo_root=tmp_path)
    assert not (tmp_path / "resources_servers").exists()
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "README.md", "config.yaml", "data/example.jsonl", "data/source.jsonl", "manifest.yaml", "prepare.py",
    ]  # fmt: skip
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())
    assert (manifest["resources_server"], manifest["prompt_source"]) == ("mcqa", "prepared")
    assert manifest["description"] == "Graded by the mcqa resources server"
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["config_paths"] == ["resources_servers/mcqa/configs/mcqa.yaml"]
    assert config["mcq_bench_simple_agent"]["_inherit_from"] == "mcqa_simple_agent"
    (folder / "data" / "example.jsonl").unlink()
    monkeypatch.chdir(tmp_path)
    assert prepare([f"+config_paths=[{folder / 'config.yaml'}]"]) == 0
    collated = collate(folder / "config.yaml", tmp_path / "prepared")
    assert [{k: v for k, v in row.items() if k != "agent_ref"} for row in collated] == MCQA_ROWS
    assert {row["agent_ref"]["name"] for row in collated} == {"mcq_bench_simple_agent"}
    capsys.readouterr()
    assert gym.gym_main(["env", "validate", "mcq_bench"]) == 0
    assert "resources_server: mcqa -> mcqa" in capsys.readouterr().out
    env = init_environment(InitEnvironmentOptions(name="mcq_env", reuse_verifier="mcqa"), repo_root=tmp_path)
    assert [json.loads(line) for line in (env / "data" / "example.jsonl").open()] == MCQA_ROWS
    assert "resources server `resources_servers/mcqa/`" in (env / "README.md").read_text()
    assert "graded by the resources server `resources_servers/mcqa/`" in (folder / "README.md").read_text()
    assert gym.gym_main(["env", "validate", "mcq_env"]) == 0
    assert "mcq_env: 5 rows (example)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (
            None,
            r"--reuse-verifier mcqq: no resources_servers/mcqq/configs/mcqq\.yaml under .* \(did you mean 'mcqa'\?\)",
        ),
        ({"a": {"resources_servers": {"mcqq": {}}}, "b": {"resources_servers": {"mcqq": {}}}}, "exactly one resources"),
        (
            {"a": {"resources_servers": {"mcqq": {}}}, "m": {"responses_api_models": {"x": {}}}},
            "declares a model server",
        ),
        (
            {"a": {"resources_servers": {"mcqq": {}}}, "g": {"responses_api_agents": {"simple_agent": {}}}},
            "its simple_agent g must name the resources server instance a",
        ),
        ({"a": {"resources_servers": {"mcqq": {}}}}, r"data/example\.jsonl is missing"),
    ],
    ids=["missing", "two-servers", "model", "agent", "no-rows"],
)
def test_a_verifier_that_cannot_be_reused_is_named_with_the_rule_and_nothing_is_written(tmp_path, config, error):
    if config is not None:
        (tmp_path / "resources_servers/mcqq/configs").mkdir(parents=True)
        (tmp_path / "resources_servers/mcqq/configs/mcqq.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=error):
        init_benchmark(InitBenchmarkOptions(name="b", reuse_verifier="mcqq"), repo_root=tmp_path)
    assert not (tmp_path / "benchmarks").exists()


def _config(tmp_path: Path, *datasets: dict) -> Path:
    config = tmp_path / "bench.yaml"
    agent = {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py", "datasets": list(datasets)}}}
    config.write_text(yaml.safe_dump({"bench_agent": agent}))
    return config


def _dataset(tmp_path: Path, name: str, script: str | None, **fields) -> dict:
    if script is not None:
        (tmp_path / f"{name}.py").write_text(script)
    return {"name": name, "type": "benchmark", "jsonl_fpath": str(tmp_path / f"{name}.jsonl"),
            "prepare_script": str(tmp_path / f"{name}.py"), **fields}  # fmt: skip


WRITES = """
from pathlib import Path
def prepare(n=1):
    out = Path(__file__).with_suffix(".jsonl")
    out.write_text("".join('{"question": "q%d", "expected_answer": "a"}\\n' % i for i in range(int(n))))
    return out
"""


@pytest.mark.parametrize(
    ("script", "fields", "error"),
    [
        (None, {}, r"its prepare_script .*/b\.py is missing"),
        ("x = 1\n", {}, r"b\.py defines no prepare\(\) function"),
        ("import nemo_gym.benchmarks_utils\n", {}, r"imports nemo_gym\.benchmarks_utils, a module of NVIDIA NeMo Gym"),
        ("import surely_not_installed_pkg\n", {}, "imports surely_not_installed_pkg, which is not installed here"),
        (
            "def prepare():\n    return '/tmp/elsewhere.jsonl'\n",
            {},
            r"returned /tmp/elsewhere\.jsonl, not the dataset's",
        ),
        ("def prepare():\n    raise ValueError('bad row 3')\n", {}, r"prepare\(\) failed .*ValueError: bad row 3"),
        (WRITES, {"prepare_dependencies": ["surely-not-installed-pkg>=1"]}, "are not installed; install them first"),
    ],
    ids=["missing", "no-prepare", "0.7.0-import", "not-installed", "wrong-path", "fails", "dependency"],
)
def test_a_prepare_script_that_cannot_run_is_named_and_no_script_runs_before_all_are_checked(
    tmp_path, capsys, script, fields, error
):
    config = _config(tmp_path, _dataset(tmp_path, "a", WRITES), _dataset(tmp_path, "b", script, **fields))
    assert prepare([f"+config_paths=[{config}]"]) == 2
    err = capsys.readouterr().err
    assert re.search(error, err), err
    if error.startswith(("its", "b", "imports", "are")):  # found by the checks, before any script ran
        assert not (tmp_path / "a.jsonl").exists()


def test_prepare_benchmark_passes_its_arguments_and_skips_what_is_prepared_when_told(tmp_path, capsys):
    config = _config(tmp_path, _dataset(tmp_path, "a", WRITES))
    assert prepare([f"+config_paths=[{config}]", "+prepare_script_args={n: 3}"]) == 0
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 3
    assert prepare([f"+config_paths=[{config}]", "+use_cached_prepared_benchmarks=true"]) == 0
    assert "Skipping a: +use_cached_prepared_benchmarks=true" in capsys.readouterr().out
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 3  # not prepared again (n=1)
    assert prepare([f"+config_paths=[{_config(tmp_path, {'name': 'x', 'type': 'train', 'jsonl_fpath': 'x'})}]"]) == 2
    assert "no dataset of the config has a prepare_script" in capsys.readouterr().err
    assert prepare([f"+config_paths=[{config}]", "+use_cached_prepared_benchmarks=maybe"]) == 2
    assert "use_cached_prepared_benchmarks" in capsys.readouterr().err


PID = """
import os
from pathlib import Path
def prepare():
    out = Path(__file__).with_suffix(".jsonl")
    out.write_text('{"pid": %d}\\n' % os.getpid())
    return out
"""


def test_prepare_benchmark_runs_scripts_in_processes_of_their_own_when_told(tmp_path, capsys):
    datasets = [_dataset(tmp_path, name, PID) for name in ("a", "b")]
    assert prepare([f"+config_paths=[{_config(tmp_path, *datasets)}]", "+num_prepare_benchmark_processes=2"]) == 0
    pids = {json.loads((tmp_path / f"{name}.jsonl").read_text())["pid"] for name in ("a", "b")}
    assert os.getpid() not in pids and len(pids) >= 1
    failing = _dataset(tmp_path, "c", "def prepare():\n    raise ValueError('bad row 3')\n")
    config = _config(tmp_path, *datasets, failing)
    assert prepare([f"+config_paths=[{config}]", "+num_prepare_benchmark_processes=2"]) == 2
    assert "c.py: prepare() failed for dataset 'c': ValueError: bad row 3" in capsys.readouterr().err


def test_a_benchmark_datasets_prompt_config_builds_each_rows_input_and_its_errors_name_the_line(tmp_path):
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text("system: Be brief.\nuser: 'Q: {question}'\n")
    rows = tmp_path / "a.jsonl"
    rows.write_text(json.dumps({"question": "q0", "expected_answer": "a"}) + "\n")
    config = _config(tmp_path, _dataset(tmp_path, "a", WRITES, prompt_config=str(prompt)))
    [row] = collate(config, tmp_path / "out")
    assert row["responses_create_params"]["input"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: q0"},
    ]  # fmt: skip
    rows.write_text(
        json.dumps({"question": "q0"}) + "\n" + json.dumps({"answer": "a"}) + "\n"
        + json.dumps({"question": "q", "responses_create_params": {"input": "already"}}) + "\n"
    )  # fmt: skip
    with pytest.raises(DataError) as raised:
        collate(config, tmp_path / "out")
    assert f"{rows}:2: [prompt-config]: the prompt template names the field 'question'" in str(raised.value)
    assert f"{rows}:3: [prompt-config]: has responses_create_params.input and +prompt_config builds it" in str(
        raised.value
    )
    rows.unlink()  # not prepared yet: the prepare script is named, not a download
    with pytest.raises(DataError, match=r"is not prepared: its prepare_script .*a\.py writes it.*ng_prepare_benchmark"):
        collate(config, tmp_path / "out")


@pytest.mark.long
@pytest.mark.integration
def test_the_scaffolded_benchmark_is_tested_and_run_by_gym_eval_run(tmp_path):
    """Its server's tests and verifier cases pass (`gym env test NAME`), `gym env publish NAME` passes it once its
    placeholders (authors, canonical_split) are replaced, and `gym eval run --benchmark NAME --split
    benchmark` collects its prepared rows through its servers (the scripted model answering 42: one right); and so
    for a benchmark graded by mcqa (`--reuse-verifier mcqa`, the model answering \\boxed{B})."""
    init_benchmark(InitBenchmarkOptions(name="capitals"), repo_root=tmp_path)

    def gym_run(*argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run([str(OURS / "gym"), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    assert "verifier cases: 3 passed, 0 failed" in gym_run("env", "test", "capitals").stdout
    manifest = tmp_path / "benchmarks" / "capitals" / "manifest.yaml"  # publishable once its placeholders are gone
    manifest.write_text(manifest.read_text().replace("- TODO", "- Ada Lovelace").replace(": TODO", ": test"))
    assert json.loads(gym_run("env", "publish", "capitals", "--json").stdout)["kind"] == "benchmark"
    out = tmp_path / "results" / "rollouts.jsonl"
    reply = "+policy_model.responses_api_models.scripted_model.default_reply='42'"
    done = gym_run("eval", "run", "--benchmark", "capitals", "--split", "benchmark", "--model-type", "scripted_model",
                   "--output", str(out), reply)  # fmt: skip
    assert "Rollouts: 5/5" in done.stdout
    rollouts = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["reward"], r["expected_answer"]) for r in rollouts)[-1] == (1.0, "42")
    assert sum(r["reward"] for r in rollouts) == 1.0
    assert {r["responses_create_params"]["input"][0]["content"] for r in rollouts} >= {PROMPT.format("What is 6 x 7?")}
    # one graded by mcqa (--reuse-verifier): its rows, its grading (the letter in the box)
    init_benchmark(InitBenchmarkOptions(name="mcq_bench", reuse_verifier="mcqa"), repo_root=tmp_path)
    out = tmp_path / "results" / "mcq.jsonl"
    reply = "+policy_model.responses_api_models.scripted_model.default_reply='\\boxed{B}'"
    gym_run("eval", "run", "--benchmark", "mcq_bench", "--split", "benchmark", "--model-type", "scripted_model",
            "--output", str(out), reply)  # fmt: skip
    rollouts = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["_ng_task_index"])
    assert [r["reward"] for r in rollouts] == [float(row["expected_answer"] == "B") for row in MCQA_ROWS]


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(600)
def test_0_7_0_validates_and_prepares_our_benchmark_scaffold(tmp_path):
    """0.7.0's `gym env validate NAME` passes our benchmark scaffold, and its `gym eval prepare --benchmark NAME` runs
    our prepare.py into the file the dataset names; it passes one that reuses mcqa too."""
    folder = init_benchmark(InitBenchmarkOptions(name="capitals"), repo_root=tmp_path)
    (folder / "data" / "example.jsonl").unlink()

    def theirs(*argv: str) -> str:
        done = subprocess.run([str(peer07_venv() / "bin" / "gym"), *argv], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env=peer07_env())  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    theirs("eval", "prepare", "--benchmark", "capitals")
    assert (folder / "data" / "example.jsonl").read_text() == (folder / "data" / "source.jsonl").read_text()
    validated = theirs("env", "validate", "capitals")
    assert "Manifest: capitals 0.1.0 kind=benchmark profile=custom-gym-verifier" in validated
    assert "capitals: 5 rows (benchmark)" in validated
    init_benchmark(InitBenchmarkOptions(name="mcq_bench", reuse_verifier="mcqa"), repo_root=tmp_path)
    validated = theirs("env", "validate", "mcq_bench")  # its config names 0.7.0's own mcqa there
    assert "resources_server: mcqa -> mcqa" in validated and "mcq_bench: 5 rows (benchmark)" in validated


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(600)
def test_0_7_0s_own_benchmark_is_prepared_and_collated_as_0_7_0_does(tmp_path):
    """0.7.0's `benchmarks/answer-judge` (its prepare.py writes its rows without the network; its prompt template is
    `benchmarks/prompts/judge/math.yaml`; its verifier `math_proof_judgement`), copied into a tree of ours and one of
    0.7.0's: our `gym eval prepare --benchmark answer-judge` writes the file 0.7.0's writes, byte for byte, and our
    `ng_prepare_data` collates the rows 0.7.0's `gym dataset collate` does, prompt applied (0.7.0 routes a row by
    `task_source`, ours by `agent_ref`: the one field that differs)."""
    site = peer07_site_packages()
    trees = {who: tmp_path / who for who in ("ours", "theirs")}
    for tree in trees.values():
        for part in ("benchmarks/answer-judge", "benchmarks/prompts", "resources_servers/math_proof_judgement"):
            shutil.copytree(site / part, tree / part)
    data = Path("benchmarks/answer-judge/data/answer-judge_benchmark.jsonl")

    def run(argv: list[str], tree: Path, **env) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tree, env=env or None)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    theirs_gym = [str(peer07_venv() / "bin" / "gym")]
    run([*theirs_gym, "eval", "prepare", "--benchmark", "answer-judge"], trees["theirs"], **peer07_env())
    run([str(OURS / "gym"), "eval", "prepare", "--benchmark", "answer-judge"], trees["ours"])
    assert (trees["ours"] / data).read_bytes() == (trees["theirs"] / data).read_bytes()
    config = "benchmarks/answer-judge/config.yaml"
    run([*theirs_gym, "dataset", "collate", "--config", config, "--mode", "train_preparation", "--output-dir",
         str(tmp_path / "collated_theirs")], trees["theirs"], **peer07_env())  # fmt: skip
    run([str(OURS / "ng_prepare_data"), f"+config_paths=[{config}]", "+mode=train_preparation",
         f"+output_dirpath={tmp_path / 'collated_ours'}"], trees["ours"])  # fmt: skip

    def rows(folder: str) -> list[dict]:
        lines = (tmp_path / folder / "benchmark.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k not in ("agent_ref", "task_source")} for line in lines]

    ours, theirs = rows("collated_ours"), rows("collated_theirs")
    assert len(ours) == 12 and ours == theirs
    assert ours[0]["responses_create_params"]["input"][0]["content"].startswith("You will be asked to look at")
