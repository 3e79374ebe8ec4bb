"""NeMo Gym's collection parameters on our `ng_collect_rollouts` (`nemo_gym.collect.command.CollectConfig`):
`num_repeats_add_seed`, `interleave_repeats`, `prompt_config` and `resume_from_cache` as NeMo Gym's collector takes
them, and the NeMo Gym parameters it does not take refused by name with the reason. Against the real agent and head
server of tests/test_collect.py (uvicorn on loopback); the same parameters against NeMo Gym 0.7.0's own collector:
tests/test_nemo_gym07.py::test_nemo_gym_collection_parameters_as_0_7_0_applies_them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_collect import agent, collect, config, gym, rows_of, write_input  # noqa: F401 (fixtures)

from nemo_gym.collect.files import OutputPaths
from nemo_gym.common.errors import ConfigError, DataError

BIN = Path(sys.executable).parent


def seeds_of(path: Path) -> dict[tuple[int, int], object]:
    return {
        (row["_ng_task_index"], row["_ng_rollout_index"]): json.loads(
            row["responses_create_params"]["metadata"]["extra_body"]
        )
        for row in rows_of(path)
    }


def test_num_repeats_add_seed_writes_the_repeat_index_into_metadata_extra_body(tmp_path, gym, agent):
    rows = [
        {"responses_create_params": {"input": "a"}, "x": 0},
        {"responses_create_params": {"input": "b", "metadata": {"extra_body": '{"stop": ["</a>"]}', "k": "v"}}, "x": 1},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(tmp_path, gym, num_repeats=3, num_repeats_add_seed=True)
    summary = collect(cfg)
    assert summary.rollouts_done == 6
    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    expected = {(0, r): {"seed": r} for r in range(3)} | {(1, r): {"stop": ["</a>"], "seed": r} for r in range(3)}
    assert seeds_of(paths.materialized_inputs) == expected  # as dispatched
    assert seeds_of(paths.output) == expected  # what the agent got (it echoes the row)
    assert all(row["responses_create_params"]["metadata"]["k"] == "v" for row in rows_of(paths.output)[3:] if row["x"])

    # a resume must be asked for the same way: without the flag the rows differ, and the state file says so
    with pytest.raises(ConfigError, match="different input"):
        collect(config(tmp_path, gym, num_repeats=3))


def test_num_repeats_add_seed_refuses_an_extra_body_that_is_not_a_json_object(tmp_path, gym, agent):
    rows = [{"responses_create_params": {"input": "a", "metadata": {"extra_body": "[1]"}}, "x": 0}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"in\.jsonl:1: responses_create_params\.metadata\.extra_body must be a JSON"):
        collect(config(tmp_path, gym, num_repeats_add_seed=True))
    assert not agent.calls


def test_interleave_repeats_starts_the_rollouts_repeat_by_repeat(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 3)
    collect(config(tmp_path, gym, num_repeats=2, num_samples_in_parallel=1, interleave_repeats=True))
    assert list(agent.calls) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    agent.reset()
    collect(
        config(
            tmp_path / "b", gym, num_repeats=2, num_samples_in_parallel=1, input_jsonl_fpath=str(tmp_path / "in.jsonl")
        )
    )
    assert list(agent.calls) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_prompt_config_builds_each_rows_input(tmp_path, gym, agent, monkeypatch):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.yaml").write_text("system: Answer in {unit}.\nuser: 'What is {a} + {b}? {{brace}}'\n")
    rows = [
        {"a": 1, "b": 2, "unit": "digits", "x": 0, "responses_create_params": {"temperature": 0.5}},
        {"a": 3, "b": 4, "unit": "words", "x": 1},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)  # a relative prompt_config is looked up under the working directory
    cfg = config(tmp_path, gym, prompt_config="prompts/p.yaml")
    collect(cfg)
    dispatched = rows_of(OutputPaths.for_output(cfg.output_jsonl_fpath).materialized_inputs)
    assert [row["responses_create_params"] for row in dispatched] == [
        {
            "temperature": 0.5,
            "input": [
                {"role": "system", "content": "Answer in digits."},
                {"role": "user", "content": "What is 1 + 2? {brace}"},
            ],
        },
        {
            "input": [
                {"role": "system", "content": "Answer in words."},
                {"role": "user", "content": "What is 3 + 4? {brace}"},
            ]
        },
    ]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [
                {"a": 1, "b": 2, "unit": "u"},
                {"a": 1, "b": 2, "unit": "u", "responses_create_params": {"input": "given"}},
            ],
            r"in\.jsonl:2: has responses_create_params\.input and \+prompt_config builds it: they are mutually",
        ),
        ([{"a": 1, "unit": "u"}], r"in\.jsonl:1: the prompt template names the field 'b', which the row lacks"),
    ],
)
def test_prompt_config_refuses_a_row_it_cannot_build(tmp_path, gym, agent, rows, message):
    (tmp_path / "p.yaml").write_text("user: '{a} + {b} in {unit}'\n")
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=message):
        collect(config(tmp_path, gym, prompt_config=str(tmp_path / "p.yaml")))
    assert not agent.calls


def test_a_missing_prompt_config_is_a_config_error(tmp_path, gym, agent):
    write_input(tmp_path / "in.jsonl", 1)
    with pytest.raises(ConfigError, match=r"prompt_config .*nope\.yaml: cannot be read"):
        collect(config(tmp_path, gym, prompt_config=str(tmp_path / "nope.yaml")))


def test_agent_map_reroutes_rows_as_0_7_0_does(tmp_path, gym, agent):
    """NeMo Gym 0.7.0's rule: the entry of a row's agent_ref name, else of its task_source, else `_default` (rows
    without an agent_ref too); +agent_name fills the rows still without an agent."""
    rows = [
        {"responses_create_params": {"input": "a"}, "x": 0, "agent_ref": {"name": "old"}},
        {"responses_create_params": {"input": "b"}, "x": 1, "agent_ref": {"name": "old"}, "task_source": "ds"},
        {"responses_create_params": {"input": "c"}, "x": 2, "task_source": "ds"},
        {"responses_create_params": {"input": "d"}, "x": 3, "agent_ref": {"name": "metrics_agent"}},
        {"responses_create_params": {"input": "e"}, "x": 4},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(tmp_path, gym, agent_map={"old": "agent", "ds": "metrics_agent"}, agent_name="agent")
    collect(cfg)
    routed = {row["x"]: row["agent_ref"]["name"] for row in rows_of(cfg.output_jsonl_fpath)}
    assert routed == {0: "agent", 1: "agent", 2: "metrics_agent", 3: "metrics_agent", 4: "agent"}
    cfg = config(
        tmp_path / "b", gym, agent_map={"_default": "metrics_agent"}, input_jsonl_fpath=str(tmp_path / "in.jsonl")
    )
    collect(cfg)
    assert {row["agent_ref"]["name"] for row in rows_of(cfg.output_jsonl_fpath)} == {"metrics_agent"}


def test_resume_from_cache_is_resume(tmp_path, gym):
    assert config(tmp_path, gym, resume_from_cache=False).resume is False
    assert config(tmp_path, gym, resume_from_cache=True).resume is True
    assert config(tmp_path, gym).resume is True  # ours resumes by default; NeMo Gym's starts over
    with pytest.raises(ValueError, match="disagree"):
        config(tmp_path, gym, resume=True, resume_from_cache=False)


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        (
            "+disable_aggregation=true",
            r"\+disable_aggregation is a NeMo Gym parameter that ng_collect_rollouts does not take: .*always written",
        ),
        ("+count_failure_classes_as_zero=[timeout]", r"never scored as reward 0"),
        ("+num_repeats_add_sed=true", r"unknown parameter \+num_repeats_add_sed \(did you mean 'num_repeats_add_seed'"),
    ],
)
def test_nemo_gym_parameters_it_does_not_take_are_refused_with_the_reason(tmp_path, argument, message):
    rows = write_input(tmp_path / "in.jsonl", 1)
    done = subprocess.run(
        [
            str(BIN / "ng_collect_rollouts"),
            f"+input_jsonl_fpath={rows}",
            f"+output_jsonl_fpath={tmp_path}/o.jsonl",
            argument,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(message, done.stderr), done.stderr
    assert not (tmp_path / "o.jsonl").exists()
