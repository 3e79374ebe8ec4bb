"""`ng_reverify` (nemo_gym.eval.reverify; NeMo Gym 0.7.0's `gym eval reverify`): collected rollouts scored again by
the running resources server, real HTTP on loopback: each in a seeded session with its tool calls replayed, so a
stateful server (example_session_state_mgmt's counter) scores the trajectory in the state it built; the old reward
kept; a rollout the server refuses is a failure record, never a reward of 0."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from nemo_gym_peer07 import peer07_json
from ng_process import BIN
from test_collect import Served

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.eval.reverify import ReverifyOptions, reverify_main, task_rows, verify_body
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app

REPO = Path(__file__).resolve().parents[1]
COUNTER = REPO / "resources_servers" / "example_session_state_mgmt"


@pytest.fixture(scope="module")
def head():
    """A head server listing an agent whose config names the counter server, which runs."""
    counter = Served(load_server_class(COUNTER / "app.py")({}, name="counter").build_app())
    app = build_head_app()
    served = Served(app)
    entry = {"replica": 0, "implementation": "x", "pid": os.getpid()}
    app.state.servers["counter"] = {**entry, "name": "counter", "server_type": "resources_servers", "url": counter.url}
    app.state.servers["agent"] = {
        **entry,
        "name": "agent",
        "server_type": "responses_api_agents",
        "url": "http://127.0.0.1:9",  # never called
        "references": {"resources_server": {"type": "resources_servers", "name": "counter"}},
    }
    yield served.url
    served.stop()
    counter.stop()


def call(name: str, arguments: dict, call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


def rollout(task: int, increments: list[int], reward: float, **row) -> dict:
    """A rollout of the counter task (start 3, expected 6) that called increment_counter with `increments`."""
    output = [call("increment_counter", {"count": n}, f"c{i}") for i, n in enumerate(increments)]
    output += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]
    return {
        "responses_create_params": {"input": "add 1 then 2"},
        "initial_count": 3,
        "expected_count": 6,
        "agent_ref": {"name": "agent"},
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
        "response": {"output": output},
        "reward": reward,
        **row,
    }


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_rollouts_are_scored_again_in_the_state_their_tool_calls_built(head, tmp_path, capsys):
    rows = [rollout(0, [1, 2], 0.0), rollout(1, [5], 0.0), rollout(2, [1, 2], 1.0)]
    options = ReverifyOptions(
        rollouts_jsonl_fpath=str(write(tmp_path / "in.jsonl", rows)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        head_server_url=head,
    )
    assert reverify_main(options) == 0
    scored = read_jsonl(tmp_path / "out.jsonl")
    assert [(r["_ng_task_index"], r["reward"], r["previous_reward"]) for r in scored] == [
        (0, 1.0, 0.0),  # 3 + 1 + 2 = 6: the stored 0 was wrong
        (1, 0.0, 0.0),
        (2, 1.0, 1.0),
    ]
    assert scored[0]["response"] == rows[0]["response"] and not (tmp_path / "out_failures.jsonl").exists()
    out = capsys.readouterr().out
    assert "Reverified: 3/3 rollouts" in out and "1 with another reward" in out and "(before: 0.3333)" in out
    # without the replay the counter stays at its start: the stateful server cannot score the trajectory
    no_replay = options.model_copy(update={"replay_tool_calls": False, "overwrite": True})
    assert reverify_main(no_replay) == 0
    assert [r["reward"] for r in read_jsonl(tmp_path / "out.jsonl")] == [0.0, 0.0, 0.0]


def test_a_rollout_the_server_refuses_is_a_failure_not_a_zero(head, tmp_path):
    bad = {k: v for k, v in rollout(1, [1, 2], 1.0).items() if k != "expected_count"}  # the verify request needs it
    options = ReverifyOptions(
        rollouts_jsonl_fpath=str(write(tmp_path / "in.jsonl", [rollout(0, [1, 2], 1.0), bad])),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        head_server_url=head,
    )
    assert reverify_main(options) == 1
    assert [r["_ng_task_index"] for r in read_jsonl(tmp_path / "out.jsonl")] == [0]
    [failure] = read_jsonl(tmp_path / "out_failures.jsonl")
    assert (failure["_ng_task_index"], failure["failure_class"]) == (1, "http_error") and "expected_count" in failure[
        "message"
    ]
    with pytest.raises(ConfigError, match=r"out\.jsonl exists; \+overwrite=true replaces it"):
        reverify_main(options)


def test_a_row_of_an_agent_that_names_no_resources_server_is_refused_before_any_call(head, tmp_path):
    rows = [rollout(0, [1], 0.0), {**rollout(1, [1], 0.0), "agent_ref": {"name": "ghost"}}]
    options = ReverifyOptions(
        rollouts_jsonl_fpath=str(write(tmp_path / "in.jsonl", rows)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        head_server_url=head,
    )
    with pytest.raises(
        DataError, match=r"in\.jsonl:2: agent 'ghost' names no running resources server \(running agents: agent\)"
    ):
        reverify_main(options)
    assert not (tmp_path / "out.jsonl").exists()
    assert reverify_main(options.model_copy(update={"resources_server": "counter"})) == 0  # named for every row


def test_gym_eval_reverify_runs_it(head, tmp_path):
    rollouts = write(tmp_path / "in.jsonl", [rollout(0, [1, 2], 0.0)])
    argv = [str(BIN / "gym"), "eval", "reverify", "--rollouts", str(rollouts), "-o", str(tmp_path / "out.jsonl")]
    env = {**os.environ, "NEMO_GYM_HEAD_URL": head}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Reverified: 1/1 rollouts" in done.stdout and "1 with another reward" in done.stdout
    refused = subprocess.run([*argv, "--config", "c.yaml"], capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "start them with gym env start" in refused.stderr


def test_0_7_0_rollouts_get_their_task_fields_from_the_materialized_inputs(head, tmp_path):
    """A 0.7.0 rollout row keeps only the verify answer (the counter's `expected_count` dropped): the row the
    collector sent, from `<stem>_materialized_inputs.jsonl` beside the rollouts, gives the task fields."""
    full = rollout(0, [1, 2], 0.0)
    answer_only = {k: v for k, v in full.items() if k not in ("expected_count", "initial_count")}
    inputs = {k: v for k, v in full.items() if k not in ("response", "reward")}
    write(tmp_path / "rollouts_materialized_inputs.jsonl", [inputs])
    options = ReverifyOptions(
        rollouts_jsonl_fpath=str(write(tmp_path / "rollouts.jsonl", [answer_only])),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        head_server_url=head,
    )
    assert reverify_main(options) == 0
    assert read_jsonl(tmp_path / "out.jsonl")[0]["reward"] == 1.0
    (tmp_path / "rollouts_materialized_inputs.jsonl").write_text("")
    with pytest.raises(DataError, match=r"rollouts\.jsonl:1: rollout \(0, 0\) has no row in the materialized inputs"):
        reverify_main(options.model_copy(update={"overwrite": True}))


PEER_PAYLOADS = """
import json, sys
from nemo_gym.rollout_reverification import InputRolloutPair, _build_verify_payload
case = json.loads(sys.argv[1])
print(json.dumps([_build_verify_payload(InputRolloutPair(input=i, rollout=r)) for i, r in case]))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(120)
def test_the_verify_bodies_are_0_7_0s(tmp_path):
    """0.7.0's own `_build_verify_payload` on the same materialized inputs and rollouts (a plain row, a materialized
    task with its task_data, a rollout with its deliverables) gives the bodies we send."""
    response = {"output": [{"type": "message", "role": "assistant", "content": []}]}
    keys = [{"_ng_task_index": i, "_ng_rollout_index": 0} for i in range(3)]
    inputs = [
        {**keys[0], "responses_create_params": {"input": "q"}, "expected_count": 6},
        {**keys[1], "task_id": {"taskset": "t", "task_id": "1"}, "task_input": {"x": 1, "task_data": {"y": 2}}},
        {**keys[2], "responses_create_params": {"input": "q"}, "answer": "B"},
    ]
    rollouts = [
        {**keys[0], "response": response, "reward": 0.0},
        {**keys[1], "response": response, "reward": 1.0},
        {**keys[2], "response": response, "reward": 1.0, "deliverables_dir": "/d", "reference_ids": ["r1"]},
    ]
    write(tmp_path / "r_materialized_inputs.jsonl", inputs)
    options = ReverifyOptions(rollouts_jsonl_fpath=str(tmp_path / "r.jsonl"), output_jsonl_fpath=str(tmp_path / "o"))
    tasks = task_rows(options)
    ours = [verify_body(tasks[(r["_ng_task_index"], 0)], r) for r in rollouts]
    assert peer07_json(PEER_PAYLOADS, json.dumps(list(zip(inputs, rollouts))), timeout=100) == ours


# -- ATIF trajectories as input (0.7.0's --input-format atif) ------------------------------------------------------
def _exported(tmp_path: Path, rows: list[dict]) -> tuple[Path, Path]:
    """`rows` exported by ng_export_atif, and their materialized inputs: (manifest, inputs)."""
    from nemo_gym.eval.atif_export import export_rollouts

    for row in rows:  # each call answered, as in a real rollout
        answered = []
        for item in row["response"]["output"]:
            answered += [item] + ([{"type": "function_call_output", "call_id": item["call_id"], "output": '{"ok":1}'}]
                                  if item["type"] == "function_call" else [])  # fmt: skip
        row["response"] = {**row["response"], "output": answered}
    export_rollouts(write(tmp_path / "r.jsonl", rows), tmp_path / "atif", session_id="s", agent_version="1")
    inputs = write(
        tmp_path / "inputs.jsonl", [{k: v for k, v in r.items() if k not in ("response", "reward")} for r in rows]
    )
    return tmp_path / "atif" / "manifest.jsonl", inputs


def _atif_options(manifest: Path, inputs: Path, output: Path, head: str | None = None) -> ReverifyOptions:
    return ReverifyOptions(
        input_format="atif",
        atif_manifest_jsonl_fpath=str(manifest),
        materialized_inputs_jsonl_fpath=str(inputs),
        output_jsonl_fpath=str(output),
        head_server_url=head,
    )


def test_atif_trajectories_are_scored_as_their_rollouts(head, tmp_path, capsys):
    """ng_export_atif's files back through ng_reverify: each trajectory is the rollout's response again."""
    manifest, inputs = _exported(tmp_path, [rollout(0, [1, 2], 0.0), rollout(1, [5], 1.0)])
    options = _atif_options(manifest, inputs, tmp_path / "out.jsonl", head)
    assert reverify_main(options) == 0
    scored = read_jsonl(tmp_path / "out.jsonl")
    assert [(r["_ng_task_index"], r["reward"]) for r in scored] == [(0, 1.0), (1, 0.0)]  # replayed: 3+1+2, 3+5
    calls = [item for item in scored[0]["response"]["output"] if item["type"] == "function_call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("increment_counter", '{"count":1}')] + [
        ("increment_counter", '{"count":2}')
    ]
    out = capsys.readouterr().out
    assert scored[0]["_ng_atif_provenance"]["trajectory_id"] == "s:0:0"
    assert "Reverified: 2/2 rollouts" in out and "0 with another reward, 2 without a reward before" in out
    argv = [str(BIN / "gym"), "eval", "reverify", "--input-format", "atif", "--atif-manifest", str(manifest)]
    argv += ["--inputs", str(inputs), "-o", str(tmp_path / "cli.jsonl")]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "NEMO_GYM_HEAD_URL": head}
    )
    assert done.returncode == 0 and "Reverified: 2/2 rollouts" in done.stdout, done.stderr


def test_a_bad_atif_input_is_refused_naming_the_manifest_line_before_any_call(head, tmp_path):
    manifest, inputs = _exported(tmp_path, [rollout(0, [1, 2], 0.0), rollout(1, [5], 1.0)])
    options = _atif_options(manifest, inputs, tmp_path / "out.jsonl", head)
    trajectory = tmp_path / "atif" / "1-0.json"
    original = trajectory.read_text()
    trajectory.write_text(original.replace('"count": 5', '"count": 6'))  # not the file the manifest pinned
    with pytest.raises(DataError, match=r"manifest\.jsonl:2: .*1-0\.json: its sha256 is [0-9a-f]{64}, the manifest"):
        reverify_main(options)
    unanswered = json.loads(original)
    unanswered["steps"][-2]["observation"] = None  # the tool call's step loses its output
    trajectory.write_text(json.dumps(unanswered))
    lines = manifest.read_text().splitlines()
    manifest.write_text(lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "expected_sha256": None}) + "\n")
    with pytest.raises(DataError, match=r"manifest\.jsonl:2: .*step \d+ has no output for tool call\(s\) \['c0'\]"):
        reverify_main(options)
    manifest.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(DataError, match=r"manifest\.jsonl:2: rollout \(0, 0\) or file .* is in the manifest twice"):
        reverify_main(options)
    assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(ValueError, match="input_format=atif reads"):
        ReverifyOptions(input_format="atif", atif_manifest_jsonl_fpath=str(manifest), output_jsonl_fpath="o")


PEER_ATIF = """
import json, sys
from pathlib import Path
from nemo_gym.atif_reverification import index_materialized_inputs, load_atif_manifest, project_atif_manifest_entries
manifest, inputs = Path(sys.argv[1]), [json.loads(line) for line in open(sys.argv[2])]
projected = project_atif_manifest_entries(load_atif_manifest(manifest), index_materialized_inputs(inputs),
                                          manifest_directory=manifest.parent)
print(json.dumps([p.payload for p in projected]))
"""


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return [_without_nulls(v) for v in value] if isinstance(value, list) else value


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(120)
def test_the_atif_verify_bodies_are_0_7_0s(tmp_path):
    """0.7.0's own projection (`project_atif_manifest_entries`) on the same manifest and inputs gives the bodies we
    send, item ids included (JSON nulls aside): trajectories ng_export_atif wrote, and one of another producer with no
    trajectory id, text parts, Relay's extra.tool_result, a timestamp, reasoning and usage."""
    from nemo_gym.eval.atif_reverify import ATIF_PROVENANCE_KEY, atif_rows
    from nemo_gym.eval.reverify import task_rows

    rows = [
        rollout(0, [1, 2], 0.0),
        {**rollout(1, [], 1.0), "responses_create_params": {"input": "q", "temperature": 0.3}},
    ]
    manifest, inputs = _exported(tmp_path, rows)
    other = {
        "schema_version": "ATIF-v1.7", "session_id": "relay-1",
        "agent": {"name": "relay", "version": "2", "model_name": "m"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "add"},
            {"step_id": 2, "source": "agent", "message": "", "reasoning_content": "plan",
             "timestamp": "2026-11-29T10:00:00Z",
             "tool_calls": [{"tool_call_id": "t1", "function_name": "increment_counter", "arguments": {"count": 3}},
                            {"tool_call_id": "t2", "function_name": "get_counter_value", "arguments": {}}],
             "observation": {"results": [{"source_call_id": "t1", "extra": {"tool_result": {"ok": True}}},
                                         {"source_call_id": "t2", "content": [{"type": "text", "text": "6"}]}]}},
            {"step_id": 3, "source": "agent", "message": [{"type": "text", "text": "six"}]},
        ],
        "final_metrics": {"total_prompt_tokens": 7, "total_completion_tokens": 3, "total_cached_tokens": 2},
    }  # fmt: skip
    (tmp_path / "atif" / "other.json").write_text(json.dumps(other))
    with manifest.open("a") as fh:
        fh.write(json.dumps({"trajectory_path": "other.json", "_ng_task_index": 2, "_ng_rollout_index": 0}) + "\n")
    with inputs.open("a") as fh:
        third = {k: v for k, v in rollout(2, [], 0.0).items() if k not in ("response", "reward")}
        fh.write(json.dumps({**third, "responses_create_params": {"input": "add", "parallel_tool_calls": True}}) + "\n")
    options = _atif_options(manifest, inputs, tmp_path / "o")
    ours = [
        {k: v for k, v in row.items() if k != ATIF_PROVENANCE_KEY} for _, row in atif_rows(manifest, task_rows(options))
    ]
    theirs = peer07_json(PEER_ATIF, str(manifest), str(inputs), timeout=100)
    assert len(theirs) == 3 and _without_nulls(ours) == _without_nulls(theirs)
