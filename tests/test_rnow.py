"""ReinforceNow projects: decorators, validation (each error with its line), reward semantics, the
rnow_project server's tools, translation into our config, and ng_run + collection on the sample project."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances
from nemo_gym.rnow import RewardArgs, reward, tool
from nemo_gym.rnow.decorators import docstring_arguments
from nemo_gym.rnow.loading import load_functions
from nemo_gym.rnow.project import AGENT_NAME, expand_rnow_args, load_project, translate
from nemo_gym.rnow.scoring import RewardError, RewardTimeoutError, score, total_reward
from nemo_gym.serving.module_loading import import_file
from nemo_gym.train.config import TrainerConfig

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "rnow_project"
APP = import_file(REPO / "resources_servers" / "rnow_project" / "app.py")
SESSION = {"X-Session-Id": "s1"}


def make_project(root: Path, entries: list[dict], config: dict | None = None, rewards: str | None = None) -> Path:
    """A copy of the sample project with other entries / config values / rewards.py."""
    shutil.copytree(SAMPLE, root)
    (root / "train.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    if config:
        values = yaml.safe_load((root / "config.yml").read_text())
        for key, value in config.items():
            section, _, name = key.partition(".")
            values.setdefault(section, {})[name] = value
        (root / "config.yml").write_text(yaml.safe_dump(values))
    if rewards is not None:
        (root / "rewards.py").write_text(textwrap.dedent(rewards))
    return root


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def answer_response(text: str) -> dict:
    return {
        "id": "r",
        "object": "response",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
    }


# -- decorators --------------------------------------------------------------------------------------------
def test_tool_schema_from_hints_and_docstring_args():
    @tool(timeout=3)
    def search(args, query: str, limit: int = 5, tags: list[str] | None = None) -> dict:
        """Search the notes.

        Args:
            query: what to look for,
                on one or more lines
            limit (int): most results
        Returns:
            the hits
        """
        return {}

    spec = search.__rnow_tool__
    assert spec.takes_args and spec.timeout_s == 3.0 and spec.schema["description"] == "Search the notes."
    params = spec.schema["parameters"]
    assert params["required"] == ["query"] and params["additionalProperties"] is False
    assert params["properties"]["query"] == {"type": "string", "description": "what to look for, on one or more lines"}
    assert (
        params["properties"]["limit"]["default"] == 5 and params["properties"]["limit"]["description"] == "most results"
    )
    assert "args" not in params["properties"] and "description" not in params["properties"]["tags"]


def test_decorator_errors():
    with pytest.raises(TypeError, match="docstring"):
        tool(lambda x: x)
    with pytest.raises(TypeError, match=r"\*args"):

        @tool
        def bad(*values: int) -> int:
            """Doc."""

    with pytest.raises(TypeError, match="type hint"):

        @tool
        def untyped(x) -> int:
            """Doc."""

    with pytest.raises(TypeError, match="exactly two parameters"):

        @reward
        def one(args) -> float:
            return 1.0

    with pytest.raises(TypeError, match="positive"):
        reward(timeout=0)


def test_docstring_arguments_stops_at_next_section():
    doc = "Do it.\n\nArgs:\n    a: first\n    b: second\n        continued\n\nReturns:\n    c: not an argument\n"
    assert docstring_arguments(doc) == {"a": "first", "b": "second continued"}


def test_rnow_imports_work_unchanged(tmp_path):
    root = make_project(
        tmp_path / "p",
        [],
        rewards="""
        from rnow.core import reward, RewardArgs
        @reward(precondition=True)
        def gate(args: RewardArgs, messages: list) -> float:
            return 1.0
        """,
    )
    functions = load_functions(root)
    assert functions.rewards["gate"].precondition and set(functions.tools) == {"add", "multiply", "capital"}


# -- reward semantics --------------------------------------------------------------------------------------
def test_total_is_the_sum_and_a_zero_precondition_zeroes_it():
    assert total_reward({"format": 1.0, "accuracy": 0.5}, {"format"}) == 1.5  # 1 + 0.5
    assert total_reward({"format": 0.0, "accuracy": 1.0}, {"format"}) == 0.0  # the gate failed
    assert total_reward({"a": 0.0, "b": 1.0}, set()) == 1.0  # no gate: a 0 is just a 0


def _specs(source: str, tmp_path: Path) -> dict:
    root = make_project(tmp_path / "p", [], rewards=source)
    return load_functions(root).rewards


def test_reward_failures_are_typed_not_zero(tmp_path):
    rewards = _specs(
        """
        import asyncio
        from nemo_gym.rnow import reward
        @reward
        def boom(args, messages) -> float:
            raise KeyError("answer")
        @reward
        def too_big(args, messages) -> float:
            return 1.5
        @reward(timeout=0.05)
        async def slow(args, messages) -> float:
            await asyncio.sleep(5)
            return 1.0
        @reward(precondition=True)
        async def gate(args, messages) -> float:
            return float(args.variables["ok"])
        @reward
        def half(args, messages) -> float:
            return 0.5
        """,
        tmp_path,
    )
    args, messages = RewardArgs(variables={"ok": 0}), user("hi")
    with pytest.raises(RewardError, match="boom.*KeyError") as raised:
        asyncio.run(score([rewards["boom"]], args, messages))
    assert raised.value.failure_class == "reward_error"
    with pytest.raises(RewardError, match=r"\[0, 1\]"):
        asyncio.run(score([rewards["too_big"]], args, messages))
    with pytest.raises(RewardTimeoutError) as timed_out:
        asyncio.run(score([rewards["slow"]], args, messages))
    assert timed_out.value.failure_class == "reward_timeout"
    outcome = asyncio.run(score([rewards["gate"], rewards["half"]], args, messages))
    assert outcome.total == 0.0 and outcome.components == {"gate": 0.0, "half": 0.5}
    outcome = asyncio.run(score([rewards["gate"], rewards["half"]], RewardArgs(variables={"ok": 1}), messages))
    assert outcome.total == 1.5  # gate 1 + half 0.5


def test_sandbox_reward_runs_in_the_sandbox(tmp_path):
    sandbox_module = import_file(REPO / "resources_servers" / "code_exec" / "sandbox.py")
    try:
        sandbox_module.Sandbox().check()
    except sandbox_module.SandboxUnavailableError as exc:
        pytest.skip(str(exc))
    root = make_project(
        tmp_path / "p",
        [],
        rewards="""
        import os
        from nemo_gym.rnow import reward, get_response
        @reward(sandbox=True, timeout=20)
        def in_sandbox(args, messages) -> float:
            return 1.0 if os.getcwd() == "/work" and get_response(messages) == args.metadata["answer"] else 0.0
        """,
    )
    from nemo_gym.rnow.sandboxed import SandboxedRewards

    spec = load_functions(root).rewards["in_sandbox"]
    messages = [*user("q"), {"role": "assistant", "content": "42"}]
    outcome = asyncio.run(
        score([spec], RewardArgs(metadata={"answer": "42"}), messages, sandbox=SandboxedRewards(root))
    )
    assert outcome.total == 1.0


# -- the rnow_project server -------------------------------------------------------------------------------
def test_server_tools_subset_truncation_and_verify(tmp_path):
    root = make_project(
        tmp_path / "p",
        [],
        rewards="""
        from nemo_gym.rnow import reward, get_response
        @reward(precondition=True)
        def answered(args, messages) -> float:
            return 1.0 if "Answer:" in get_response(messages) else 0.0
        @reward
        def accuracy(args, messages) -> float:
            return 1.0 if args.metadata["answer"] in get_response(messages) else 0.0
        @reward
        def broken(args, messages) -> float:
            return messages[99]["content"]
        """,
    )
    (root / "tools.py").write_text(
        (root / "tools.py").read_text()
        + textwrap.dedent('''
        @tool
        def echo(text: str) -> str:
            """Echo the text back."""
            return text
        ''')
    )
    server = APP.RnowProjectServer({"project_dir": str(root), "max_tool_response_chars": 10})
    with TestClient(server.build_app()) as client:
        assert {t["name"] for t in client.get("/tools").json()} == {"add", "multiply", "capital", "echo"}
        client.post(
            "/seed_session", json={"responses_create_params": {"input": []}, "tools": ["echo"]}, headers=SESSION
        )
        assert (
            client.post("/echo", json={"text": "x" * 25}, headers=SESSION).json()
            == "xxxxxxxxxx... [truncated 15 characters]"
        )
        assert "not available" in client.post("/add", json={"a": 1, "b": 2}, headers=SESSION).json()
        assert client.post("/add", json={"a": "one", "b": 2}, headers=SESSION).status_code == 422
        client.post(
            "/seed_session", json={"responses_create_params": {"input": []}}, headers=SESSION
        )  # no subset: all tools
        assert client.post("/add", json={"a": 1, "b": 2}, headers=SESSION).json() == "3"
        for bad in (
            {"tools": "echo"},
            {"metadata": ["answer"]},
        ):  # a bad entry is a 422 naming the field, not a session kept as given
            seeded = client.post(
                "/seed_session", json={"responses_create_params": {"input": []}, **bad}, headers=SESSION
            )
            assert seeded.status_code == 422 and seeded.json()["detail"][0]["loc"][0] in bad, seeded.text

        row = {
            "responses_create_params": {"input": user("6 x 7?")},
            "rewards": ["answered", "accuracy"],
            "metadata": {"answer": "42"},
        }
        good = client.post("/verify", json={**row, "response": answer_response("Answer: 42")}).json()
        assert good["reward"] == 2.0 and good["reward_components"] == {"answered": 1.0, "accuracy": 1.0}
        assert (
            client.post("/verify", json={**row, "response": answer_response("42")}).json()["reward"] == 0.0
        )  # gate failed
        failed = client.post("/verify", json={**row, "rewards": ["broken"], "response": answer_response("x")})
        assert failed.status_code == 502 and failed.json()["error"]["type"] == "reward_error"
        assert (
            client.post("/verify", json={**row, "rewards": ["nope"], "response": answer_response("x")}).status_code
            == 422
        )


# -- validation --------------------------------------------------------------------------------------------
GOOD = {"messages": user("What is 1 + 1?"), "rewards": ["accuracy"], "metadata": {"answer": "2"}}


def test_every_entry_problem_is_reported_with_its_line(tmp_path):
    root = make_project(
        tmp_path / "p",
        [
            GOOD,
            {**GOOD, "rewards": ["acuracy"]},
            {**GOOD, "tools": ["ad"]},
            {**GOOD, "messages": [*user("hi"), {"role": "system", "content": "late"}]},
            {**GOOD, "messages": [{"role": "system", "content": "only"}]},
            {**GOOD, "messages": [*user("hi"), {"role": "assistant", "content": "done"}]},
            {**GOOD, "rewards": ["in_box"]},
            {**GOOD, "messages": [{"role": "wizard", "content": "x"}]},
        ],
        rewards="""
        from nemo_gym.rnow import reward
        @reward
        def accuracy(args, messages) -> float:
            return 1.0
        @reward(sandbox=True)
        def in_box(args, messages) -> float:
            return 1.0
        """,
    )
    with pytest.raises(ConfigError) as raised:
        load_project(root)
    message = str(raised.value)
    assert "train.jsonl:1" not in message and "7 problem(s)" in message
    assert "train.jsonl:2: unknown reward 'acuracy' (did you mean 'accuracy'?)" in message
    assert "train.jsonl:3: unknown tool 'ad' (did you mean 'add'?)" in message
    assert "train.jsonl:4: messages[1]: a system message may only come first" in message
    assert "train.jsonl:5: messages: at least one user message is required" in message
    assert "train.jsonl:6: messages: the last message is an assistant turn" in message
    assert "train.jsonl:7: reward 'in_box' has sandbox=True, which needs a 'docker' field" in message
    assert "train.jsonl:8: messages[0]: role 'wizard'" in message
    load_project(
        make_project(
            tmp_path / "q",
            [{**GOOD, "rewards": ["in_box"], "docker": "python:3.11-slim"}],
            rewards=(root / "rewards.py").read_text(),
        )
    )


def test_prompt_longer_than_the_context_window(tmp_path):
    root = make_project(
        tmp_path / "p", [GOOD, {**GOOD, "messages": user("word " * 400)}], config={"rollout.max_context_window": 400}
    )
    with pytest.raises(
        ConfigError,
        match=r"train.jsonl:2: the prompt is \d+ (approximate )?tokens.*longer than rollout.max_context_window = 400",
    ) as raised:
        load_project(root)
    assert "train.jsonl:1" not in str(raised.value)


@pytest.mark.parametrize(
    ("config", "overrides", "expected"),
    [
        ({"data.batchsize": 2}, [], "unknown key 'data.batchsize' (did you mean 'batch_size'?)"),
        ({"algorithm.adv_estimator": "gae"}, [], "'gae' is not supported: it needs a value model (critic)"),
        ({}, [("algorithm", "dpo")], "key 'algorithm': +algorithm=dpo is not a training mode; use +algorithm=sft"),
        ({}, [("dataset_type", "distill")], "'distill' is not supported in rnow projects: use rl or sft"),
        ({}, [("data.group_size", 1)], "key 'data.group_size': GRPO compares"),
        ({"model.path": "Qwen/Qwen3-8B"}, [], "key 'model.path': 'Qwen/Qwen3-8B' is neither an embedded model"),
        ({"rollout.mcp_url": "http://x"}, [], "MCP tool servers are not supported"),
    ],
)
def test_config_problems_name_their_key(tmp_path, config, overrides, expected):
    root = make_project(tmp_path / "p", [GOOD], config=config)
    with pytest.raises(ConfigError) as raised:
        load_project(root, overrides)
    assert expected in str(raised.value)


# -- translation -------------------------------------------------------------------------------------------
def test_translation_is_a_valid_trainer_config(tmp_path):
    root = make_project(
        tmp_path / "p",
        [GOOD] * 5,
        config={
            "algorithm.adv_estimator": "reinforce",
            "algorithm.loss_fn": "importance_sampling",
            "algorithm.kl_penalty_coef": 0.01,
            "model.qlora_rank": 4,
        },
    )
    project = load_project(root, [("data.batch_size", 2), ("trainer.num_epochs", 3)])
    translation = translate(
        project, project.models[0], tasks_path=tmp_path / "t.jsonl", output_dir=str(tmp_path / "out")
    )
    trainer = TrainerConfig.model_validate(translation.config["trainer"])
    assert (trainer.batch_size, trainer.group_size, trainer.num_steps) == (2, 4, 9)  # 3 epochs x ceil(5 / 2)
    assert (
        trainer.advantage_estimator == "rloo"
        and trainer.loss.loss_type == "importance_sampling"
        and trainer.loss.kl_coef == 0.01
    )
    assert (
        trainer.engine.lora.rank == 4
        and trainer.engine.lora.alpha == 8
        and trainer.engine.model_path == "embedded:smollm2"
    )
    assert translation.config[AGENT_NAME]["responses_api_agents"]["simple_agent"]["max_steps"] == 3
    row = translation.rows[0]
    assert (
        row["responses_create_params"]["input"][0]["content"] == "What is 1 + 1?"
        and len(row["responses_create_params"]["tools"]) == 3
    )


def test_expand_writes_a_loadable_config_and_one_run_per_model(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = make_project(
        tmp_path / "p", [GOOD], config={"model.path": ["embedded:smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct"]}
    )
    runs = expand_rnow_args([f"+rnow_project={root}", "+data.batch_size=1", "+trainer.num_steps=2"], mode="train")
    assert len(runs) == 2 and all(r[1:] == ["+trainer.num_steps=2"] for r in runs)
    loaded = load_config(runs[0])
    assert {i.name for i in server_instances(loaded)} == {"rnow_project", AGENT_NAME, "policy_model"}
    assert loaded.values["trainer"]["batch_size"] == 1 and loaded.values["trainer"]["num_steps"] == 2
    outputs = {load_config(r).values["trainer"]["output_dir"] for r in runs}
    assert len(outputs) == 2
    with pytest.raises(ConfigError, match="ng_run serves one policy"):
        expand_rnow_args([f"+rnow_project={root}"], mode="run")
    [run] = expand_rnow_args(
        [
            f"+rnow_project={root}",
            "+model.path=embedded:smollm2",
            "+config_paths=[tests/configs/rnow_scripted_policy.yaml]",
        ],
        mode="run",
    )
    loaded = load_config(run, cwd=REPO)
    assert "scripted_model" in loaded.values["policy_model"]["responses_api_models"]  # the user's policy, no vllm_model
    assert expand_rnow_args(["+config_paths=[a.yaml]"], mode="run") == [["+config_paths=[a.yaml]"]]


# -- SFT entries -------------------------------------------------------------------------------------------
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}
SFT_GOOD = {
    "messages": [
        *user("What is 1 + 1?"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "assistant", "content": "$answer"},
    ],
    "variables": {"answer": "It is 2."},
    "tools": ["add"],
}


def test_sft_entries_are_checked_with_their_lines(tmp_path):
    bad_json = {
        "messages": [
            *user("x"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "add", "arguments": "{a: 1"}}],
            },
        ]
    }
    entries = [
        SFT_GOOD,
        {"messages": user("no answer")},
        bad_json,
        {"messages": [*user("x"), {"role": "assistant", "content": "y"}], "tools": ["ad"]},
    ]
    root = make_project(tmp_path / "p", entries)
    with pytest.raises(ConfigError) as raised:
        load_project(root, [("algorithm", "sft")])
    message = str(raised.value)
    assert "has 3 problem(s)" in message
    assert (
        "train.jsonl:2: messages: an SFT entry ends with the assistant turn to learn, but the last message is a user"
        " message" in message
    )
    assert "train.jsonl:3: messages[1].tool_calls[0].function.arguments: not valid JSON" in message
    assert "train.jsonl:4: unknown tool 'ad' (did you mean 'add'?)" in message
    with pytest.raises(
        ConfigError,
        match="train.jsonl:1: messages: the last message is an assistant turn.*train them with \\+algorithm=sft",
    ):
        load_project(
            make_project(tmp_path / "q", [SFT_GOOD])
        )  # an RL project refuses SFT entries, and says how to train them


def test_sft_project_translates_to_an_sft_trainer(tmp_path, monkeypatch, capsys):
    from nemo_gym.train.supervised import row_conversation

    monkeypatch.chdir(tmp_path)
    root = make_project(tmp_path / "p", [SFT_GOOD] * 3, config={"data.group_size": 1})  # group_size is not read for SFT
    [run] = expand_rnow_args(
        [f"+rnow_project={root}", "+algorithm=sft", "+data.batch_size=2", "+trainer.num_epochs=2"], mode="train"
    )
    trainer = TrainerConfig.model_validate(load_config(run).values["trainer"])
    assert (trainer.algorithm, trainer.batch_size, trainer.supervised.num_epochs, trainer.supervised.max_seq_len) == (
        "sft",
        2,
        2,
        2048,
    )
    assert trainer.engine.lora is not None and trainer.engine.lora.rank == 8
    rows = read_jsonl(Path(trainer.input_jsonl_fpath))
    assert len(rows) == 3 and Path(trainer.input_jsonl_fpath).name == "train_sft.jsonl"
    messages, tools = row_conversation(rows[0])
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": 1}'  # the JSON string, unchanged
    assert messages[3]["content"] == "It is 2." and [t["function"]["name"] for t in tools] == ["add"]
    assert "3 SFT conversations" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="nothing to serve"):
        expand_rnow_args([f"+rnow_project={root}", "+dataset_type=sft"], mode="run")


# -- a real ng_run over the sample project -----------------------------------------------------------------
@pytest.mark.long
@pytest.mark.integration
def test_ng_run_and_collect_on_the_sample_project(tmp_path):
    from ng_process import BIN, NgRun

    tasks = REPO / "results" / "rnow" / load_project(SAMPLE).output_name / "train_tasks.jsonl"
    out = tmp_path / "rollouts.jsonl"
    with NgRun(f"+rnow_project={SAMPLE}", "+config_paths=[tests/configs/rnow_scripted_policy.yaml]") as run:
        head = run.wait_ready()
        done = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+head_server_url={head}",
                f"+agent_name={AGENT_NAME}",
                f"+input_jsonl_fpath={tasks}",
                f"+output_jsonl_fpath={out}",
                "+progress=false",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["rnow_line"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(rows) == 10
    assert rows[1]["reward"] == 3.0 and rows[1]["reward_components"] == {
        "answered": 1.0,
        "accuracy": 1.0,
        "used_tool": 1.0,
    }  # add(17, 25) → "Answer: 42"
    assert rows[6]["reward"] == 2.0  # capital(Japan) → "Answer: Tokyo"
    assert rows[9]["reward"] == 1.0 and rows[9]["reward_components"] == {
        "answered": 1.0,
        "accuracy": 0.0,
    }  # no tools, wrong answer
    tool_outputs = [i for i in rows[1]["response"]["output"] if i["type"] == "function_call_output"]
    assert tool_outputs and tool_outputs[0]["output"] == "42"


@pytest.mark.long
@pytest.mark.integration
def test_a_projects_requirements_go_into_its_server_environment(tmp_path):
    """A project whose rewards.py imports a package its own requirements.txt lists (not one of ours): ng_run builds
    the project server's environment with it (it stopped with "cannot import ... install it")."""
    from ng_process import BIN, NgRun

    root = tmp_path / "project"
    shutil.copytree(SAMPLE, root)
    (root / "requirements.txt").write_text("jellyfish==1.3.0\n")
    rewards = (
        (root / "rewards.py")
        .read_text()
        .replace('"""\n\nfrom nemo_gym.rnow', '"""\n\nimport jellyfish\n\nfrom nemo_gym.rnow', 1)
    )
    rewards = rewards.replace(
        '    return 1.0 if str(args.metadata["answer"]).lower() in final_answer(messages).lower() else 0.0',
        '    return float(jellyfish.jaro_winkler_similarity(str(args.metadata["answer"]).lower(),'
        " final_answer(messages).lower()) == 1.0)",
    )
    assert "import jellyfish" in rewards and "jaro_winkler" in rewards
    (root / "rewards.py").write_text(rewards)
    tasks = REPO / "results" / "rnow" / load_project(root).output_name / "train_tasks.jsonl"
    out = tmp_path / "rollouts.jsonl"
    with NgRun(
        f"+rnow_project={root}", "+config_paths=[tests/configs/rnow_scripted_policy.yaml]", timeout_s=600
    ) as run:
        head = run.wait_ready()
        done = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+head_server_url={head}",
                f"+agent_name={AGENT_NAME}",
                f"+input_jsonl_fpath={tasks}",
                f"+output_jsonl_fpath={out}",
                "+progress=false",
                "+limit=2",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["rnow_line"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows[1]["reward_components"] == {
        "answered": 1.0,
        "accuracy": 1.0,
        "used_tool": 1.0,
    }  # "42" == "42", scored by jellyfish


def test_cli_reports_project_problems_before_running(tmp_path, capsys):
    from nemo_gym.cli import main

    root = make_project(tmp_path / "p", [{**GOOD, "rewards": ["acuracy"]}])
    assert main("run", [f"+rnow_project={root}"]) == 2
    assert "train.jsonl:1: unknown reward 'acuracy'" in capsys.readouterr().err
