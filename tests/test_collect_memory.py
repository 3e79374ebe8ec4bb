"""The in-memory collector (`nemo_gym.collect.engine.collect`, as `ng_train` uses it): task rows in, rollouts and
failure records out, no file written unless a sink is given; with the files sink (`RolloutFiles`) the files are
those `ng_collect_rollouts` writes. Against the real agent and head servers on loopback of tests/test_collect.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_collect import FAST, agent, gym  # noqa: F401  (fixtures: the head server and the scoring agents)

from nemo_gym.collect.engine import collect
from nemo_gym.collect.files import OutputPaths
from nemo_gym.collect.sink import RolloutFiles
from nemo_gym.collect.tasks import read_tasks
from nemo_gym.common.errors import DataError, ServerError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.serving.client import ServerClient


def rows(n: int, **extra) -> list[dict]:
    return [{"responses_create_params": {"input": f"task {i}", "temperature": 0.0}, "x": i, **extra} for i in range(n)]


def run(gym: dict, task_rows: list[dict], **options):
    async def go():
        async with ServerClient(gym["head_url"], timeouts=FAST) as client:
            return await collect(task_rows, client, **options)

    return asyncio.run(go())


def pairs(records: list[dict]) -> list[tuple[int, int]]:
    return sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in records)


def test_rows_in_rollouts_and_failures_out_and_no_file_written(tmp_path, monkeypatch, gym, agent):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    agent.fail_tasks, agent.no_reward_tasks = {1}, {3}
    result = run(
        gym,
        rows(4),
        num_repeats=2,
        agent_name="agent",
        responses_create_params={"max_output_tokens": 16},
        concurrency=3,
    )

    assert pairs(result.rollouts) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    for row in result.rollouts:  # reward = x + rollout index / 10, the row and the verifier's fields merged
        assert row["reward"] == pytest.approx(row["x"] + row["_ng_rollout_index"] / 10)
        assert row["agent_ref"] == {"name": "agent"} and row["verifier_note"] == "ok"
        assert row["responses_create_params"] == {
            "input": f"task {row['x']}",
            "temperature": 0.0,
            "max_output_tokens": 16,
        }
    assert [(f["_ng_task_index"], f["_ng_rollout_index"], f["failure_class"]) for f in result.failures] == [
        (1, 0, "unavailable"),
        (1, 1, "unavailable"),
        (3, 0, "bad_verify_answer"),
        (3, 1, "bad_verify_answer"),
    ]
    assert "reward" not in result.failures[0] and result.failures[0]["failed_server"] == "policy_model"
    assert (result.rollouts_expected, result.rollouts_done, result.rollouts_resumed) == (8, 4, 0)
    assert result.failures_by_class == {"unavailable": 2, "bad_verify_answer": 2}
    assert result.mean_reward == pytest.approx((0 + 0.1 + 2 + 2.1) / 4)  # failures are not zeros
    assert agent.max_in_flight <= 3
    assert list(tmp_path.iterdir()) == []  # no sink: nothing on disk


def test_a_bad_row_in_memory_is_named_before_any_rollout(gym, agent):  # noqa: F811
    with pytest.raises(DataError, match=r"row 1: needs a `responses_create_params` object \(got str\)"):
        run(gym, [rows(1)[0], {"responses_create_params": "hi"}], agent_name="agent")
    with pytest.raises(DataError, match=r"tasks\.jsonl:7: row has no agent_ref"):
        run(gym, rows(1), where=lambda i: f"tasks.jsonl:{i + 7}")
    with pytest.raises(ServerError, match="'nobody' is not registered"):
        run(gym, rows(2), agent_name="nobody")
    assert not agent.calls


def test_a_rows_own_agent_wins_and_index_keys_are_replaced(gym, agent):  # noqa: F811
    task_rows = [{**rows(1)[0], "agent_ref": {"name": "metrics_agent"}, "_ng_task_index": 9}, rows(2)[1]]
    result = run(gym, task_rows, agent_name="agent")
    by_task = {row["_ng_task_index"]: row for row in result.rollouts}
    assert by_task[0]["agent_ref"] == {"name": "metrics_agent"} and by_task[1]["agent_ref"] == {"name": "agent"}
    assert set(agent.calls) == {(1, 0)} and set(gym["metrics_agent"].calls) == {(0, 0)}


def test_files_sink_writes_what_the_cli_writes(tmp_path, gym, agent):  # noqa: F811
    agent.fail_tasks = {2}
    out = tmp_path / "rollouts" / "step_000001.jsonl"
    result = run(
        gym,
        rows(3),
        num_repeats=2,
        agent_name="agent",
        sinks=[RolloutFiles(out, resume=False, input_jsonl_fpath="tasks.jsonl")],
    )

    paths = OutputPaths.for_output(out)
    assert read_jsonl(out) == result.rollouts  # the same rows, in completion order
    assert read_jsonl(paths.failures) == result.failures and pairs(result.failures) == [(2, 0), (2, 1)]
    assert pairs(read_jsonl(paths.materialized_inputs)) == [(t, r) for t in range(3) for r in range(2)]
    state = json.loads(paths.state.read_text())
    assert (state["input_jsonl_fpath"], state["num_tasks"], state["num_repeats"]) == ("tasks.jsonl", 3, 2)
    metrics = json.loads(paths.aggregate_metrics.read_text())
    assert metrics["collection"]["rollouts_done"] == 4 and metrics["collection"]["failures_by_class"] == {
        "unavailable": 2
    }

    agent.fail_tasks = set()
    old = out.read_bytes()
    again = run(
        gym,
        rows(3),
        num_repeats=2,
        agent_name="agent",
        sinks=[RolloutFiles(out, resume=False, input_jsonl_fpath="tasks.jsonl")],
    )
    assert len(again.rollouts) == 6 and not again.failures and not paths.failures.exists()
    assert Path(str(out) + ".bak").read_bytes() == old  # resume=False: the earlier files are moved aside


def test_read_tasks_names_file_and_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"responses_create_params": {"input": "a"}, "_ng_task_index": 4}\n\n{"responses_create_params": {"input":'
        ' "b"}, "agent_ref": {"name": "other"}}\n'
    )
    tasks = read_tasks(str(path), agent_name="agent", responses_create_params={"temperature": 0.5})
    assert tasks == [
        {"responses_create_params": {"input": "a", "temperature": 0.5}, "agent_ref": {"name": "agent"}},
        {"responses_create_params": {"input": "b", "temperature": 0.5}, "agent_ref": {"name": "other"}},
    ]
    assert read_tasks(str(path), agent_name="agent", limit=1) == [
        {"responses_create_params": {"input": "a"}, "agent_ref": {"name": "agent"}}
    ]
    path.write_text(
        '{"responses_create_params": {"input": "a"}}\n{"responses_create_params": {"input": "b", "bogus_key": 1}}\n'
    )
    with pytest.raises(DataError, match=r"tasks\.jsonl:2: responses_create_params: .*bogus_key"):
        read_tasks(str(path), agent_name="agent")


def test_trainer_rollouts_come_from_memory_and_leave_the_step_files(tmp_path, gym, agent):  # noqa: F811
    """ng_train's rollouts (`nemo_gym.train.gym_connection.GymConnection.collect`, attached to the head server):
    returned in memory, with the step's files under `output_dir/rollouts/` written as they were before (tasks, rollouts,
    side files).
    """
    pytest.importorskip("torch")
    from nemo_gym.train.config import TrainerConfig
    from nemo_gym.train.gym_connection import GymConnection

    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(row) + "\n" for row in rows(3)))
    cfg = TrainerConfig.model_validate(
        {
            "input_jsonl_fpath": str(tasks_path),
            "agent_name": "agent",
            "output_dir": str(tmp_path / "out"),
            "head_server_url": gym["head_url"],
            "batch_size": 3,
            "engine": {"model_path": "unused"},
            "responses_create_params": {"max_output_tokens": 8},
        }
    )
    (tmp_path / "out").mkdir()  # made by the training loop
    gym_connection = GymConnection(cfg, [], tmp_path / "out")
    agent.fail_tasks = {2}
    batch = gym_connection.batch(0)
    rollouts = gym_connection.collect(batch, 2, "step_000001")

    folder = tmp_path / "out" / "rollouts"
    assert read_jsonl(folder / "step_000001_tasks.jsonl") == batch  # the tasks sent, materialized at load time
    assert all(
        task["responses_create_params"]["max_output_tokens"] == 8 and task["agent_ref"] == {"name": "agent"}
        for task in batch
    )
    assert read_jsonl(folder / "step_000001.jsonl") == rollouts
    expected = [(t, r) for t, task in enumerate(batch) if task["x"] != 2 for r in range(2)]
    assert pairs(rollouts) == expected
    paths = OutputPaths.for_output(folder / "step_000001.jsonl")
    assert pairs(read_jsonl(paths.failures)) == [
        (t, r) for t, task in enumerate(batch) if task["x"] == 2 for r in range(2)
    ]
    assert json.loads(paths.state.read_text())["input_jsonl_fpath"] == str(folder / "step_000001_tasks.jsonl")
    assert json.loads(paths.aggregate_metrics.read_text())["collection"]["rollouts_done"] == len(expected)

    evaluated = gym_connection.collect(batch[:1], 1, "eval_step_000000", {"temperature": 0.9})
    assert evaluated[0]["responses_create_params"]["temperature"] == 0.9  # the evaluation's overrides win
    gym_connection.close()
