"""`gym` / `ng` (NeMo Gym 0.7.0's subcommands over our commands, `nemo_gym.cli.gym_router`) and the seven `ng_*`
commands of 0.7.0 we lacked, with ng_list_environments (`nemo_gym.cli.legacy`): routing and flag translation, and
each command on small files (the catalog's: tests/test_catalog.py).
Fast, offline; the same inputs against NeMo Gym 0.7.0 itself are in tests/test_gym_cli_peer07.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nemo_gym.cli import e2e, legacy
from nemo_gym.cli import gym_router as gym
from nemo_gym.collect import aggregate_rollouts
from nemo_gym.common.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
# the seven `ng_*` commands 0.7.0 added, and the command behind its `gym list environments` / `gym search`
LEGACY = ("aggregate_rollouts", "e2e_collect_rollouts", "list_benchmarks", "materialize_prompts", "prepare_benchmark")
LEGACY += ("reinstall", "validate", "list_environments", "publish_environment")


@pytest.fixture
def routed(monkeypatch):
    """gym_main's calls of our commands, recorded instead of run: [(name, argv)]."""
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(gym, "run_named", lambda name, argv: calls.append((name, argv)) or 0)
    return calls


# -- the router ------------------------------------------------------------------------------------------
def test_help_lists_supported_subcommands_and_the_unsupported_with_why(capsys):
    assert gym.gym_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "{list,dataset,env,eval,dev,search}" in out
    assert "gym eval submit: Slurm job submission is not implemented" in out
    assert gym.gym_main(["eval", "--help"]) == 0
    assert "aggregate" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["eval", "submit", "--config", "x.yaml"]])
def test_unsupported_subcommand_exits_2_naming_it_and_why(argv, routed, capsys):
    assert gym.gym_main(argv) == 2
    err = capsys.readouterr().err
    assert f"`gym {' '.join(argv[:2])}` is not supported: " in err
    assert routed == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["env", "start", "--config", "a.yaml", "--config", "b.yaml", "-m", "m1", "--model-url", "u", "+x=1"],
            ("run", ["+config_paths=[a.yaml,b.yaml]", "+policy_model_name=m1", "+policy_base_url=u", "+x=1"]),
        ),
        (
            [
                "eval",
                "run",
                "--no-serve",
                "--no-health-check",
                "--health-check-workers",
                "2",
                "--health-check-ignore",
                "a,b",
            ],
            (
                "collect_rollouts",
                ["+disable_health_check=true", "+health_check_workers=2", "+health_check_ignored_checks='a,b'"],
            ),
        ),
        (
            ["eval", "run", "--no-serve", "-i", "in.jsonl", "-o", "out.jsonl", "-a", "ag", "--temperature", "0.5"],
            (
                "collect_rollouts",
                [
                    "+agent_name=ag",
                    "+input_jsonl_fpath=in.jsonl",
                    "+output_jsonl_fpath=out.jsonl",
                    "+responses_create_params.temperature=0.5",
                ],
            ),
        ),
        (
            [
                "eval",
                "run",
                "--no-serve",
                "-i",
                "r.jsonl",
                "-o",
                "o.jsonl",
                "--prompt-config",
                "p.yaml",
                "--interleave-repeats",
            ],
            (
                "collect_rollouts",
                [
                    "+input_jsonl_fpath=r.jsonl",
                    "+output_jsonl_fpath=o.jsonl",
                    "+prompt_config=p.yaml",
                    "+interleave_repeats=true",
                ],
            ),
        ),
        (
            ["eval", "run", "--config", "c.yaml", "--split", "benchmark", "-o", "o.jsonl", "--num-repeats", "4"],
            (
                "e2e_collect_rollouts",
                ["+config_paths=[c.yaml]", "+output_jsonl_fpath=o.jsonl", "+num_repeats=4", "+split=benchmark"],
            ),
        ),
        (
            ["eval", "aggregate", "-i", "r/*.jsonl", "-o", "m.jsonl"],
            ("aggregate_rollouts", ["+input_glob=r/*.jsonl", "+output_jsonl_fpath=m.jsonl"]),
        ),
        (
            ["eval", "profile", "--inputs", "i.jsonl", "--rollouts", "r.jsonl"],
            ("reward_profile", ["+materialized_inputs_jsonl_fpath=i.jsonl", "+rollouts_jsonl_fpath=r.jsonl"]),
        ),
        (
            ["dataset", "render", "-i", "raw.jsonl", "--prompt-config", "p.yaml", "-o", "out.jsonl"],
            (
                "materialize_prompts",
                ["+input_jsonl_fpath=raw.jsonl", "+prompt_config=p.yaml", "+output_jsonl_fpath=out.jsonl"],
            ),
        ),
        (
            ["dataset", "collate", "--config", "c.yaml", "--mode", "example_validation", "--output-dir", "d"],
            ("prepare_data", ["+config_paths=[c.yaml]", "+mode=example_validation", "+output_dirpath=d"]),
        ),
        (
            ["dataset", "upload", "--storage", "gitlab", "-i", "f.jsonl", "--name", "n", "--revision", "0.1"],
            ("upload_dataset_to_gitlab", ["+input_jsonl_fpath=f.jsonl", "+dataset_name=n", "+version=0.1"]),
        ),
        (
            ["dataset", "download", "--repo-id", "org/ds", "--artifact", "a.jsonl", "-o", "o.jsonl"],
            ("download_dataset_from_hf", ["+repo_id=org/ds", "+artifact_fpath=a.jsonl", "+output_fpath=o.jsonl"]),
        ),
        (
            ["dataset", "rm", "--name", "n", "+yes=true"],
            ("delete_dataset_from_gitlab", ["+dataset_name=n", "+yes=true"]),
        ),
        (["env", "test", "--resources-server", "x"], ("test", ["+entrypoint=resources_servers/x"])),
        (["env", "test", "--all"], ("test_all", [])),
        (["env", "init", "--resources-server", "x"], ("init_resources_server", ["+entrypoint=resources_servers/x"])),
        (
            ["env", "packages", "--resources-server", "x", "--json"],
            ("pip_list", ["+entrypoint=resources_servers/x", "+format=json"]),
        ),
        (["env", "resolve", "--config", "a.yaml"], ("dump_config", ["+config_paths=[a.yaml]"])),
        (["env", "status", "--json"], ("status", ["+json=true"])),
        (["env", "schema", "--resources-server", "x"], ("row_schema", ["+entrypoint=resources_servers/x"])),
        (
            ["env", "validate", "--config", "a.yaml", "--strict"],
            ("validate", ["+strict=true", "+config_paths=[a.yaml]"]),
        ),
        (["env", "validate", "aime24"], ("validate", ["+onboarding_name=aime24"])),
        (["list", "benchmarks", "--json"], ("list_benchmarks", ["+json=true"])),
        (["--json", "list", "benchmarks"], ("list_benchmarks", ["+json=true"])),
        (
            ["list", "environments", "x", "--kind", "benchmark", "--licensing", "MIT", "--status", "no-manifest"],
            ("list_environments", ["+name=x", "+catalog_kind=benchmark", "+licensing='MIT'", "+status=no-manifest"]),
        ),
        (["search", "math", "--json"], ("list_environments", ["+query=math", "+json=true"])),
        (["search", "--json", "math"], ("list_environments", ["+query=math", "+json=true"])),
        (["search", "benchmarks", "aime"], ("list_environments", ["+catalog_kind=benchmark", "+query=aime"])),
        (
            ["list", "agents", "simple_agent", "--json"],
            ("environments", ["+kind=agents", "+name=simple_agent", "+json=true"]),
        ),
        (["search", "models", "vllm"], ("environments", ["+kind=models", "+query=vllm"])),
        (
            ["eval", "reverify", "--inputs", "i.jsonl", "--rollouts", "r.jsonl", "-o", "o.jsonl", "--concurrency", "4"],
            (
                "reverify",
                [
                    "+rollouts_jsonl_fpath=r.jsonl",
                    "+output_jsonl_fpath=o.jsonl",
                    "+num_samples_in_parallel=4",
                    "+materialized_inputs_jsonl_fpath=i.jsonl",
                ],
            ),
        ),
        (["eval", "prepare", "--config", "b.yaml"], ("prepare_benchmark", ["+config_paths=[b.yaml]"])),
        (["dev", "test"], ("dev_test", [])),
    ],
)
def test_subcommand_runs_our_command_with_translated_flags(argv, expected, routed):
    assert gym.gym_main(argv) == 0
    name, args = expected
    config = [a for a in args if a.startswith("+config_paths")]
    assert routed == [(name, config + [a for a in args if a not in config])]


def test_selectors_resolve_a_named_component_under_the_search_roots(tmp_path, monkeypatch, routed, capsys):
    (tmp_path / "resources_servers/foo/configs").mkdir(parents=True)
    (tmp_path / "resources_servers/foo/configs/foo.yaml").write_text("{}\n")
    (tmp_path / "benchmarks/b1").mkdir(parents=True)
    (tmp_path / "benchmarks/b1/config.yaml").write_text("{}\n")
    monkeypatch.chdir(tmp_path / "benchmarks")  # found through --search-dir, not the working directory
    argv = ["env", "start", "--search-dir", str(tmp_path), "--resources-server", "foo", "--benchmark", "b1", "+a=1"]
    assert gym.gym_main(argv) == 0
    foo, b1 = tmp_path / "resources_servers/foo/configs/foo.yaml", tmp_path / "benchmarks/b1/config.yaml"
    assert routed == [("run", [f"+config_paths=[{b1},{foo}]", "+a=1"])]
    assert gym.gym_main(["eval", "prepare", "--search-dir", str(tmp_path), "--benchmark", "b1x"]) == 2
    assert "--benchmark b1x names benchmarks/b1x/config.yaml, which is in none of" in (err := capsys.readouterr().err)
    assert "(did you mean 'b1'?)" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["eval", "aggregate", "--no-health-check"],
            "--no-health-check is not supported: ng_aggregate_rollouts runs no",
        ),
        (["eval", "aggregate", "--config", "c.yaml"], "--config is not supported: the metrics come from"),
        (["env", "start", "--resources-server", "nope"], "--resources-server nope names"),
        (["env", "test"], "requires a target"),
        (["env", "start", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--json", "env", "start"], "--json applies to --version"),
    ],
)
def test_usage_errors_exit_2_with_the_reason(argv, message, routed, capsys):
    assert gym.gym_main(argv) == 2
    assert message in capsys.readouterr().err
    assert routed == []


def test_no_subcommand_prints_help_and_exits_1(capsys):
    assert gym.gym_main(["eval"]) == 1
    assert "usage: gym eval" in capsys.readouterr().out


def test_version_runs_ng_version(capsys):
    assert gym.gym_main(["--version", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nemo_gym"]


def test_ng_takes_gym_subcommands_and_still_our_command_names(routed, capsys):
    assert gym.ng_main(["env", "status"]) == 0
    assert routed == [("status", [])]
    assert gym.ng_main(["eval", "submit"]) == 2
    assert "`ng eval submit` is not supported" in capsys.readouterr().err
    assert gym.ng_main(["version"]) == 0  # our `ng <command>`, as before
    assert capsys.readouterr().out.startswith("nemo_gym ")
    assert gym.ng_main(["ng_prepare_benchmark"]) == 2
    assert "no dataset of the config has a prepare_script" in capsys.readouterr().err
    assert gym.ng_main([]) == 0
    out = capsys.readouterr().out
    assert "ng_validate" in out and "see gym --help" in out


def test_every_legacy_command_is_a_console_script_under_both_names():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gym"] == "nemo_gym.cli:gym" and scripts["ng"] == "nemo_gym.cli:ng"
    import nemo_gym.cli as cli

    for name in LEGACY:
        assert scripts[f"ng_{name}"] == scripts[f"nemo_gym_{name}"] == f"nemo_gym.cli:ng_{name}"
        assert callable(getattr(cli, f"ng_{name}"))
    assert set(legacy.LEGACY_COMMANDS) == set(LEGACY)


@pytest.mark.parametrize("name", LEGACY)
def test_every_legacy_command_prints_its_parameters(name, capsys):
    assert legacy.run(name, ["+help=true"]) == 0
    assert capsys.readouterr().out.startswith(f"ng_{name}: ")


# -- ng_materialize_prompts ------------------------------------------------------------------------------
def test_materialize_prompts_fills_input_and_keeps_other_create_params(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rows = [{"q": "2+2?", "responses_create_params": {"temperature": 0.5}}, {"q": "{x}"}]
    Path("raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path("p.yaml").write_text('system: "Be brief {{ok}}."\nuser: "Q: {q}"\n')
    argv = ["+input_jsonl_fpath=raw.jsonl", "+prompt_config=p.yaml", "+output_jsonl_fpath=out/m.jsonl"]
    assert legacy.run("materialize_prompts", argv) == 0
    assert capsys.readouterr().out == "Materialized 2 rows to out/m.jsonl\n"
    system = {"role": "system", "content": "Be brief {ok}."}  # `{{` is a literal brace; a row's `{x}` is kept as is
    expected = [
        {
            "q": "2+2?",
            "responses_create_params": {"temperature": 0.5, "input": [system, {"role": "user", "content": "Q: 2+2?"}]},
        },
        {"q": "{x}", "responses_create_params": {"input": [system, {"role": "user", "content": "Q: {x}"}]}},
    ]
    for row in expected:
        row["prompt_config_used"] = str(tmp_path / "p.yaml")
    assert Path("out/m.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in expected)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"q": "a", "responses_create_params": {"input": "hi"}}, "already have responses_create_params.input"),
        ({"other": 1}, "references field 'q'"),
    ],
)
def test_materialize_prompts_refuses_a_given_input_or_a_missing_field(row, message, tmp_path, capsys):
    (tmp_path / "raw.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "p.yaml").write_text("user: '{q}'\n")
    argv = [
        f"+input_jsonl_fpath={tmp_path}/raw.jsonl",
        f"+prompt_config={tmp_path}/p.yaml",
        f"+output_jsonl_fpath={tmp_path}/o.jsonl",
    ]
    assert legacy.run("materialize_prompts", argv) == 2
    assert message in capsys.readouterr().err


# -- ng_aggregate_rollouts -------------------------------------------------------------------------------
def _rollout(task: int, rollout: int, reward: float, agent: str = "a") -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward, "agent_ref": {"name": agent}}


def test_aggregate_rollouts_merges_shards_in_order_and_writes_local_metrics(tmp_path, monkeypatch, capsys):
    def no_run(url):
        raise ConfigError("no running ng_run found")

    monkeypatch.setattr(aggregate_rollouts, "discover_head_url", no_run)
    shard1 = [_rollout(1, 0, 1.0), _rollout(0, 1, 0.0)]
    shard2 = [_rollout(0, 0, 0.5), _rollout(2, 0, 1.0, agent="b")]
    (tmp_path / "r-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shard1))
    (tmp_path / "r-2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shard2))
    (tmp_path / "r-2_failures.jsonl").write_text(json.dumps({"failure_class": "timeout"}) + "\n")  # a side file
    argv = [f"+input_glob={tmp_path}/r-*.jsonl", f"+output_jsonl_fpath={tmp_path}/all.jsonl"]
    assert legacy.run("aggregate_rollouts", argv) == 0
    merged = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in merged] == [(0, 0), (0, 1), (1, 0), (2, 0)]
    metrics = json.loads((tmp_path / "all_aggregate_metrics.json").read_text())
    # agent a: rewards 0.5, 0.0, 1.0 -> mean 1.5 / 3 = 0.5; agent b: 1.0
    assert metrics["agents"] == [
        {
            "agent_ref": {"name": "a"},
            "agent_metrics": {"num_rollouts": 3, "mean_reward": 0.5, "min_reward": 0.0, "max_reward": 1.0},
            "source": "local",
        },
        {
            "agent_ref": {"name": "b"},
            "agent_metrics": {"num_rollouts": 1, "mean_reward": 1.0, "min_reward": 1.0, "max_reward": 1.0},
            "source": "local",
        },
    ]
    assert metrics["collection"]["rollouts_done"] == 4
    assert metrics["collection"]["failures_by_class"] == {"timeout": 1}
    assert "Aggregating 2 shard(s)" in capsys.readouterr().out


def test_aggregate_rollouts_glob_order_dedup_and_no_match(tmp_path, capsys):
    for name in ("b.jsonl", "a.jsonl", "a_materialized_inputs.jsonl"):
        (tmp_path / name).write_text("")
    found = aggregate_rollouts.expand_input_glob(f"{tmp_path}/b.jsonl, {tmp_path}/*.jsonl")
    assert found == [tmp_path / "b.jsonl", tmp_path / "a.jsonl"]
    argv = [f"+input_glob={tmp_path}/none-*.jsonl", f"+output_jsonl_fpath={tmp_path}/o.jsonl"]
    assert legacy.run("aggregate_rollouts", argv) == 2
    assert "no shards matched input_glob" in capsys.readouterr().err


# -- ng_prepare_benchmark (tests/test_benchmark_scaffold.py; ng_list_benchmarks: tests/test_catalog.py) -----------
def test_prepare_benchmark_of_a_benchmark_that_is_not_there_names_the_file(capsys):
    assert legacy.run("prepare_benchmark", ["+config_paths=[benchmarks/aime24/config.yaml]"]) == 2
    assert "benchmarks/aime24/config.yaml" in capsys.readouterr().err


# -- ng_validate -----------------------------------------------------------------------------------------
AGENT_ONLY = """\
my_agent:
  responses_api_agents:
    simple_agent:
      url: http://127.0.0.1:9
      model_server: {type: responses_api_models, name: policy_model}
"""


def test_validate_passes_a_config_that_only_lacks_the_model_unless_strict(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(AGENT_ONLY)
    argv = [f"+config_paths=[{tmp_path}/c.yaml]"]
    assert legacy.run("validate", argv) == 0
    captured = capsys.readouterr()
    assert captured.out == "✓ Config is valid.\n"
    assert "does not define model server configuration" in captured.err
    assert legacy.run("validate", [*argv, "+strict=true"]) == 2
    assert "refers to server instance 'policy_model'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["+config_paths=[/nonexistent/c.yaml]"], "does not exist"),
        (["+onboarding_name=aime24"], "+onboarding_name: unknown environment 'aime24'"),
        (["+sync=true"], "+sync apply to a catalog name or +manifest_path only"),
        (["+head_server.portt=1"], "portt"),
    ],
)
def test_validate_reports_what_is_wrong(argv, message, capsys):
    assert legacy.run("validate", argv) == 2
    assert message in capsys.readouterr().err


def test_validate_an_empty_config_is_valid(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert legacy.run("validate", []) == 0
    assert capsys.readouterr().out == "✓ Config is valid.\n"


# -- ng_reinstall ----------------------------------------------------------------------------------------
def test_reinstall_runs_uv_sync_with_the_dev_extra(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(
        legacy.subprocess, "run", lambda argv, check: ran.append(argv) or type("D", (), {"returncode": 0})
    )
    monkeypatch.chdir(tmp_path)
    assert legacy.run("reinstall", []) == 2
    assert "no pyproject.toml" in capsys.readouterr().err
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\n")
    assert legacy.run("reinstall", []) == 0
    assert [Path(ran[0][0]).name, *ran[0][1:]] == ["uv", "sync", "--extra", "dev"]


# -- ng_e2e_collect_rollouts -----------------------------------------------------------------------------
def test_e2e_splits_its_arguments_and_refuses_an_input_file():
    own, collect, config = e2e.split_arguments(
        [
            "+config_paths=[c.yaml]",
            "+split=benchmark",
            "+output_jsonl_fpath=o.jsonl",
            "+responses_create_params.temperature=0",
            "+x=1",
        ]
    )
    assert own == {"split": "benchmark"}
    assert collect == ["+output_jsonl_fpath=o.jsonl", "+responses_create_params.temperature=0"]
    assert config == ["+config_paths=[c.yaml]", "+x=1"]
    with pytest.raises(ConfigError, match="input_jsonl_fpath is not supported when serving end-to-end"):
        e2e.split_arguments(["+split=train", "+input_jsonl_fpath=i.jsonl"])
    with pytest.raises(ConfigError, match="example datasets are validated"):
        e2e.split_arguments(["+split=example"])
    with pytest.raises(ConfigError, match=r"\+split is required \(gym eval run --split\)"):
        e2e.split_arguments([])
    with pytest.raises(ConfigError, match=r"\+split must be one of train, validation, benchmark, got 'test'"):
        e2e.split_arguments(["+split=test"])


def test_e2e_prepares_the_split_starts_the_servers_collects_and_stops_them(tmp_path, monkeypatch):
    events = []

    def prepare(loaded):
        out = Path(loaded.values["output_dirpath"])
        events.append(("prepare", loaded.values["mode"], loaded.values["should_download"]))
        out.mkdir(parents=True)
        (out / "benchmark.jsonl").write_text("{}\n")
        return 0

    class Servers:
        head_url = "http://127.0.0.1:1"

        def __init__(self, argv, head_server_url, log_path, **kwargs):
            events.append(("start", argv, log_path.name))

        def stop(self):
            events.append(("stop",))

    monkeypatch.setattr(e2e, "prepare_main", prepare)
    monkeypatch.setattr(e2e, "NgRunProcess", Servers)
    monkeypatch.setattr(
        e2e,
        "collect_main",
        lambda cfg: events.append(("collect", cfg.input_jsonl_fpath, cfg.head_server_url, cfg.num_repeats)) or 0,
    )
    out = tmp_path / "res/rollouts.jsonl"
    argv = ["+split=benchmark", f"+output_jsonl_fpath={out}", "+num_repeats=2", "+x=1"]
    assert legacy.run("e2e_collect_rollouts", argv) == 0
    prepared = tmp_path / "res/rollouts/preprocessed_datasets/benchmark.jsonl"
    assert events == [
        ("prepare", "train_preparation", True),
        ("start", ["+x=1"], "rollouts.ng_run.log"),
        ("collect", str(prepared), "http://127.0.0.1:1", 2),
        ("stop",),
    ]


@pytest.mark.integration
@pytest.mark.long
def test_gym_eval_run_prepares_serves_collects_and_stops_for_real(tmp_path):
    """`gym eval run` end to end: string_match's train split prepared, ng_run started (the scripted policy), 2 tasks x
    2 rollouts collected, ng_run stopped (about 10 s with the environments built)."""
    out = tmp_path / "rollouts.jsonl"
    argv = ["eval", "run", "--config", "resources_servers/string_match/configs/string_match.yaml", "--config"]
    argv += ["responses_api_models/scripted_model/configs/scripted_model.yaml", "--split", "train", "--limit", "2"]
    argv += ["--num-repeats", "2", "-o", str(out), "+progress=false"]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "gym"), *argv], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len((tmp_path / "rollouts/preprocessed_datasets/train.jsonl").read_text().splitlines()) == 60
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(isinstance(r["reward"], float) for r in rows)
    assert "ng_run: stopping servers" in (tmp_path / "rollouts.ng_run.log").read_text()


def test_eval_compare_compares_the_candidates_rollouts_with_the_baselines(tmp_path, capsys):
    """`gym eval compare --baseline B --candidates C -o DIR` runs ng_eval's comparison of the two rollouts files:
    task 0 went from [0, 1] to [1, 1], task 1 from [0, 0] to [1, 0]; the report is DIR/compare_report.json."""

    def rows(rewards: dict[int, list[float]]) -> str:
        return "".join(
            json.dumps({"responses_create_params": {"input": f"q{task}"}, "_ng_task_index": task, "reward": reward})
            + "\n"
            for task, values in rewards.items()
            for reward in values
        )

    (base := tmp_path / "base.jsonl").write_text(rows({0: [0.0, 1.0], 1: [0.0, 0.0]}))
    (cand := tmp_path / "cand.jsonl").write_text(rows({0: [1.0, 1.0], 1: [1.0, 0.0]}))
    out = tmp_path / "report"
    assert gym.gym_main(["eval", "compare", "--baseline", str(base), "--candidates", str(cand), "-o", str(out)]) == 0
    report = json.loads((out / "compare_report.json").read_text())
    paired = report["comparison"]["paired"]
    assert paired["num_tasks"] == 2 and paired["mean_reward_difference"]["mean"] == 0.5
    assert [(t["task"], t["difference"]) for t in paired["tasks"]] == [(0, 0.5), (1, 0.5)]
    assert "compare_report.json" in capsys.readouterr().out

    for argv, why in (
        (["--candidates", f"{cand},{base}"], "--candidates names 2 runs; give a single candidate run"),
        (["--candidates", str(cand), "--agent", "a"], "--agent is not supported: the rollouts of every agent"),
        (["--candidates", str(cand), "--report-format", "md"], "--report-format is not supported"),
    ):
        assert gym.gym_main(["eval", "compare", "--baseline", str(base), *argv]) == 2
        assert why in capsys.readouterr().err


def test_verbose_sets_debug_logging_for_the_command_and_its_servers(monkeypatch):
    """`gym -v ...` / `gym ... -v` (0.7.0's DEBUG logging): `$NEMO_GYM_LOG_LEVEL=debug` while the command runs, which
    the servers ng_run starts inherit; restored after."""
    monkeypatch.delenv("NEMO_GYM_LOG_LEVEL", raising=False)
    seen: list[str | None] = []
    monkeypatch.setattr(gym, "run_named", lambda name, argv: seen.append(os.environ.get("NEMO_GYM_LOG_LEVEL")) or 0)
    for argv in (["-v", "env", "status"], ["env", "start", "--config", "a.yaml", "-v"], ["env", "status"]):
        assert gym.gym_main(argv) == 0
    assert seen == ["debug", "debug", None] and "NEMO_GYM_LOG_LEVEL" not in os.environ
