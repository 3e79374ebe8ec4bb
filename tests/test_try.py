"""ng_try: entry choice, model arguments, and real runs through servers on loopback (the scripted policy; one e2e
run with SmolLM2 on vLLM-CPU): printed conversations, per-reward scores, failures as failures, the JSON output,
Ctrl-C and attaching to a running ng_run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import yaml
from live_servers import serve
from ng_process import REPO, NgRun, wait_for_output

from nemo_gym.common.errors import ConfigError
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.tryout.options import split_arguments
from nemo_gym.tryout.rollouts import choose_entries, sampling_seed
from nemo_gym.tryout.sources import OPENAI_MODEL_YAML, VLLM_MODEL_YAML, model_arguments

NG_TRY = str(Path(sys.executable).parent / "ng_try")
SAMPLE = REPO / "examples" / "rnow_project"
MCQA_YAML = "resources_servers/mcqa/configs/mcqa.yaml"  # relative: NgRun starts in the repository
MCQA_DATA = REPO / "resources_servers" / "mcqa" / "data" / "example.jsonl"
SCRIPTED_APP = REPO / "responses_api_models" / "scripted_model" / "app.py"
WIDE = {**os.environ, "COLUMNS": "220"}  # rich lays panels out to the terminal width; a file has none


# -- units -----------------------------------------------------------------------------------------------------
def test_entries_are_chosen_as_asked_and_reproducibly():
    assert choose_entries(10, [0, 3, 7], False, seed=1) == [0, 3, 7]
    assert choose_entries(4, None, True, seed=1) == [0, 1, 2, 3]
    drawn = [choose_entries(10, None, False, seed=s) for s in range(20)]
    assert drawn == [choose_entries(10, None, False, seed=s) for s in range(20)]  # the seed fixes the choice
    assert len({tuple(d) for d in drawn}) > 1 and all(len(d) == 1 and 0 <= d[0] < 10 for d in drawn)
    for entries, all_entries, message in [
        ([10], False, "index 10 is out of range: the data has 10 entries (0 to 9)"),
        ([-1], False, "index -1 is out of range"),
        ([1, 1], False, "lists [1] more than once"),
        ([1], True, "exclude each other"),
        ([], False, "+entries is empty"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            choose_entries(10, entries, all_entries, seed=0)
    assert len({sampling_seed(5, e, r) for e in range(50) for r in range(8)}) == 400 and sampling_seed(
        5, 1, 2
    ) == sampling_seed(5, 1, 2)


def test_options_are_split_from_config_overrides_and_typos_are_caught():
    options, rest = split_arguments(
        [
            "+rnow_project=p",
            "+num_rollouts=2",
            "+entries=[0,3]",
            "+all=false",
            "+rollout.max_turns=2",
            "+policy_base_url=x",
        ]
    )
    assert (options.rnow_project, options.num_rollouts, options.entries, options.all_entries) == ("p", 2, [0, 3], False)
    assert rest == ["+rollout.max_turns=2", "+policy_base_url=x"]
    with pytest.raises(ConfigError, match=re.escape("unknown parameter +num_rollout (did you mean +num_rollouts?)")):
        split_arguments(["+num_rollout=2"])
    with pytest.raises(ConfigError, match=re.escape("+num_rollouts: Input should be greater than or equal to 1")):
        split_arguments(["+num_rollouts=0"])


def test_model_arguments_for_each_kind_of_model(tmp_path):
    values = {
        "mcqa_simple_agent": {
            "responses_api_agents": {
                "simple_agent": {"model_server": {"type": "responses_api_models", "name": "policy_model"}}
            }
        },
        "judge": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py"}}},
    }
    args = dict(model_name=None, values=values, origin="a.yaml", rnow=False)
    assert model_arguments("embedded:smollm2", **args) == (
        [VLLM_MODEL_YAML],
        ["++policy_model.responses_api_models.vllm_model.model=embedded:smollm2"],
    )
    assert model_arguments(str(tmp_path), **{**args, "rnow": True}) == ([], [f"+model.path={tmp_path}"])
    assert model_arguments("judge", **args) == (
        [],
        ["++mcqa_simple_agent.responses_api_agents.simple_agent.model_server.name=judge"],
    )
    paths, overrides = model_arguments("http://127.0.0.1:9/v1", **{**args, "model_name": "m"})
    assert paths == [OPENAI_MODEL_YAML] and overrides[:2] == [
        "+policy_base_url=http://127.0.0.1:9/v1",
        "+policy_model_name='m'",
    ]
    assert (
        overrides[2] == "+policy_api_key='${oc.env:OPENAI_API_KEY,EMPTY}'"
    )  # the key itself never goes on a command line
    with pytest.raises(ConfigError, match="GET http://127.0.0.1:9/v1/models failed .* pass \\+model_name="):
        model_arguments("http://127.0.0.1:9/v1", **args)  # nothing listens on port 9
    with_policy = {**values, "policy_model": {"responses_api_models": {"vllm_model": {}}}}
    with pytest.raises(ConfigError, match=re.escape("the config already defines policy_model (a.yaml)")):
        model_arguments("embedded:smollm2", **{**args, "values": with_policy})
    with pytest.raises(ConfigError, match="with \\+rnow_project, name your model instance policy_model"):
        model_arguments("judge", **{**args, "rnow": True})
    with pytest.raises(ConfigError, match="'gpt-9' is not a model server instance of the config \\(judge\\), an http"):
        model_arguments("gpt-9", **args)


def test_a_config_source_becomes_ng_runs_arguments(tmp_path, monkeypatch, capsys):
    from nemo_gym.cli import main
    from nemo_gym.config import load_config
    from nemo_gym.config.server_instances import server_instances
    from nemo_gym.tryout.sources import config_source

    monkeypatch.chdir(REPO)
    options, rest = split_arguments(
        [
            f"+config_paths=[{MCQA_YAML}]",
            f"+input_jsonl_fpath={MCQA_DATA}",
            "+model=embedded:smollm2",
            "+mcqa.resources_servers.mcqa.grading_mode=null",
        ]
    )
    source = config_source(options, rest)
    assert source.run_argv == [
        f"+config_paths=[{MCQA_YAML},{VLLM_MODEL_YAML}]",
        "+mcqa.resources_servers.mcqa.grading_mode=null",
        "++policy_model.responses_api_models.vllm_model.model=embedded:smollm2",
    ]
    instances = {i.name: i for i in server_instances(load_config(source.run_argv))}  # what ng_run will start
    assert (
        instances["policy_model"].implementation == "vllm_model"
        and instances["policy_model"].fields["model"] == "embedded:smollm2"
    )
    assert source.tasks_path == MCQA_DATA and source.description["input_jsonl_fpath"] == str(MCQA_DATA)
    two_models = [
        f"+config_paths=[{MCQA_YAML},responses_api_models/scripted_model/configs/scripted_model.yaml]",
        f"+input_jsonl_fpath={MCQA_DATA}",
        "+other.responses_api_models.scripted_model.entrypoint=app.py",
        "+model=other",
    ]
    instances = {i.name: i for i in server_instances(load_config(config_source(*split_arguments(two_models)).run_argv))}
    assert instances["mcqa_simple_agent"].fields["model_server"] == {
        "type": "responses_api_models",
        "name": "other",
    }  # +model=<instance>
    with pytest.raises(ConfigError, match="the config defines no model server: pass \\+model="):
        config_source(*split_arguments([f"+config_paths=[{MCQA_YAML}]", f"+input_jsonl_fpath={MCQA_DATA}"]))
    assert (
        main("try", [f"+input_jsonl_fpath={MCQA_DATA}"]) == 2
        and "needs the servers: +config_paths=" in capsys.readouterr().err
    )
    assert (
        main("try", ["+rnow_project=x", f"+input_jsonl_fpath={MCQA_DATA}"]) == 2
        and "not both" in capsys.readouterr().err
    )
    assert main("try", ["--help"]) == 0 and "+num_rollouts: int = 1" in capsys.readouterr().out


# -- real runs -------------------------------------------------------------------------------------------------
def failing_project(root: Path) -> Path:
    """The sample project under another name, with two more entries: 10 is scored by a reward that raises,
    11 asks a question the test's endpoint holds without answering."""
    shutil.copytree(SAMPLE, root)
    config = yaml.safe_load((root / "config.yml").read_text())
    config["project_name"] = "ng-try-test"
    (root / "config.yml").write_text(yaml.safe_dump(config))
    with (root / "rewards.py").open("a") as rewards:
        rewards.write(
            '\n\n@reward\ndef crashes(args: RewardArgs, messages: list) -> float:\n    """A broken reward."""\n   '
            ' raise RuntimeError("crashed on purpose")\n'
        )
    broken = {
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
        "rewards": ["answered", "crashes"],
        "metadata": {"answer": "42"},
        "tools": ["add"],
    }
    held = {
        "messages": [{"role": "user", "content": "Hold this question."}],
        "rewards": ["answered"],
        "metadata": {"answer": "x"},
        "tools": [],
    }
    with (root / "train.jsonl").open("a") as entries:
        entries.write(json.dumps(broken) + "\n" + json.dumps(held) + "\n")
    return root


@pytest.mark.long
@pytest.mark.integration
def test_rnow_project_with_an_endpoint_model_a_failing_reward_and_ctrl_c(tmp_path):
    """ng_try starts the servers of an rnow project with +model=<an OpenAI-compatible URL> (the scripted policy on
    loopback): entry 0's rollouts are printed with every reward's score and the total, entry 10's (a reward raises)
    as failures with their class and message, never as reward 0; entry 11 hangs until Ctrl-C, after which ng_try
    saves what finished, exits 130 and stops the ng_run it started."""
    project = failing_project(tmp_path / "project")
    scripted = yaml.safe_load((REPO / "tests" / "configs" / "rnow_scripted_policy.yaml").read_text())["policy_model"][
        "responses_api_models"
    ]["scripted_model"]
    endpoint = load_server_class(SCRIPTED_APP)({**scripted, "model_name": "endpoint-model"}, name="endpoint")
    app, release = endpoint.build_app(), threading.Event()

    @app.middleware("http")
    async def hold_one_question(request, call_next):
        if b"Hold this question." in await request.body():
            while not release.is_set():
                await asyncio.sleep(0.05)
        return await call_next(request)

    out, log = tmp_path / "try.json", tmp_path / "stdout.txt"
    with serve(app) as url, log.open("w") as stdout:
        # started with SIGINT ignored, as a script's or CI harness's background job (`cmd &` without job control) is:
        # the SIGINT sent to ng_try must stop it all the same
        process = subprocess.Popen(
            [
                "bash",
                "-c",
                'trap "" INT; exec "$0" "$@"',
                NG_TRY,
                f"+rnow_project={project}",
                f"+model={url}/v1",
                "+entries=[0,10,11]",
                "+num_rollouts=2",
                f"+output={out}",
                "+stop_grace_s=2",
            ],  # ng_run's: its openai_model has entry 11's calls in flight
            cwd=tmp_path,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env=WIDE,
            start_new_session=True,
        )
        try:
            text = wait_for_output(
                log, r"(?s)(rollout [12]/2.*){4}", process, "ng_try"
            )  # 2 finished + 2 failed; entry 11's are held
            ng_run_pid = int(re.search(r"started ng_run \(pid (\d+)", text).group(1))
            process.send_signal(signal.SIGINT)
            try:
                assert process.wait(120) == 130
            except subprocess.TimeoutExpired:  # keep what ng_try printed
                raise AssertionError(
                    f"ng_try still running 120 s after SIGINT; its output:\n{log.read_text()[-4000:]}"
                ) from None
        finally:
            release.set()
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert not psutil.pid_exists(ng_run_pid), "the ng_run started by ng_try outlived it"
    record = json.loads(out.read_text())
    assert (
        record["interrupted"] is True
        and record["model"] == f"{url}/v1"
        and record["source"] == {"rnow_project": str(project)}
    )
    assert record["entries"] == [
        {"index": 0, "where": "train.jsonl:1"},
        {"index": 10, "where": "train.jsonl:11"},
        {"index": 11, "where": "train.jsonl:12"},
    ]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in record["rollouts"]] == [
        (0, 0, 3.0),
        (0, 1, 3.0),
    ]
    assert all(
        r["reward_components"] == {"answered": 1.0, "accuracy": 1.0, "used_tool": 1.0} for r in record["rollouts"]
    )
    assert (
        record["rollouts"][0]["response"]["model"] == "endpoint-model"
    )  # the one model the endpoint's /v1/models lists
    assert [(f["_ng_task_index"], f["failure_class"]) for f in record["failures"]] == [
        (10, "reward_error"),
        (10, "reward_error"),
    ]
    assert all("crashed on purpose" in f["message"] for f in record["failures"])
    assert record["summary"] == {
        "rollouts_ok": 2,
        "rollouts_failed": 2,
        "mean_reward": 3.0,
        "failures_by_class": {"reward_error": 2},
    }
    assert text.count("FAILED  reward_error") == 2 and text.count("total reward") == 2  # a failure shows no reward
    assert 'add({"a": 17, "b": 25})' in text and "Answer: 42" in text and "answered 1  accuracy 1  used_tool 1" in text
    assert "entry 10 (train.jsonl:11) · rollout 2/2" in text and "model endpoint-model" in text
    assert "ng_try: interrupted; 4 rollout(s) had finished" in text and f"saved to {out}" in text


@pytest.mark.long
@pytest.mark.integration
def test_attach_to_a_running_ng_run_with_a_task_file(tmp_path):
    """+head_server_url: the servers of a running ng_run (mcqa, scripted policy), every row of a task JSONL, the
    config's only agent by default; a real reward of 0 is a reward, not a failure."""
    out = tmp_path / "try.json"
    with NgRun(f"+config_paths=[{MCQA_YAML},responses_api_models/scripted_model/configs/scripted_model.yaml]") as run:
        head = run.wait_ready()
        done = subprocess.run(
            [NG_TRY, f"+head_server_url={head}", f"+input_jsonl_fpath={MCQA_DATA}", "+all=true", f"+output={out}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=WIDE,
            timeout=120,
        )
        refused = subprocess.run(
            [NG_TRY, f"+head_server_url={head}", f"+input_jsonl_fpath={MCQA_DATA}", "+model=embedded:smollm2"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    expected = [json.loads(line)["expected_answer"] for line in MCQA_DATA.read_text().splitlines()]
    assert [(r["_ng_task_index"], r["reward"]) for r in record["rollouts"]] == [
        (i, 1.0 if answer == "B" else 0.0) for i, answer in enumerate(expected)
    ]
    assert (
        record["failures"] == []
        and record["entries"][4] == {"index": 4, "where": f"{MCQA_DATA}:5"}
        and record["head_server_url"] == head
    )
    assert (
        all(r["agent_ref"] == {"name": "mcqa_simple_agent"} for r in record["rollouts"])
        and "seed" not in record["rollouts"][0]["responses_create_params"]
    )
    assert (
        done.stdout.count("total reward") == 5
        and "FAILED" not in done.stdout
        and "The answer is \\boxed{B}" in done.stdout
    )
    assert refused.returncode == 2 and "+model cannot change the servers of a running ng_run" in refused.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_smollm2_on_the_sample_rnow_project(tmp_path):
    """The real embedded SmolLM2 served by vllm_model (started by ng_try): 1 entry, 2 seeded rollouts, short answers."""
    out = tmp_path / "try.json"
    done = subprocess.run(
        [
            NG_TRY,
            f"+rnow_project={SAMPLE}",
            "+entries=[0]",
            "+num_rollouts=2",
            "+seed=3",
            "+model=embedded:smollm2",
            "+responses_create_params={max_output_tokens: 32}",
            f"+output={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=WIDE,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    record = json.loads(out.read_text())
    assert record["failures"] == [] and [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in record["rollouts"]] == [
        (0, 0),
        (0, 1),
    ]
    for row in record["rollouts"]:
        assert row["responses_create_params"]["seed"] == sampling_seed(
            3, 0, row["_ng_rollout_index"]
        )  # vllm_model: seeded sampling
        assert row["response"]["model"] == "SmolLM2-135M-Instruct" and "answered" in row["reward_components"]
        assert 0.0 <= row["reward"] <= 3.0
    assert "What is 17 + 25?" in done.stdout and done.stdout.count("total reward") == 2
