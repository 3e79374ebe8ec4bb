"""Reward profiling: worked examples with hand-computed numbers, NeMo Gym's output shape, real peer rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.collect.profile import ProfileConfig, profile_main, profile_rollouts, reward_stats
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.metrics import describe

PEER = Path(__file__).resolve().parent.parent.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
MULTIREWARD_ROLLOUTS = PEER / "example_tool_call_multireward" / "data" / "example_rollouts.jsonl"

# The per-task fields of NeMo Gym's collector-side profile before 0.4.0 (besides the task row and its
# `task_name`), with the numbers of 0.4.0's ng_reward_profile; see the nemo_gym.collect.profile module docstring.
NEMO_GYM_PROFILE_FIELDS = {"avg_reward", "std_reward", "min_reward", "max_reward", "total_samples", "median_reward"}
NEMO_GYM_PASS_FIELDS = {"pass_rate", "pass_rate_total", "pass_rate_passed", "pass_threshold"}


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rollout(task: int, index: int, reward: float, agent: str = "agent_a", **extra) -> dict:
    return {
        "responses_create_params": {"input": "q"},
        "_ng_task_index": task,
        "_ng_rollout_index": index,
        "reward": reward,
        "agent_ref": {"name": agent},
        **extra,
    }


@pytest.fixture
def worked(tmp_path):
    """3 tasks; task 0 has rewards [1, 0, 1, 1], task 1 has [0.2, 0.4], task 2 has none."""
    tasks = [
        {"responses_create_params": {"input": "t0"}, "expected_answer": "A", "dataset": "mcqa"},
        {"responses_create_params": {"input": "t1"}, "expected_answer": "B", "dataset": "math"},
        {"responses_create_params": {"input": "t2"}, "expected_answer": "C", "dataset": "math"},
    ]
    rollouts = [
        rollout(0, 0, 1.0),
        rollout(1, 0, 0.2, agent="agent_b"),
        rollout(0, 1, 0.0),
        rollout(0, 2, 1),
        rollout(1, 1, 0.4, agent="agent_b"),
        rollout(0, 3, 1.0),
    ]
    return (
        write_jsonl(tmp_path / "tasks.jsonl", tasks),
        write_jsonl(tmp_path / "rollouts.jsonl", rollouts),
        str(tmp_path / "profile.jsonl"),
    )


def test_worked_example_without_threshold(worked):
    tasks, rollouts, out = worked
    summary = profile_rollouts(tasks, rollouts, out)
    rows = read_jsonl(out)

    assert [r["expected_answer"] for r in rows] == ["A", "B"]  # task 2 has no rollouts: omitted
    t0, t1 = rows
    # task 0: mean (1+0+1+1)/4 = 0.75; sample variance ((0.25^2)*3 + 0.75^2)/(4-1) = (0.1875 + 0.5625)/3 = 0.25
    # → std sqrt(0.25) = 0.5 (the population std, /4, would be 0.4330); median of [0, 1, 1, 1] = (1 + 1)/2 = 1
    assert t0["avg_reward"] == pytest.approx(0.75)
    assert t0["std_reward"] == pytest.approx(0.5, abs=1e-12)
    assert (t0["min_reward"], t0["max_reward"], t0["median_reward"], t0["total_samples"]) == (0.0, 1.0, 1.0, 4)
    # task 1: mean (0.2+0.4)/2 = 0.3; sample std sqrt((0.1^2 + 0.1^2)/(2-1)) = sqrt(0.02) = 0.1414214 (population: 0.1)
    assert t1["avg_reward"] == pytest.approx(0.3)
    assert t1["std_reward"] == pytest.approx(0.1414214, abs=1e-7)
    assert t1["median_reward"] == pytest.approx(0.3)
    assert t0["responses_create_params"] == {"input": "t0"} and t0["dataset"] == "mcqa"
    assert not any(k.startswith("_ng_") or k in NEMO_GYM_PASS_FIELDS for r in rows for k in r)

    assert (summary.tasks, summary.tasks_profiled, summary.tasks_without_rollouts, summary.samples) == (3, 2, [2], 6)
    # mean over the 6 samples: (1+0+1+1+0.2+0.4)/6 = 3.6/6 = 0.6
    assert summary.mean_reward == pytest.approx(0.6)
    assert summary.pass_rate is None and summary.tasks_all_same_reward == 0
    assert summary.group_mean_reward == pytest.approx(
        {"agent:agent_a": 0.75, "agent:agent_b": 0.3, "dataset:mcqa": 0.75, "dataset:math": 0.3}
    )


def test_worked_example_with_pass_threshold(worked, capsys):
    tasks, rollouts, out = worked
    assert (
        profile_main(
            ProfileConfig(
                input_jsonl_fpath=tasks, rollouts_jsonl_fpath=rollouts, output_jsonl_fpath=out, pass_threshold=0.4
            )
        )
        == 0
    )
    t0, t1 = read_jsonl(out)
    # task 0: 3 of [1, 0, 1, 1] are >= 0.4 → 3/4; task 1: only 0.4 of [0.2, 0.4] is >= 0.4 (inclusive) → 1/2
    assert {k: t0[k] for k in NEMO_GYM_PASS_FIELDS} == {
        "pass_rate": 0.75,
        "pass_rate_total": 4,
        "pass_rate_passed": 3,
        "pass_threshold": 0.4,
    }
    assert {k: t1[k] for k in NEMO_GYM_PASS_FIELDS} == {
        "pass_rate": 0.5,
        "pass_rate_total": 2,
        "pass_rate_passed": 1,
        "pass_threshold": 0.4,
    }
    printed = capsys.readouterr().out
    # all samples: 4 of 6 pass → 0.6667
    assert "Tasks: 2/3 profiled, 6 samples, mean reward 0.6000" in printed
    assert "Pass rate (reward >= 0.4): 0.6667 of samples" in printed
    assert "agent:agent_b: mean reward 0.3000" in printed and "dataset:mcqa: mean reward 0.7500" in printed
    assert "Tasks without rollouts (omitted from the output): 1: 2" in printed


def test_output_shape_matches_nemo_gym(worked):
    tasks, rollouts, out = worked
    profile_rollouts(tasks, rollouts, out, pass_threshold=1.0)
    task_fields = {"responses_create_params", "expected_answer", "dataset"}
    for row in read_jsonl(out):
        assert set(row) == task_fields | NEMO_GYM_PROFILE_FIELDS | NEMO_GYM_PASS_FIELDS
        assert isinstance(row["total_samples"], int) and isinstance(row["pass_rate_passed"], int)


def test_std_reward_is_the_sample_std_as_nemo_gym():
    """NeMo Gym 0.4.0's profiler (pandas `DataFrame.std`, ddof=1) gives 0.7071 for [1, 0], not 0.5."""
    # [1, 0]: mean 0.5; squared deviations 0.25 + 0.25 = 0.5; / (n - 1 = 1) = 0.5; sqrt(0.5) = 0.7071068
    assert reward_stats([1.0, 0.0])["std_reward"] == pytest.approx(0.7071068, abs=1e-7)
    # [-1, 1, -1, 1, 1] (NeMo Gym's blackjack example rollouts, one task): mean 0.2; squared deviations
    # 1.44 + 0.64 + 1.44 + 0.64 + 0.64 = 4.8; / 4 = 1.2; sqrt(1.2) = 1.0954451 (what NeMo Gym writes as std/reward)
    assert describe([-1.0, 1.0, -1.0, 1.0, 1.0]) == pytest.approx(
        {"mean": 0.2, "max": 1.0, "min": -1.0, "median": 1.0, "std": 1.0954451}, abs=1e-7
    )
    # all equal: no spread, exactly 0 (the tasks trainer.filter.min_std_reward drops)
    assert describe([0.1, 0.1, 0.1])["std"] == 0.0


def test_reward_stats_single_sample_has_zero_std():
    assert reward_stats([0.5], pass_threshold=0.5) == {
        "avg_reward": 0.5,
        "std_reward": 0.0,
        "min_reward": 0.5,
        "max_reward": 0.5,
        "median_reward": 0.5,
        "total_samples": 1,
        "pass_rate": 1.0,
        "pass_rate_total": 1,
        "pass_rate_passed": 1,
        "pass_threshold": 0.5,
    }


def test_materialized_inputs_as_task_file(tmp_path):
    """The collector's _materialized_inputs.jsonl (one row per rollout) works as the task file."""
    materialized = [
        {"responses_create_params": {}, "q": t, "_ng_task_index": t, "_ng_rollout_index": r}
        for t in range(2)
        for r in range(2)
    ]
    tasks = write_jsonl(tmp_path / "m.jsonl", materialized)
    rollouts = write_jsonl(tmp_path / "r.jsonl", [rollout(t, r, float(t)) for t in range(2) for r in range(2)])
    summary = profile_rollouts(tasks, rollouts, str(tmp_path / "p.jsonl"))
    rows = read_jsonl(tmp_path / "p.jsonl")
    assert [(r["q"], r["avg_reward"], r["total_samples"]) for r in rows] == [(0, 0.0, 2), (1, 1.0, 2)]
    assert summary.tasks == 2 and summary.tasks_all_same_reward == 2


@pytest.mark.parametrize(
    ("bad_rollout", "message"),
    [
        ({"_ng_task_index": 0, "reward": None}, r"r\.jsonl:2: rollout has no numeric reward \(got None\)"),
        ({"_ng_task_index": 0, "reward": True}, r"r\.jsonl:2: rollout has no numeric reward"),
        ({"_ng_task_index": 5, "reward": 1.0}, r"r\.jsonl:2: _ng_task_index=5 is not a task of the input \(1 tasks\)"),
        ({"reward": 1.0}, r"r\.jsonl:2: rollout has no integer _ng_task_index"),
    ],
)
def test_bad_rollouts_name_file_and_line(tmp_path, bad_rollout, message):
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"responses_create_params": {}}])
    rollouts = write_jsonl(tmp_path / "r.jsonl", [rollout(0, 0, 1.0), bad_rollout])
    with pytest.raises(DataError, match=message):
        profile_rollouts(tasks, rollouts, str(tmp_path / "p.jsonl"))
    assert not (tmp_path / "p.jsonl").exists()


def test_peer_nemo_gym_rollouts(tmp_path):
    """NeMo Gym's own rollouts (example_tool_call_multireward: 5 tasks, one rollout each, reward 2.0 = sum of
    reward_components correctness 1 + schema_valid 1 + format 0). The task file is rebuilt from the rollouts'
    task fields, in task-index order."""
    peer_rollouts = read_jsonl(MULTIREWARD_ROLLOUTS)
    by_index = {r["_ng_task_index"]: r for r in peer_rollouts}
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"responses_create_params": by_index[i]["responses_create_params"], "agent_ref": by_index[i]["agent_ref"]}
            for i in range(5)
        ],
    )

    summary = profile_rollouts(tasks, str(MULTIREWARD_ROLLOUTS), str(tmp_path / "profile.jsonl"), pass_threshold=1.0)

    rows = read_jsonl(tmp_path / "profile.jsonl")
    assert len(rows) == 5 and summary.tasks_without_rollouts == []
    for i, row in enumerate(rows):
        assert row["responses_create_params"] == by_index[i]["responses_create_params"]
        assert (row["avg_reward"], row["std_reward"], row["min_reward"], row["max_reward"], row["total_samples"]) == (
            2.0,
            0.0,
            2.0,
            2.0,
            1,
        )
        assert (row["pass_rate"], row["pass_rate_passed"], row["pass_rate_total"]) == (1.0, 1, 1)
    assert summary.mean_reward == 2.0 and summary.pass_rate == 1.0 and summary.tasks_all_same_reward == 5
    assert summary.group_mean_reward == {"agent:example_tool_call_multireward_simple_agent": 2.0}


def test_masked_rollouts_are_left_out_of_the_statistics_and_counted(tmp_path, capsys):
    """NeMo Gym 0.7.0's `mask_sample: true` (a judge that failed: reward 0.0 that measures nothing) is left out of every
    statistic, as 0.7.0's reward_profile.select_measured does, and counted per task, by failure_kind, and as fully
    masked tasks. Task 0: [1, 0, masked 0.0, 1, 0 with a failure_kind but unmasked] -> mean 2/4 over 4 samples (2/5
    if the masked 0.0 counted); task 1: every rollout masked -> omitted and listed; task 2: no rollouts."""
    tasks = [{"responses_create_params": {"input": f"t{i}"}} for i in range(3)]
    judge_failed = {"mask_sample": True, "failure_kind": "judge_failed"}
    rollouts = [
        rollout(0, 0, 1.0),
        rollout(0, 1, 0.0),
        rollout(0, 2, 0.0, **judge_failed),
        rollout(0, 3, 1.0),
        rollout(1, 0, 0.0, **judge_failed),
        rollout(1, 1, None, mask_sample=True),  # a masked rollout's reward need not be a number
        rollout(0, 4, 0.0, mask_sample=False, failure_kind="judge_failed"),  # named, not masked: measured
    ]
    paths = write_jsonl(tmp_path / "t.jsonl", tasks), write_jsonl(tmp_path / "r.jsonl", rollouts)
    summary = profile_rollouts(*paths, str(tmp_path / "p.jsonl"), pass_threshold=1.0)
    [row] = read_jsonl(tmp_path / "p.jsonl")
    assert row["avg_reward"] == pytest.approx(2 / 4) and row["total_samples"] == 4 and row["masked_samples"] == 1
    assert (row["pass_rate_passed"], row["pass_rate_total"]) == (2, 4)
    assert (summary.samples, summary.masked_samples, summary.masked_reasons) == (
        4,
        3,
        {"judge_failed": 2, "unspecified": 1},
    )
    assert (summary.tasks_profiled, summary.tasks_fully_masked, summary.tasks_without_rollouts) == (1, [1], [2])
    assert summary.mean_reward == pytest.approx(0.5)
    text = summary.format()
    assert "left out of the statistics: 3 (judge_failed: 2, unspecified: 1)" in text
    assert "Tasks whose rollouts were all masked (omitted from the output): 1: 1" in text
    assert "Tasks without rollouts (omitted from the output): 1: 2" in text
    # without masks the row has no masked_samples field (NeMo Gym's shape unchanged)
    plain = write_jsonl(tmp_path / "plain.jsonl", [rollout(0, 0, 1.0)])
    profile_rollouts(paths[0], plain, str(tmp_path / "p2.jsonl"))
    assert "masked_samples" not in read_jsonl(tmp_path / "p2.jsonl")[0]


def test_a_task_sent_to_several_agents_has_a_row_per_agent(tmp_path):
    """`+fan_out`: task 0 ran through agent_a ([1, 0]) and agent_b ([1, 1], one more masked); task 1 through agent_a
    ([0.5]) and agent_b (one rollout, masked). Each gets a row per agent with rollouts, its `agent_ref` that agent's,
    its statistics over that agent's rollouts only (task 0: agent_a mean 0.5, sample std sqrt(0.5) = 0.7071068;
    agent_b mean 1.0, 1 masked; task 1: agent_a's row only, agent_b's masked rollout not counted in it)."""
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"responses_create_params": {"input": f"t{i}"}} for i in (0, 1)])
    rollouts = [
        rollout(0, 0, 1.0),
        rollout(0, 1, 0.0),
        rollout(0, 2, 1.0, agent="agent_b"),
        rollout(0, 3, 1.0, agent="agent_b"),
        rollout(0, 4, 0.0, agent="agent_b", mask_sample=True, failure_kind="judge_failed"),
        rollout(1, 0, 0.5),
        rollout(1, 1, 0.0, agent="agent_b", mask_sample=True, failure_kind="judge_failed"),
    ]
    out = str(tmp_path / "profile.jsonl")
    summary = profile_rollouts(tasks, write_jsonl(tmp_path / "rollouts.jsonl", rollouts), out)
    a, b, t1 = read_jsonl(out)
    assert [r["agent_ref"] for r in (a, b)] == [{"name": "agent_a"}, {"name": "agent_b"}]
    assert a["responses_create_params"] == b["responses_create_params"] == {"input": "t0"}
    assert (a["avg_reward"], a["total_samples"], a["std_reward"]) == (0.5, 2, pytest.approx(0.7071068, abs=1e-7))
    assert (b["avg_reward"], b["total_samples"], b["masked_samples"]) == (1.0, 2, 1) and "masked_samples" not in a
    # task 1 ran through agent_b too, whose one rollout was masked: agent_a's row only, none of agent_b's counted in it
    assert t1["agent_ref"] == {"name": "agent_a"} and t1["avg_reward"] == 0.5 and "masked_samples" not in t1
    # the rows' groups: agent_b's and task 1's have one reward each (no learning signal), agent_a's does not
    assert (summary.tasks_profiled, summary.samples, summary.tasks_all_same_reward) == (2, 5, 2)
    assert summary.masked_samples == 2 and summary.group_mean_reward["agent:agent_b"] == 1.0
