"""`ng_health_check` (NeMo Gym 0.7.0's `gym eval health-check`, nemo_gym.collect.health): a verdict per rollout from its
`ng_trajectory` capture record, the task checks, the two reports.

The rollouts here are written by hand, one (or two) per rule: each check's finding, each reason a check is
unobserved, unreadable lines and records, duplicate lines, the task checks. Against 0.7.0 itself: its
`run_health_checks` on the same file writes the same `quality_summary.json` and `rollout_verdicts.jsonl`, with and
without ignored checks; on rollouts our collector captured: tests/test_trajectory_capture.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.collect.health import SUMMARY_FILE, VERDICTS_FILE, run_health_checks
from nemo_gym.common.errors import ConfigError

BIN = Path(sys.executable).parent
POLICY = {"type": "responses_api_models", "name": "policy_model"}
JUDGE = {"type": "responses_api_models", "name": "judge_model"}
MESSAGE = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "42"}]}
TOOL_CALL = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}


def call(call_id: str, *, model=POLICY, tokens=(1, 1), status=200, started=1.0, response: Any = "ok", **meta) -> dict:
    """A captured model call (`response="ok"`: an answer with one message)."""
    answer = {"id": f"resp-{call_id}", "output": [MESSAGE]} if response == "ok" else response
    return {
        "model_call_id": call_id,
        "started_at": started,
        "completed_at": started + 0.5,
        "duration_ms": 500.0,
        "request": {"input": "q"},
        "response": answer,
        "response_metadata": {"response_id": f"resp-{call_id}", "model_ref": model, "status_code": status, **meta},
        "token_stats": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }


def turn(n: int, refs: list[str], answer: Any = None, **extra: Any) -> dict:
    return {
        "invocation_id": "root",
        "task_id": "t",
        "rollout_id": "r",
        "turn_no": n,
        "timestamp": float(n),
        "answer": [MESSAGE] if answer is None else answer,
        "step_count": 0,
        "model_calls": [{"model_call_id": ref} for ref in refs],
        **extra,
    }


def rollout(task: Any, repeat: int, calls: list[dict], turns: list[dict], *, usage=None, gaps=(), **row) -> dict:
    """A rollout row with its capture record: the turns reference their calls; `usage` defaults to the calls' sums."""
    if usage is None:
        usage = {
            "input_tokens": sum(c["token_stats"].get("prompt_tokens") or 0 for c in calls),
            "output_tokens": sum(c["token_stats"].get("completion_tokens") or 0 for c in calls),
        }
    record = {
        "schema_version": "1.0",
        "task_id": "t",
        "rollout_id": "r",
        "invocations": [{"invocation_id": "root", "status": "completed", "model_calls": [], "conversation": []}],
        "turns": turns,
        "model_calls": calls,
        "tool_calls": [],
        "gaps": [{"code": code, "detail": detail} for code, detail in gaps],
    }
    return {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": 1.0, "response": {"usage": usage}} | {
        "ng_trajectory": record,
        **row,
    }


def healthy(task: Any, repeat: int, **row: Any) -> dict:
    return rollout(task, repeat, [call("a"), call("b", started=2.0)], [turn(1, ["a"]), turn(2, ["b"])], **row)


ROWS: list[Any] = [
    healthy(0, 0),
    healthy(0, 1),
    # task 1: both repeats have a hollow turn -> task_consistently_unhealthy
    rollout(1, 0, [call("a")], [turn(1, ["a"], answer=[{"type": "message", "content": [{"text": " "}]}])]),
    rollout(1, 1, [call("a")], [turn(1, ["a"], answer=[])]),
    # task 2: a later failed call of the policy that no turn references; a judge's failed call before a good one
    rollout(
        2,
        0,
        [call("a"), call("x", status=503, started=5.0, response=None, error_category="http_error")],
        [turn(1, ["a"])],
        usage={"input_tokens": 1, "output_tokens": 1},
    ),
    rollout(
        2,
        1,
        [call("a"), call("j1", model=JUDGE, status=500, response=None), call("j2", model=JUDGE, started=3.0)],
        [turn(1, ["a"])],
        usage={"input_tokens": 1, "output_tokens": 1},
    ),
    # task 3: every referenced call failed (answer status failed) -> model_call_failed, task_no_successful_model_calls
    rollout(3, 0, [call("a", response_status="failed")], [turn(1, ["a"])]),
    rollout(3, 1, [call("a", status=429)], [turn(1, ["a"])]),
    # task 4: zero completion tokens; missing token counts (token mismatch then unobserved); usage that disagrees
    rollout(4, 0, [call("a", tokens=(3, 0))], [turn(1, ["a"])]),
    rollout(4, 1, [{**call("a"), "token_stats": {}}], [turn(1, ["a"])]),
    rollout(4, 2, [call("a")], [turn(1, ["a"])], usage={"input_tokens": 100, "output_tokens": 1}),
    # task 5: a reference to no call, one by response id to two calls, a gap naming a conflict
    rollout(5, 0, [call("a")], [turn(1, ["a", "ghost"])]),
    rollout(
        5,
        1,
        [call("a"), {**call("b"), "response_metadata": call("a")["response_metadata"]}],
        [{**turn(1, []), "model_calls": [{"model_ref": POLICY, "response_id": "resp-a"}]}],
        gaps=[("model_call_reference_conflict", "call:zz")],
    ),
    # task 6: stopped on length with no content (runaway); with no answer at all (unobserved); chat choices' content
    rollout(6, 0, [call("a", finish_reason="length", response={"output": []})], [turn(1, ["a"])]),
    rollout(6, 1, [call("a", finish_reason="max_output_tokens", response=None)], [turn(1, ["a"])]),
    rollout(
        6,
        2,
        [call("a", finish_reason="length", response={"choices": [{"message": {"content": "x"}}]})],
        [turn(1, ["a"])],
    ),
    # task 7: no capture record; one that does not validate; gaps that hide turns, calls, the projection
    {"_ng_task_index": 7, "_ng_rollout_index": 0, "reward": 0.0, "response": {"usage": {}}},
    {**healthy(7, 1), "ng_trajectory": {"task_id": 7, "rollout_id": "r"}},
    rollout(7, 2, [call("a")], [turn(1, ["a"], answer=[])], gaps=[("turns_unavailable", None)]),
    rollout(7, 3, [call("a", status=500)], [turn(1, ["a"])], gaps=[("model_calls_unavailable", None)]),
    rollout(7, 4, [call("a", status=500)], [turn(1, [])], gaps=[("trajectory_projection_failed", "x")]),
    # task 8: a tool call turn without a message is not hollow; a turn only with reasoning is not either
    rollout(8, 0, [call("a")], [turn(1, ["a"], answer=[TOOL_CALL])]),
    rollout(8, 1, [call("a")], [turn(1, ["a"], answer=[], reasoning_content=[{"summary": [{"text": "hm"}]}])]),
    # task 9: the same rollout twice (a duplicate identity); a stage index; a string task index
    healthy(9, 0),
    healthy(9, 0),
    healthy(9, 1, stage_index=2),
    healthy("task-a", 0, _ng_rollout_id="custom-id"),
    # lines that are no rollout: not JSON, not an object; a row without indexes
    "{not json",
    "[1, 2]",
    {"reward": 1.0},
]


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n\n" for row in rows))
    return path


def verdicts(folder: Path) -> dict[tuple[Any, Any], tuple[str, list[str], list[str]]]:
    rows = [json.loads(line) for line in (folder / VERDICTS_FILE).read_text().splitlines()]
    return {
        (r["_ng_task_index"], r["_ng_rollout_index"]): (
            r["verdict"],
            [f["check"] for f in r["findings"]],
            r["unobserved"],
        )
        for r in rows
    }


def test_each_rule_gives_its_finding_or_leaves_its_check_unobserved(tmp_path):
    report = run_health_checks(write(tmp_path / "rollouts.jsonl", ROWS), workers=2)
    found = verdicts(tmp_path)
    assert found[(0, 0)] == ("healthy", [], [])
    # a blank text is no message; a turn that references its model call is still model activity
    assert found[(1, 0)] == found[(1, 1)] == ("unhealthy", ["agent_turn_hollow"], [])
    assert found[(2, 0)][:2] == ("unhealthy", ["rollout_ended_on_failed_model_call"])
    assert found[(2, 1)] == ("healthy", [], [])  # the judge's failed call was retried: its last call succeeded
    assert found[(3, 0)][:2] == ("unhealthy", ["rollout_ended_on_failed_model_call", "model_call_failed"])
    assert found[(4, 0)][1] == ["model_call_zero_completion_tokens"]
    assert found[(4, 1)][1:] == (["model_call_missing_token_counts"], ["rollout_token_count_mismatch"])
    assert found[(4, 2)][1] == ["rollout_token_count_mismatch"]
    assert found[(5, 0)][1:] == (["trajectory_capture_mismatch"], ["rollout_token_count_mismatch"])
    assert found[(5, 1)][1] == ["trajectory_capture_mismatch"] * 2  # the ambiguous reference and the conflict gap
    assert found[(6, 0)][1] == ["model_call_runaway_generation"]
    assert found[(6, 1)][2] == ["model_call_runaway_generation"] and found[(6, 2)] == ("healthy", [], [])
    assert found[(7, 0)][0] == "unobserved" and "record_unreadable" not in found[(7, 0)][2]
    assert found[(7, 1)][:2] == ("unhealthy", ["record_unreadable"])
    assert found[(7, 2)] == ("unobserved", [], ["rollout_missing_agent_turns", "agent_turn_hollow"])
    assert found[(7, 3)][0] == "unobserved" and "model_call_failed" in found[(7, 3)][2]
    assert found[(7, 4)] == found[(7, 0)] and len(found[(7, 4)][2]) == 9  # as if there were no capture record
    assert found[(8, 0)] == found[(8, 1)] == ("healthy", [], [])
    assert found[(9, 0)][:2] == ("unhealthy", ["rollout_duplicate_identity"]) and found[(9, 1)][0] == "healthy"
    # named by the file's line numbers (blank lines counted), every other check unobserved; no index: the line's place
    assert found[("__unreadable_record__:input-0:line-55", 0)][:2] == ("unhealthy", ["record_unreadable"])
    assert len(found[("__unreadable_record__:input-0:line-57", 0)][2]) == 11 and found[(29, 0)][0] == "unobserved"
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert summary["tasks"]["1"]["flags"] == ["task_consistently_unhealthy"]
    assert summary["tasks"]["3"]["flags"] == ["task_consistently_unhealthy", "task_no_successful_model_calls"]
    assert summary["run"]["verdicts"] == {"healthy": 8, "unhealthy": 16, "unobserved": 6}
    assert report.text().startswith("Rollout health: 30 checked, 8 healthy, 16 unhealthy, 6 unobserved")


def test_ignored_checks_are_left_out_and_bad_parameters_are_refused(tmp_path):
    path = write(tmp_path / "rollouts.jsonl", ROWS[:4])
    report = run_health_checks(path, tmp_path / "out", ignored_checks="agent_turn_hollow, task_consistently_unhealthy")
    assert report.summary["run"]["ignored_checks"] == ["agent_turn_hollow", "task_consistently_unhealthy"]
    assert report.summary["run"]["artifacts"]["coverage"]["agent_turn_hollow"] == {
        "evaluated": 0,
        "unobserved": 0,
        "ignored": 4,
    }
    assert verdicts(tmp_path / "out")[(1, 0)] == ("healthy", [], [])
    with pytest.raises(ConfigError, match=r"\+ignored_checks: Unknown rollout health check\(s\): hollow"):
        run_health_checks(path, ignored_checks=["hollow"])
    with pytest.raises(ConfigError, match="no such file"):
        run_health_checks(tmp_path / "missing.jsonl")
    # rollouts collected without capture: every check unobserved, and the report says how to get the records
    plain = write(
        tmp_path / "plain.jsonl", [{k: v for k, v in row.items() if k != "ng_trajectory"} for row in ROWS[:2]]
    )
    text = run_health_checks(plain, tmp_path / "plain").text()
    assert "0 healthy, 0 unhealthy, 2 unobserved\n" in text and "+observability_enabled=true" in text
    assert "+observability_enabled" not in report.text()


def test_the_commands_write_the_reports_where_told(tmp_path):
    write(tmp_path / "rollouts.jsonl", ROWS[:4])
    done = subprocess.run(
        [str(BIN / "gym"), "eval", "health-check", str(tmp_path), "--ignore", "agent_turn_hollow", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Rollout health: 4 checked, 4 healthy" in done.stdout and (tmp_path / SUMMARY_FILE).exists()
    done = subprocess.run(
        [str(BIN / "ng_health_check"), f"+rollouts_jsonl_fpath={tmp_path / 'rollouts.jsonl'}", "+json=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["run"]["verdicts"]["unhealthy"] == 2
    missing = subprocess.run(
        [str(BIN / "gym"), "eval", "health-check", str(tmp_path / "nowhere")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "run directory not found" in missing.stderr


PEER_HEALTH = """
import json, sys
from pathlib import Path
from nemo_gym.rollout_health import run_health_checks
run_health_checks(Path(sys.argv[1]), output_dir=Path(sys.argv[2]), workers=1, ignored_checks=json.loads(sys.argv[3]))
"""


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "ignored", [[], ["agent_turn_hollow", "rollout_duplicate_identity", "task_no_successful_model_calls"]]
)
def test_the_reports_are_0_7_0s(tmp_path, ignored):
    """Our reports and 0.7.0's `run_health_checks` on the same rollouts: the same summary and verdict lines."""
    from nemo_gym_peer07 import peer07_venv

    path = write(tmp_path / "rollouts.jsonl", ROWS)
    run_health_checks(path, tmp_path / "ours", ignored_checks=ignored)
    python = peer07_venv() / "bin" / "python"
    argv = [str(python), "-c", PEER_HEALTH, str(path), str(tmp_path / "theirs"), json.dumps(ignored)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (SUMMARY_FILE, VERDICTS_FILE):
        ours, theirs = (tmp_path / side / name for side in ("ours", "theirs"))
        if name == SUMMARY_FILE:
            assert json.loads(ours.read_text()) == json.loads(theirs.read_text())
        else:
            assert ours.read_text().splitlines() == theirs.read_text().splitlines()
