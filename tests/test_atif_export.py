"""`ng_export_atif` (NeMo Gym 0.7.0's `gym eval export --format atif`, nemo_gym.eval.atif_export): rollouts as ATIF
trajectories, checked by the `atif` package's models; the steps are the ones 0.7.0's own exporter builds from the
same conversation (`_build_groups`, in its venv), and every file validates against 0.7.0's strict ATIF v1.7 models."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from atif import Trajectory
from nemo_gym_peer07 import peer07_json
from ng_process import BIN

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import NG_TRAJECTORY_KEY
from nemo_gym.env.capture import TrajectoryCapture
from nemo_gym.eval.atif_export import export_rollouts, rollout_to_atif

TOKENS = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5], "generation_log_probs": [-0.5, -0.25]}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}


def tool_rollout(task: int = 0, rollout: int = 0) -> dict:
    """A simple_agent rollout: a system and a user message, reasoning, two tool calls and their outputs, an answer;
    token information on the item that ends each model call."""
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I need the weather."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "SF"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "NY"}'}
        | TOKENS,
        {"type": "function_call_output", "call_id": "c1", "output": '{"temp":70}'},
        {"type": "function_call_output", "call_id": "c2", "output": '{"temp":50}'},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "SF is warmer.", "annotations": []}],
        }
        | {"prompt_token_ids": [1, 2, 3, 4, 5, 6], "generation_token_ids": [7], "generation_log_probs": [-0.1]},
    ]
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "Which is warmer, SF or NY?"},
            ],
            "tools": [WEATHER_TOOL],
        },
        "response": {"model": "policy", "output": output, "usage": {"input_tokens": 9, "output_tokens": 3}},
        "reward": 1.0,
        "expected": "SF",
        "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


def test_a_tool_rollout_is_a_trajectory_of_its_steps():
    trajectory = rollout_to_atif(tool_rollout(), session_id="run", agent_version="1.0")
    Trajectory.model_validate(trajectory.to_json_dict())  # the atif package's checks, again from its JSON
    steps = trajectory.to_json_dict()["steps"]
    assert [(s["source"], s["message"]) for s in steps] == [
        ("system", "You are helpful."),
        ("user", "Which is warmer, SF or NY?"),
        ("agent", ""),
        ("agent", [{"type": "text", "text": "SF is warmer."}]),
    ]
    calls = steps[2]
    assert calls["reasoning_content"] == "I need the weather."
    assert [(c["tool_call_id"], c["function_name"], c["arguments"]) for c in calls["tool_calls"]] == [
        ("c1", "get_weather", {"city": "SF"}),
        ("c2", "get_weather", {"city": "NY"}),
    ]
    assert [(r["source_call_id"], r["content"]) for r in calls["observation"]["results"]] == [
        ("c1", '{"temp":70}'),
        ("c2", '{"temp":50}'),
    ]
    assert calls["metrics"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.5, -0.25],
    }
    assert steps[3]["metrics"]["completion_token_ids"] == [7] and steps[3]["model_name"] == "policy"
    document = trajectory.to_json_dict()
    assert document["final_metrics"] == {"total_prompt_tokens": 9, "total_completion_tokens": 3, "total_steps": 4}
    assert (document["trajectory_id"], document["agent"]["name"], document["agent"]["version"]) == (
        "run:0:0",
        "simple_agent",
        "1.0",
    )
    assert document["agent"]["tool_definitions"] == [
        {"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}
    ]
    assert document["extra"]["nemo_gym"]["rollout"]["reward"] == 1.0


def test_what_0_7_0_refuses_is_written_down_not_lost():
    """An assistant message of the input is copied context; arguments that are no JSON object are kept as sent; a
    tool output answering no call of its step has no source call; a rollout without token information gets its
    usage as final metrics; a string input is one user message."""
    row = tool_rollout()
    row["responses_create_params"]["input"] = [
        {"role": "user", "content": "Example question"},
        {"role": "assistant", "content": "\\boxed{B}"},
        {"role": "user", "content": "The question"},
    ]
    for item in row["response"]["output"]:
        for key in TOKENS:
            item.pop(key, None)
    row["response"]["output"][1]["arguments"] = "{not json"
    row["response"]["output"][3]["call_id"] = "c9"
    document = rollout_to_atif(row, session_id="s", agent_version="v").to_json_dict()
    copied = document["steps"][1]
    assert (copied["source"], copied["is_copied_context"], copied["message"]) == ("agent", True, "\\boxed{B}")
    calls = document["steps"][3]["tool_calls"]
    assert calls[0]["arguments"] == {} and calls[0]["extra"]["nemo_gym"]["arguments_text"] == "{not json"
    results = document["steps"][3]["observation"]["results"]
    assert "source_call_id" not in results[0] and results[0]["extra"]["nemo_gym"]["call_id"] == "c9"
    assert document["final_metrics"] == {"total_prompt_tokens": 9, "total_completion_tokens": 3, "total_steps": 5}
    plain = {**tool_rollout(), "responses_create_params": {"input": "Hi"}}
    assert rollout_to_atif(plain, session_id="s", agent_version="v").steps[0].message == "Hi"


def captured(row: dict) -> dict:
    """The row with the `ng_trajectory` simple_agent writes for it (nemo_gym.env.capture): two answered model calls
    (the reasoning and two tool calls, then the answer), a refused call between them, the second tool call failed."""
    capture = TrajectoryCapture("policy_model", task_id="weather", rollout_id="0-0")
    given, output = row["responses_create_params"]["input"], row["response"]["output"]
    strip = lambda items: [{k: v for k, v in item.items() if k not in TOKENS} for item in items]  # noqa: E731
    usage = {"input_tokens": 30, "output_tokens": 12, "input_tokens_details": {"cached_tokens": 8}}
    first = {"id": "resp_1", "model": "policy", "status": "completed", "output": strip(output[:3]), "usage": usage}
    capture.model_call({"input": given}, first, 1_700_000_000.0, 0.5)
    capture.tool_call("c1", "get_weather", 1_700_000_001.0, 0.25, '{"temp":70}')
    capture.tool_call("c2", "get_weather", 1_700_000_001.5, 0.25, '{"temp":50}', error_type="http_500")
    capture.model_call({"input": [*given, *output[:5]]}, None, 1_700_000_002.0, 0.1, status_code=503)
    usage = {"input_tokens": 50, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 30}}
    second = {"id": "resp_2", "model": "policy", "status": "completed", "output": strip(output[5:]), "usage": usage}
    capture.model_call({"input": [*given, *output[:5]]}, second, 1_700_000_003.0, 0.5)
    return {**row, NG_TRAJECTORY_KEY: capture.record([*given, *strip(output)], completed=True, resolved=True)}


def test_a_capture_record_gives_the_steps_their_turns_calls_and_tool_timings():
    """As 0.7.0 reads `ng_trajectory`: each agent step gets its turn's time, model, call count, token counts from
    the call's usage (the items' token ids and log-probs kept), the turn and the call in `extra.nemo_gym`; a tool
    result gets its call's timing (and, failed, how it ended); calls no turn took are kept."""
    document = rollout_to_atif(captured(tool_rollout()), session_id="s", agent_version="1").to_json_dict()
    Trajectory.model_validate(document)
    tools, answer = document["steps"][2], document["steps"][3]
    assert (tools["timestamp"], tools["model_name"], tools["llm_call_count"]) == ("2023-11-14T22:13:20Z", "policy", 1)
    assert tools["metrics"] == {
        "prompt_tokens": 30,
        "completion_tokens": 12,
        "cached_tokens": 8,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.5, -0.25],
    }
    assert tools["extra"]["nemo_gym"]["turn"] == {"turn_no": 1, "step_count": 2}
    assert tools["extra"]["nemo_gym"]["model_call"]["response_metadata"]["response_id"] == "resp_1"
    assert tools["extra"]["nemo_gym"]["source_items"] == {"reasoning_ids": ["rs_1"]}
    results = [r["extra"]["nemo_gym"] for r in tools["observation"]["results"]]
    timing = {"started_at": 1_700_000_001.0, "completed_at": 1_700_000_001.25, "duration_ms": 250.0}
    assert results[0] == timing | {"timing_source": "executor"}
    assert (results[1]["status"], results[1]["error_type"]) == ("failed", "http_500")
    assert answer["extra"]["nemo_gym"]["turn"] == {"turn_no": 2, "step_count": 2, "resolved": True}
    assert answer["metrics"]["completion_token_ids"] == [7] and answer["timestamp"] == "2023-11-14T22:13:23Z"
    assert document["final_metrics"] == {
        "total_prompt_tokens": 80,
        "total_completion_tokens": 16,
        "total_cached_tokens": 38,
        "total_steps": 4,
    }
    extra = document["extra"]["nemo_gym"]
    assert extra["source"] == {
        "format": "ng_trajectory",
        "schema_version": "1.0",
        "task_id": "weather",
        "rollout_id": "0-0",
        "task_index": 0,
        "rollout_index": 0,
        "invocation_id": "root",
        "invocation_status": "completed",
    }
    assert extra["conversion"] == {"profile": "ng-trajectory-to-atif-v1", "status": "complete"}
    (refused,) = extra["surplus_model_calls"]
    assert refused["response_metadata"]["status_code"] == 503 and "gaps" not in extra
    assert NG_TRAJECTORY_KEY not in extra["rollout"] and extra["rollout"]["reward"] == 1.0


def test_a_record_that_does_not_line_up_is_said_and_the_rollout_still_exported():
    """0.7.0 refuses these rollouts; here the conversation is exported, and `conversion` says what was not applied:
    a turn missing (no step takes a turn's call), a turn whose reference resolves to no call, a record that is not
    one (nothing applied)."""
    row = captured(tool_rollout())
    row[NG_TRAJECTORY_KEY]["turns"].pop()
    document = rollout_to_atif(row, session_id="s", agent_version="1").to_json_dict()
    conversion = document["extra"]["nemo_gym"]["conversion"]
    assert conversion["status"] == "partial" and conversion["issues"] == [
        "ng_trajectory.turns: 1 turns for 2 agent steps the model wrote; no step took a turn's model call"
    ]
    assert "timestamp" not in document["steps"][2] and document["steps"][2]["metrics"]["prompt_tokens"] == 3
    assert len(document["extra"]["nemo_gym"]["surplus_model_calls"]) == 3
    assert document["extra"]["nemo_gym"]["source"]["format"] == "ng_trajectory"

    row = captured(tool_rollout())
    row[NG_TRAJECTORY_KEY]["turns"][1]["model_calls"][0]["model_call_id"] = "gone"
    conversion = rollout_to_atif(row, session_id="s", agent_version="1").extra["nemo_gym"]["conversion"]
    assert conversion["issues"] == [
        "ng_trajectory turn 2 (agent step 4): its model call reference resolves to 0 captured calls, not one"
    ]

    row = captured(tool_rollout())
    row[NG_TRAJECTORY_KEY]["turns"][0]["turn_no"] = 0
    document = rollout_to_atif(row, session_id="s", agent_version="1").to_json_dict()
    assert document["extra"]["nemo_gym"]["source"] == {
        "format": "responses_rollout",
        "task_index": 0,
        "rollout_index": 0,
    }
    assert document["extra"]["nemo_gym"]["conversion"] == {
        "profile": "ng-trajectory-to-atif-v1",
        "status": "not_applied",
        "issues": ["ng_trajectory.turns[0].turn_no: Input should be greater than or equal to 1"],
    }
    assert [s["source"] for s in document["steps"]] == ["system", "user", "agent", "agent"]


def test_the_folder_has_a_file_per_rollout_and_its_manifest(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(tool_rollout(t, r)) + "\n" for t in (0, 1) for r in (0, 1)))
    out = tmp_path / "atif"
    assert export_rollouts(rollouts, out, session_id="run", agent_version="1") == 4
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [m["trajectory_path"] for m in manifest] == ["0-0.json", "0-1.json", "1-0.json", "1-1.json"]
    for entry in manifest:
        data = (out / entry["trajectory_path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["expected_sha256"]
        assert (
            Trajectory.model_validate_json(data).trajectory_id
            == f"run:{entry['_ng_task_index']}:{entry['_ng_rollout_index']}"
        )
    with pytest.raises(ConfigError, match="exists; name a new folder"):
        export_rollouts(rollouts, out, session_id="run", agent_version="1")


def test_bad_rows_are_named_by_line_and_nothing_is_written(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    no_agent = {k: v for k, v in tool_rollout(1).items() if k != "agent_ref"}
    rows = [tool_rollout(0), no_agent, tool_rollout(0), {**tool_rollout(2), "_ng_task_index": -1}]
    rollouts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError) as refused:
        export_rollouts(rollouts, tmp_path / "atif", session_id="run", agent_version="1")
    message = str(refused.value)
    assert message.startswith("3 rollout(s) cannot be exported, nothing was written")
    assert f"{rollouts}:2: no agent_ref.name" in message and f"{rollouts}:3: a second row of rollout (0, 0)" in message
    assert f"{rollouts}:4: _ng_task_index and _ng_rollout_index must be non-negative integers" in message
    assert not (tmp_path / "atif").exists() and [p.name for p in tmp_path.iterdir()] == ["rollouts.jsonl"]


def test_gym_eval_export_runs_it_with_the_texts_given(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(json.dumps(tool_rollout()) + "\n")
    argv = [str(BIN / "gym"), "eval", "export", "--format", "atif", "--rollouts", str(rollouts), "--output-dir"]
    done = subprocess.run(
        [*argv, str(tmp_path / "out"), "--session-id", "7", "--agent-version", "1.10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Exported 1 ATIF trajectory file(s)" in done.stdout
    document = json.loads((tmp_path / "out" / "0-0.json").read_text())
    assert (document["session_id"], document["agent"]["version"]) == ("7", "1.10")
    missing = subprocess.run(
        [
            str(BIN / "ng_export_atif"),
            f"+rollouts_jsonl_fpath={tmp_path / 'nope.jsonl'}",
            "+output_dirpath=x",
            "+session_id=s",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "+rollouts_jsonl_fpath: no such file" in missing.stderr


PEER_STEPS = """
import json, sys
from nemo_gym.atif_export import _build_groups
from nemo_gym.atif_v1_7 import AtifTrajectoryV1_7
from nemo_gym.rollout_observability import TrajectoryRecord
case = json.loads(sys.argv[1])
conversation = case["conversation"]
tools = [
    {"invocation_id": "inv", "tool_call_id": item["call_id"], "tool_name": item["name"], "status": "completed"}
    for item in conversation if item.get("type") == "function_call"
]
record = TrajectoryRecord.model_validate({
    "task_id": "t", "rollout_id": "0-0", "tool_calls": tools,
    "invocations": [{"invocation_id": "inv", "status": "completed", "conversation": conversation}],
})
steps, _ = _build_groups(record, record.invocations[0])
checked = [AtifTrajectoryV1_7.model_validate(document).schema_version for document in case["documents"]]
print(json.dumps({"steps": [s.model_dump(mode="json", exclude_none=True) for s in steps], "checked": checked}))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(120)
def test_the_steps_are_0_7_0s_and_the_files_pass_its_atif_models():
    """0.7.0's exporter builds the same steps from the same conversation (its `_build_groups`; the step metrics and
    extras it adds from its capture record aside), and its strict ATIF v1.7 models take every document we write."""
    row = tool_rollout()
    document = rollout_to_atif(row, session_id="s", agent_version="1").to_json_dict()
    strip = {*TOKENS}
    conversation = [
        {**item, "type": "message"} if "type" not in item else item for item in row["responses_create_params"]["input"]
    ] + [{k: v for k, v in item.items() if k not in strip} for item in row["response"]["output"]]
    copied = dict(
        row,
        responses_create_params={
            "input": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"},
            ]
        },
    )
    documents = [document, rollout_to_atif(copied, session_id="s", agent_version="1").to_json_dict()]
    case = json.dumps({"conversation": conversation, "documents": documents})
    theirs = peer07_json(PEER_STEPS, case, timeout=100)
    ours = [
        {k: v for k, v in step.items() if k not in ("metrics", "model_name", "extra")} for step in document["steps"]
    ]
    assert ours == theirs["steps"]
    assert theirs["checked"] == ["ATIF-v1.7", "ATIF-v1.7"]
