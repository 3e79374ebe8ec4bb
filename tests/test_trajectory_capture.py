"""`ng_collect_rollouts +observability_enabled=true`: each rollout row holds its `ng_trajectory` (NeMo Gym 0.7.0's
capture record, written by simple_agent: nemo_gym.env.capture) and its `ng_perf` (nemo_gym.collect.perf).

Real HTTP on loopback: a head server, the example_session_state_mgmt resources server (a counter per session),
scripted_model playing each row's script and simple_agent, each served by uvicorn in this process. Against 0.7.0
itself: its `TrajectoryRecord` takes every record, its rollout health checks (`gym eval health-check`'s
`run_health_checks`) observe every check on our rollouts and find the hollow turn we wrote (as ours do,
`ng_health_check`), its `_build_ng_perf` gives our `ng_perf`, and its strict ATIF export takes the record."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_servers import serve_registered

from nemo_gym.collect.aggregate_metrics import metrics_entry
from nemo_gym.collect.command import CollectConfig, collect_main, collect_rollouts
from nemo_gym.collect.health import run_health_checks
from nemo_gym.collect.perf import ng_perf
from nemo_gym.common.errors import ServerHTTPError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.capture import TrajectoryCapture, token_stats
from nemo_gym.env.capture_record import TrajectoryRecord
from nemo_gym.env.episode import EndedEpisode, StopReason, failed_run_answer
from nemo_gym.env.trajectory import with_message_types
from nemo_gym.eval.atif_export import rollout_to_atif
from nemo_gym.serving.client import ServerClient

TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
    }
]
ADD_TWO = [{"tool_calls": [{"name": "increment_counter", "arguments": {"count": 2}}]}, {"text": "done"}]
BAD_ARGUMENTS = [{"tool_calls": [{"name": "increment_counter", "arguments": "{not json"}]}, {"text": "sorry"}]
HOLLOW = [{"text": ""}]  # an empty answer: a turn without message or tool call


def row(script: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    params = {"input": "add two", "tools": TOOLS, "metadata": {"script": json.dumps(script)}}
    return {"responses_create_params": params, "initial_count": 5, "expected_count": 7, **extra}


@pytest.fixture(scope="module")
def head() -> Iterator[str]:
    agent = {
        "resources_server": {"type": "resources_servers", "name": "counter"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
        "max_steps": 3,
    }
    servers = {
        "counter": ("resources_servers", "resources_servers/example_session_state_mgmt", {}),
        "policy_model": ("responses_api_models", "responses_api_models/scripted_model", {}),
        "agent": ("responses_api_agents", "responses_api_agents/simple_agent", agent),
    }
    with serve_registered(servers) as urls:
        yield urls["head"]


def collect(head: str, tmp_path: Path, rows: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = CollectConfig(
        agent_name="agent",
        input_jsonl_fpath=str(tmp_path / "in.jsonl"),
        output_jsonl_fpath=str(tmp_path / "rollouts.jsonl"),
        head_server_url=head,
        progress=False,
        **options,
    )

    async def run() -> Any:
        async with ServerClient(head) as client:
            return await collect_rollouts(cfg, client)

    asyncio.run(run())
    return sorted(read_jsonl(tmp_path / "rollouts.jsonl"), key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))


def test_a_rollout_holds_its_capture_record_and_perf_when_observability_is_enabled(head, tmp_path):
    """The tool rollout (call increment_counter, then answer): one completed invocation, two turns each referencing
    its model call by one model_call_id, the tool call timed and completed, token counts from each answer's usage,
    and ng_perf summing them; the id of the second repeat is `0-1`."""
    rows = collect(head, tmp_path, [row(ADD_TWO, task_id="counter-7")], num_repeats=2, observability_enabled=True)
    assert [r["reward"] for r in rows] == [1.0, 1.0]
    record = rows[1]["ng_trajectory"]
    assert TrajectoryRecord.model_validate(record).rollout_id == "0-1"  # our own schema takes it (0.7.0's: below)
    assert (record["schema_version"], record["task_id"], record["rollout_id"]) == ("1.0", "counter-7", "0-1")
    (invocation,) = record["invocations"]
    assert invocation["status"] == "completed" and invocation["invocation_id"] == "root"
    assert invocation["conversation"][0] == {"role": "user", "content": "add two", "type": "message"}
    assert invocation["conversation"][1:] == rows[1]["response"]["output"]
    calls, turns = record["model_calls"], record["turns"]
    assert [len(turn["model_calls"]) for turn in turns] == [1, 1]
    assert [turn["model_calls"][0]["model_call_id"] for turn in turns] == [c["model_call_id"] for c in calls]
    assert invocation["model_calls"] == [turn["model_calls"][0] for turn in turns]
    assert [turn["step_count"] for turn in turns] == [1, 1] and [t["turn_no"] for t in turns] == [1, 2]
    assert turns[0]["question"] == [{"role": "user", "content": "add two", "type": "message"}]
    assert turns[1]["answer"][0]["content"][0]["text"] == "done"
    assert (
        with_message_types(calls[1]["request"]["input"]) == turns[1]["question"]
        and calls[1]["response"]["id"] == rows[1]["response"]["id"]
    )
    assert all(c["response_metadata"]["status_code"] == 200 and c["duration_ms"] >= 0 for c in calls)
    assert calls[0]["response_metadata"]["model_ref"] == {"type": "responses_api_models", "name": "policy_model"}
    assert calls[0]["token_stats"] == {
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "reasoning_tokens": 0,
        "total_tokens": 2,
        "cached_tokens": 0,
    }
    (tool,) = record["tool_calls"]
    assert (tool["tool_name"], tool["status"], tool["output"]) == ("increment_counter", "completed", '{"success":true}')
    assert tool["tool_call_id"] == rows[1]["response"]["output"][0]["call_id"]
    # example_session_state_mgmt's verify answers no `resolved`: said as a gap, not guessed
    assert record["gaps"] == [{"code": "resolution_unavailable", "invocation_id": "root", "detail": None}]
    perf = rows[1]["ng_perf"]
    assert perf["total_latency_ms"] > 0
    assert {k: v for k, v in perf.items() if k != "total_latency_ms"} == {
        "num_turns": 2,
        "num_tool_calls": 1,
        "token_observability_coverage": 1.0,
        "prompt_tokens": 2,
        "cached_prompt_tokens": 0,
        "completion_tokens": 2,
        "reasoning_tokens": 0,
    }


def test_a_failed_tool_call_and_a_run_out_of_steps_are_recorded(head, tmp_path):
    """Arguments that are not JSON: the tool call is `failed` (`invalid_arguments`), the episode goes on; an empty
    answer ends it: completed. Without observability, rows hold neither record nor perf."""
    rows = collect(head, tmp_path, [row(BAD_ARGUMENTS), row(HOLLOW)], observability_enabled=True)
    (tool,) = rows[0]["ng_trajectory"]["tool_calls"]
    assert (tool["status"], tool["error_type"]) == ("failed", "invalid_arguments")
    assert rows[0]["ng_trajectory"]["invocations"][0]["status"] == "completed"
    assert rows[1]["ng_trajectory"]["task_id"] == "1" and rows[1]["ng_trajectory"]["rollout_id"] == "1-0"
    plain = collect(head, tmp_path / "plain", [row(ADD_TWO)]) if (tmp_path / "plain").mkdir() is None else []
    assert "ng_trajectory" not in plain[0] and "ng_perf" not in plain[0] and plain[0]["reward"] == 1.0


def test_a_failed_rollout_keeps_its_capture_record_in_the_failures_file(head, tmp_path):
    """The model server fails the second call (500): the rollout is a failure, not a reward, and its failure record
    holds the capture record: the invocation failed with the failure class, the answered call and its turn, the tool
    call, the refused call with its status, the conversation as far as the refused call's input."""
    fails = [{"tool_calls": [{"name": "increment_counter", "arguments": {"count": 2}}]}, {"error_status": 500}]
    assert collect(head, tmp_path, [row(fails)], observability_enabled=True) == []
    (failure,) = read_jsonl(tmp_path / "rollouts_failures.jsonl")
    assert failure["failure_class"] == "http_error" and failure["failed_server"] == "policy_model"
    record = failure["ng_trajectory"]
    TrajectoryRecord.model_validate(record)
    (invocation,) = record["invocations"]
    assert (invocation["status"], invocation["error_type"]) == ("failed", "http_error")
    assert [c["response_metadata"]["status_code"] for c in record["model_calls"]] == [200, 500]
    assert len(record["turns"]) == 1 and [t["status"] for t in record["tool_calls"]] == ["completed"]
    assert [item["type"] for item in invocation["conversation"]] == ["message", "function_call", "function_call_output"]
    assert invocation["conversation"] == with_message_types(record["model_calls"][1]["request"]["input"])
    plain = collect(head, tmp_path / "plain", [row(fails)]) if (tmp_path / "plain").mkdir() is None else [0]
    (failure,) = read_jsonl(tmp_path / "plain" / "rollouts_failures.jsonl")
    assert plain == [] and failure["failure_class"] == "http_error" and "ng_trajectory" not in failure


def test_a_failed_verify_answer_keeps_the_trajectory_and_the_episodes_record():
    """A /verify that failed after the episode ran to its end: the typed failure answer carries the trajectory the
    verifier failed on and, captured, the episode's record (completed: the episode itself did not fail)."""
    capture = TrajectoryCapture.of_row("policy_model", {"task_id": "t"}, "0-0")
    answer = {"id": "r1", "output": [{"type": "message", "role": "assistant", "content": "hi"}]}
    capture.model_call({"input": [{"role": "user", "content": "q"}]}, answer, 1.0, 0.5)
    verify = ServerHTTPError("verify failed", status_code=500, body='{"detail": "boom"}', server="counter")
    given = {"responses_create_params": {"input": "q"}}
    reply = failed_run_answer(verify, capture, EndedEpisode(given, answer, StopReason.completed))
    error = json.loads(reply.body)["error"]
    assert reply.status_code == 502 and (error["type"], error["server"]) == ("http_error", "counter")
    assert error["response"] == answer and error["ng_trajectory"]["invocations"][0]["status"] == "completed"
    assert json.loads(failed_run_answer(verify, None, EndedEpisode(given, answer, StopReason.completed)).body)[
        "error"
    ].keys() == {
        "type",
        "server",
        "message",
        "response",
    }


def test_the_health_checks_run_after_a_captured_collection(head, tmp_path, capsys):
    """ng_collect_rollouts with +observability_enabled=true runs the rollout health checks after it, as 0.7.0's
    collector does: the reports beside the output and their line printed; +disable_health_check=true: neither."""
    (tmp_path / "in.jsonl").write_text(json.dumps(row(ADD_TWO)) + "\n" + json.dumps(row(HOLLOW)) + "\n")
    options = {"agent_name": "agent", "input_jsonl_fpath": str(tmp_path / "in.jsonl"), "head_server_url": head}
    options |= {"progress": False, "observability_enabled": True, "health_check_workers": 1}
    assert collect_main(CollectConfig(output_jsonl_fpath=str(tmp_path / "a" / "rollouts.jsonl"), **options)) == 0
    assert "Rollout health: 2 checked, 1 healthy, 1 unhealthy, 0 unobserved" in capsys.readouterr().out
    assert (tmp_path / "a" / "quality_summary.json").exists() and (tmp_path / "a" / "rollout_verdicts.jsonl").exists()
    off = CollectConfig(output_jsonl_fpath=str(tmp_path / "b" / "rollouts.jsonl"), disable_health_check=True, **options)
    assert collect_main(off) == 0 and "Rollout health" not in capsys.readouterr().out
    assert not (tmp_path / "b" / "quality_summary.json").exists()
    with pytest.raises(ValueError, match="Unknown rollout health check"):  # before any rollout
        CollectConfig(output_jsonl_fpath="x.jsonl", health_check_ignored_checks="hollow", **options)


@pytest.fixture(scope="module")
def gymnasium_head() -> Iterator[str]:
    """gymnasium_agent playing blackjack (a Gymnasium-style resources server) with scripted_model, as `agent`."""
    agent = {
        "resources_server": {"type": "resources_servers", "name": "blackjack"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    servers = {
        "blackjack": ("resources_servers", "resources_servers/blackjack", {}),
        "policy_model": ("responses_api_models", "responses_api_models/scripted_model", {}),
        "agent": ("responses_api_agents", "responses_api_agents/gymnasium_agent", agent),
    }
    with serve_registered(servers) as urls:
        yield urls["head"]


def test_gymnasium_agent_captures_its_episodes_too(gymnasium_head, tmp_path):
    """A blackjack hand, hit then stand: a turn per model call (the observations between them are the environment's
    answers, no tool calls), the invocation completed when the environment ended the hand; the health checks observe
    it (healthy), and ng_export_atif applies the record to every agent step."""
    script = json.dumps([{"text": "I will hit"}, {"text": "stand"}])
    given = [{"role": "system", "content": "Play blackjack. Reply hit or stand."}]
    hand = {"responses_create_params": {"input": given, "metadata": {"script": script}}, "seed": 1000}
    (rollout,) = collect(gymnasium_head, tmp_path, [hand | {"task_id": "blackjack-1000"}], observability_enabled=True)
    record = rollout["ng_trajectory"]
    TrajectoryRecord.model_validate(record)
    (invocation,) = record["invocations"]
    assert invocation["conversation"] == with_message_types([*given, *rollout["response"]["output"]])
    assert (record["task_id"], record["rollout_id"], invocation["status"]) == ("blackjack-1000", "0-0", "completed")
    assert [t["answer"][0]["content"][0]["text"] for t in record["turns"]] == ["I will hit", "stand"]
    assert [t["step_count"] for t in record["turns"]] == [0, 0] and record["tool_calls"] == []
    assert rollout["ng_perf"]["num_turns"] == 2 and rollout["stop_reason"] == "completed"
    (verdict,) = run_health_checks(tmp_path / "rollouts.jsonl", tmp_path / "health").rollouts
    assert (verdict.verdict, verdict.unobserved) == ("healthy", [])
    trajectory = rollout_to_atif(rollout, session_id="s", agent_version="1")
    assert [s.source for s in trajectory.steps] == ["system", "user", "agent", "user", "agent", "user"]
    assert [s.extra["nemo_gym"]["turn"]["turn_no"] for s in trajectory.steps if s.source == "agent"] == [1, 2]
    assert trajectory.extra["nemo_gym"]["conversion"]["status"] == "complete"


def test_a_bad_rollout_id_fails_that_rollout_naming_it(head, tmp_path):
    assert collect(head, tmp_path, [row(ADD_TWO, _ng_rollout_id="../x")], observability_enabled=True) == []
    (failure,) = read_jsonl(tmp_path / "rollouts_failures.jsonl")
    assert failure["failure_class"] == "bad_rollout_id" and "'../x'" in failure["message"]


def test_aggregate_metrics_get_the_rows_without_their_capture_record():
    """As 0.7.0's collector sends them: no request, no ng_trajectory; the response's usage and incomplete_details."""
    response = {"output": [{"type": "message"}], "usage": {"output_tokens": 3}, "incomplete_details": {"reason": "x"}}
    row = {"responses_create_params": {"input": "q"}, "response": response, "reward": 1.0}
    row |= {"ng_trajectory": {"invocations": []}, "ng_perf": {"num_turns": 1}}
    assert metrics_entry(row) == {
        "reward": 1.0,
        "ng_perf": {"num_turns": 1},
        "response": {"usage": {"output_tokens": 3}, "incomplete_details": {"reason": "x"}},
    }
    assert metrics_entry({"reward": 0.0, "response": {"output": []}}) == {"reward": 0.0}


MODEL_REF = {"type": "responses_api_models", "name": "policy_model"}


def perf_record() -> dict[str, Any]:
    """A capture record with an unambiguous reference by id, one by response, an ambiguous one, one to a call owned
    already, and an invocation without turns."""

    def call(call_id: str | None, response_id: str, tokens: int) -> dict[str, Any]:
        metadata = {"model_ref": MODEL_REF, "response_id": response_id}
        stats = {"prompt_tokens": tokens, "completion_tokens": 1}
        return {"model_call_id": call_id, "response_metadata": metadata, "token_stats": stats}

    return {
        "task_id": "t",
        "rollout_id": "0-0",
        "invocations": [
            {
                "invocation_id": "root",
                "model_calls": [{"model_call_id": "a"}, {"model_ref": MODEL_REF, "response_id": "r2"}],
            },
            # "r3" names two calls (ambiguous), "a" is owned already: this invocation owns nothing
            {
                "invocation_id": "sub",
                "model_calls": [{"model_ref": MODEL_REF, "response_id": "r3"}, {"model_call_id": "a"}],
            },
        ],
        "model_calls": [call("a", "r1", 10), call(None, "r2", 20), call(None, "r3", 40), call(None, "r3", 80)],
        "tool_calls": [
            {"invocation_id": "root", "tool_call_id": "c1"},
            {"invocation_id": "other", "tool_call_id": "c2"},
        ],
    }


def not_records() -> list[Any]:
    """What 0.7.0's collector gives no ng_perf: no invocation, not a record, a field the schema does not declare, two
    invocations with one id, a reference without a join key."""
    extra, twice, keyless = perf_record(), perf_record(), perf_record()
    extra["model_calls"][0]["surplus"] = 1
    twice["invocations"][1]["invocation_id"] = "root"
    keyless["invocations"][0]["model_calls"].append({"response_id": "r9"})
    return [{**perf_record(), "invocations": []}, "not a record", extra, twice, keyless]


def test_ng_perf_counts_only_calls_a_reference_resolves_to_once():
    """0.7.0's ownership rules: by model_call_id, else by (model_ref, response_id); an ambiguous reference owns
    nothing, a call is owned once, an invocation without turns counts its owned calls (else 1); a record that does
    not validate gets none."""
    assert ng_perf(perf_record(), 5.0) == {
        "num_turns": 3,  # root owns 2 calls, sub owns none: 1
        "num_tool_calls": 1,
        "token_observability_coverage": 2 / 3,
        "prompt_tokens": 30,
        "completion_tokens": 2,
        "total_latency_ms": 5.0,
    }
    assert [ng_perf(record) for record in not_records()] == [None] * 5


PEER_PERF = """
import json, sys
from nemo_gym.rollout_collection import _build_ng_perf
records = json.loads(sys.argv[1])
print(json.dumps([_build_ng_perf({"ng_trajectory": r}, rollout_latency_ms=5.0) for r in records]))
"""


@pytest.mark.peer
@pytest.mark.timeout(120)
def test_ng_perf_is_0_7_0s_on_records_it_takes_and_on_those_it_refuses(tmp_path):
    from nemo_gym_peer07 import peer07_json

    records = [perf_record(), *not_records()]
    assert peer07_json(PEER_PERF, json.dumps(records), cwd=tmp_path, timeout=100) == [
        ng_perf(record, 5.0) for record in records
    ]


def test_token_stats_read_both_apis_and_leave_unknown_counts_unknown():
    assert token_stats({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}) == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "reasoning_tokens": None,
        "total_tokens": 7,
        "cached_tokens": None,
    }
    assert set(token_stats(None).values()) == {None} and token_stats({"input_tokens": -1})["prompt_tokens"] is None


PEER_CHECKS = """
import json, sys
from pathlib import Path
from nemo_gym.rollout_observability import TrajectoryRecord
from nemo_gym.rollout_health import run_health_checks
from nemo_gym.rollout_collection import _build_ng_perf
from nemo_gym.atif_export import gym_rollout_to_atif
path, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = [json.loads(line) for line in path.read_text().splitlines()]
for row in rows:
    TrajectoryRecord.model_validate(row["ng_trajectory"])
result = run_health_checks(path, output_dir=out, workers=1)
perf = [_build_ng_perf(row, rollout_latency_ms=row["ng_perf"]["total_latency_ms"]) for row in rows]
exported = []
for row in rows:
    try:
        # strict export refuses any gap; ours is resolution_unavailable (the counter's verify answers no resolved),
        # which 0.7.0's own simple_agent writes for that verifier too
        assert [g["code"] for g in row["ng_trajectory"]["gaps"]] == ["resolution_unavailable"]
        strict = {**row, "ng_trajectory": {**row["ng_trajectory"], "gaps": []}}
        exported.append(gym_rollout_to_atif(strict, session_id="s", agent_version="1").model_dump(
            mode="json", exclude_none=True
        ))
    except Exception as exc:
        exported.append(f"{type(exc).__name__}: {exc}")
digests = [
    {"task": d.task_index, "verdict": d.verdict, "unobserved": d.unobserved, "findings": [f.check for f in d.findings]}
    for d in result.rollouts
]
print(json.dumps({"digests": digests, "perf": perf, "exported": exported}))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(300)
def test_0_7_0s_health_checks_ng_perf_and_atif_export_read_our_capture_records(head, tmp_path):
    from nemo_gym_peer07 import peer07_json

    rows = collect(head, tmp_path, [row(ADD_TWO), row(BAD_ARGUMENTS), row(HOLLOW)], observability_enabled=True)
    peer = peer07_json(
        PEER_CHECKS, str(tmp_path / "rollouts.jsonl"), str(tmp_path / "health"), cwd=tmp_path, timeout=240
    )
    digests = sorted(peer["digests"], key=lambda d: d["task"])
    # every rollout check observed; the two healthy rollouts healthy, the hollow one found hollow
    assert [d["unobserved"] for d in digests] == [[], [], []]
    assert [(d["verdict"], d["findings"]) for d in digests] == [
        ("healthy", []),
        ("healthy", []),
        ("unhealthy", ["agent_turn_hollow"]),
    ]
    ours = sorted(
        run_health_checks(tmp_path / "rollouts.jsonl", tmp_path / "ours").rollouts, key=lambda d: d.task_index
    )
    assert [(d.task_index, d.verdict, [f["check"] for f in d.findings], d.unobserved) for d in ours] == [
        (d["task"], d["verdict"], d["findings"], d["unobserved"]) for d in digests
    ]
    assert len(rows) == 3 and peer["perf"] == [r["ng_perf"] for r in read_jsonl(tmp_path / "rollouts.jsonl")]
    # 0.7.0's strict export refuses a failed tool execution (its own simple_agent records bad arguments as failed too)
    written = read_jsonl(tmp_path / "rollouts.jsonl")
    exported = dict(zip([r["_ng_task_index"] for r in written], peer["exported"]))
    assert "is 'failed', not completed" in exported[1], exported
    # ng_export_atif reads the record as 0.7.0's export does: the same trajectories, but for what ours adds (the
    # exporter's name, the request's tool definitions, the row's other fields, the record's gaps)
    for task in (0, 2):
        ours = rollout_to_atif(
            next(r for r in written if r["_ng_task_index"] == task), session_id="s", agent_version="1"
        )
        document = ours.to_json_dict(exclude_none=True)
        tool = {key: TOOLS[0][key] for key in ("name", "parameters")}
        assert document["agent"].pop("tool_definitions") == [{"type": "function", "function": tool}]
        added = {key: document["extra"]["nemo_gym"].pop(key) for key in ("exporter", "rollout", "gaps")}
        theirs = exported[task]
        assert theirs["extra"]["nemo_gym"].pop("exporter")["name"] == "nemo-gym" and added["gaps"]
        assert document == theirs
    # a failed tool call: 0.7.0 refuses the rollout, ours exports it and says how the call ended
    failed = rollout_to_atif(next(r for r in written if r["_ng_task_index"] == 1), session_id="s", agent_version="1")
    (result,) = failed.steps[1].observation.results
    assert (
        result.extra["nemo_gym"]["status"] == "failed"
        and failed.extra["nemo_gym"]["conversion"]["status"] == "complete"
    )
