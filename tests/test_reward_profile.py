"""ng_reward_profile (NeMo Gym's command and output shape): a worked example with hand-computed numbers in 0.4.0's
output and in 0.7.0's (repeat-level metrics, across-repeats keys, masked rollouts and their coverage keys), partial
collections, bad input named by file:line, the command line. Runs against NeMo Gym itself are in
test_reward_profile_parity.py (0.4.0) and test_nemo_gym07.py (0.7.0)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.collect.profile import profile_rollouts
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.metrics import numeric_fields
from nemo_gym.upstream.repeat_metrics import t_interval_95
from nemo_gym.upstream.reward_profile import (
    RewardProfileConfig,
    output_paths,
    repeat_level_metrics_path,
    reward_profile,
    reward_profile_main,
)

BIN = Path(sys.executable).parent
STATS = ("mean", "max", "min", "median", "std")


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def materialized(task: int, rollout: int, agent: str) -> dict:
    return {
        "responses_create_params": {"input": f"t{task}"},
        "difficulty": task,
        "agent_ref": {"name": agent},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


def rollout(task: int, index: int, reward: float, correct: bool, tokens: tuple[int, int], agent: str, **extra) -> dict:
    usage = {
        "input_tokens": tokens[0],
        "output_tokens": tokens[1],
        "total_tokens": sum(tokens),
        "input_tokens_details": {"cached_tokens": 0},
    }
    row = materialized(task, index, agent)
    return {
        **row,
        "response": {"output": [], "usage": usage},
        "reward": reward,
        "correct": correct,
        "verdict": "ok",
        **extra,
    }


@pytest.fixture
def worked(tmp_path):
    """Task 0 (agent_a): 2 rollouts, rewards [1, 0]; task 1 (agent_b): 1 of 2 rollouts; task 2 (agent_a): none."""
    inputs = [
        materialized(0, 0, "agent_a"),
        materialized(0, 1, "agent_a"),
        materialized(1, 0, "agent_b"),
        materialized(1, 1, "agent_b"),
    ]
    inputs += [materialized(2, 0, "agent_a"), materialized(2, 1, "agent_a")]
    rollouts = [  # in completion order, as a collector writes them
        rollout(1, 0, 0.5, False, (20, 2), "agent_b"),
        rollout(0, 1, 0.0, False, (12, 6), "agent_a"),
        rollout(0, 0, 1.0, True, (10, 4), "agent_a", judge_score=0.5),  # judge_score: in one rollout of task 0 only
    ]
    return RewardProfileConfig(
        materialized_inputs_jsonl_fpath=write_jsonl(tmp_path / "r_materialized_inputs.jsonl", inputs),
        rollouts_jsonl_fpath=write_jsonl(tmp_path / "r.jsonl", rollouts),
        allow_partial_rollouts=True,
        nemo_gym_version="0.4.0",
    )


def test_numeric_fields_of_a_rollout():
    row = rollout(0, 1, 0.0, True, (12, 6), "a", judge_score=0.5, name="x", components={"f": 1.0})
    # top-level numbers and booleans (True → 1) with response.usage's numbers merged over them; no indices, strings or
    # dicts
    assert numeric_fields(row) == {
        "difficulty": 0,
        "reward": 0.0,
        "correct": 1,
        "judge_score": 0.5,
        "input_tokens": 12,
        "output_tokens": 6,
        "total_tokens": 18,
    }


def test_worked_example(worked, capsys):
    assert reward_profile_main(worked) == 0
    profiling, agents = output_paths(worked.rollouts_jsonl_fpath)
    assert (profiling.name, agents.name) == ("r_reward_profiling.jsonl", "r_agent_metrics.json")
    t0, t1 = read_jsonl(profiling)  # task 2 has no rollouts: dropped

    # task 0, rewards [1, 0]: mean 0.5; sample std sqrt(((1-0.5)^2 + (0-0.5)^2) / (2-1)) = sqrt(0.5) = 0.7071068
    # (NeMo Gym's std; the population std would be 0.5); median (0+1)/2 = 0.5. correct [1, 0]: the same numbers.
    # input_tokens [10, 12]: mean 11, std sqrt((1 + 1)/1) = 1.4142136; output [4, 6]: mean 5, std 1.4142136;
    # total [14, 18]: mean 16, std sqrt((4 + 4)/1) = 2.8284271; difficulty [0, 0]: 0, std 0.
    expected = {
        "reward": (0.5, 1.0, 0.0, 0.5, 0.7071068),
        "correct": (0.5, 1.0, 0.0, 0.5, 0.7071068),
        "difficulty": (0.0, 0.0, 0.0, 0.0, 0.0),
        "input_tokens": (11.0, 12.0, 10.0, 11.0, 1.4142136),
        "output_tokens": (5.0, 6.0, 4.0, 5.0, 1.4142136),
        "total_tokens": (16.0, 18.0, 14.0, 16.0, 2.8284271),
    }
    for field, values in expected.items():
        assert [t0[f"{stat}/{field}"] for stat in STATS] == pytest.approx(values, abs=1e-7), field
    # judge_score: one value among two rollouts → mean/max/min/median 0.5 and no std (pandas: NaN, left out)
    assert [t0.get(f"{stat}/judge_score") for stat in STATS] == [0.5, 0.5, 0.5, 0.5, None]
    assert all(isinstance(v, float) for k, v in t0.items() if "/" in k)  # 12 tokens is written 12.0, as NeMo Gym
    assert t0["sample"] == {
        "responses_create_params": {"input": "t0"},
        "difficulty": 0,
        "agent_ref": {"name": "agent_a"},
    }
    assert (
        t0["_ng_task_index"],
        t0["num_rollouts"],
        t0["expected_num_rollouts"],
        t0["missing_num_rollouts"],
        t0["reward_profile_completion_pct"],
    ) == (0, 2, 2, 0, 100.0)
    assert t0["rollout_infos"] == [
        {
            "rollout_id": "0:0",
            "_ng_task_index": 0,
            "_ng_rollout_index": 0,
            "reward": 1.0,
            "input_tokens": 10,
            "output_tokens": 4,
            "total_tokens": 14,
            "difficulty": 0,
            "correct": 1,
            "judge_score": 0.5,
        },
        {
            "rollout_id": "0:1",
            "_ng_task_index": 0,
            "_ng_rollout_index": 1,
            "reward": 0.0,
            "input_tokens": 12,
            "output_tokens": 6,
            "total_tokens": 18,
            "difficulty": 0,
            "correct": 0,
        },
    ]

    # task 1: one of its two rollouts; a group of one rollout has std 0 for every field (NeMo Gym fills NaN with 0)
    assert (
        t1["num_rollouts"],
        t1["expected_num_rollouts"],
        t1["missing_num_rollouts"],
        t1["reward_profile_completion_pct"],
    ) == (1, 2, 1, 50.0)
    assert (t1["mean/reward"], t1["std/reward"], t1["std/input_tokens"], t1["median/total_tokens"]) == (
        0.5,
        0.0,
        0.0,
        22.0,
    )
    assert "judge_score" not in " ".join(t1)

    agent_a, agent_b = json.loads(agents.read_text())
    assert agent_a["agent_ref"] == {"name": "agent_a"} and agent_b["agent_ref"] == {"name": "agent_b"}
    assert {k: v for k, v in agent_a.items() if k != "agent_ref"} == {
        k: v for k, v in t0.items() if "/" in k
    }  # agent_a's rollouts are task 0's
    assert agent_b["std/reward"] == 0.0 and agent_b["mean/output_tokens"] == 2.0

    printed = capsys.readouterr().out
    assert "Reward profile completion: 3/6 rollout rows (50.00%)" in printed
    assert "Input rows: 3 total; 1 complete; 1 partial; 1 without rollouts dropped from output." in printed


def test_same_reward_numbers_as_ng_profile(worked, tmp_path):
    """ng_profile on the same files (the materialized inputs as its task file) gives the same reward statistics."""
    profile_rollouts(worked.materialized_inputs_jsonl_fpath, worked.rollouts_jsonl_fpath, str(tmp_path / "p.jsonl"))
    reward_profile(worked)
    for ours, theirs in zip(
        read_jsonl(tmp_path / "p.jsonl"), read_jsonl(output_paths(worked.rollouts_jsonl_fpath)[0]), strict=True
    ):
        assert [ours[f"{s}_reward"] for s in ("avg", "max", "min", "median", "std")] == [
            theirs[f"{s}/reward"] for s in STATS
        ]
        assert ours["total_samples"] == theirs["num_rollouts"]


def test_partial_collection_needs_allow_partial_rollouts(worked):
    worked.allow_partial_rollouts = False
    with pytest.raises(
        DataError,
        match=(
            r"r\.jsonl: 3 of 6 materialized input rows have no rollout \(first keys: \[\(1, 1\), \(2, 0\), \(2,"
            r" 1\)\].*\+allow_partial_rollouts=true"
        ),
    ):
        reward_profile(worked)
    assert not output_paths(worked.rollouts_jsonl_fpath)[0].exists()


@pytest.mark.parametrize(
    ("rollouts", "inputs", "message"),
    [
        (
            [{"reward": 1.0}],
            None,
            (
                r"r\.jsonl:1: rollout has no integer _ng_task_index and _ng_rollout_index \(got None, None\); was it"
                r" written by ng_collect_rollouts\?"
            ),
        ),
        (
            [rollout(0, 0, 1.0, True, (1, 1), "a"), rollout(0, 0, 0.0, True, (1, 1), "a")],
            None,
            r"r\.jsonl:2: a second rollout with key \(0, 0\) \(the first is line 1\)",
        ),
        (
            [rollout(0, 0, 1.0, True, (1, 1), "a"), rollout(7, 0, 1.0, True, (1, 1), "a")],
            None,
            r"r\.jsonl:2: 1 rollouts have no row in .*m\.jsonl \(first keys: \[\(7, 0\)\]\)",
        ),
        (
            [{**rollout(0, 0, 1.0, True, (1, 1), "a"), "reward": None}],
            None,
            r"r\.jsonl:1: rollout has no numeric reward \(got None\)",
        ),
        (
            [rollout(0, 0, 1.0, True, (1, 1), "a")],
            [{"responses_create_params": {}}],
            r"m\.jsonl:1: materialized input row has no integer _ng_task_index .*_materialized_inputs\.jsonl",
        ),
        (
            [rollout(0, 0, 1.0, True, (1, 1), "a")],
            [{**materialized(0, 0, "a"), "agent_ref": None}],
            r"m\.jsonl:1: materialized input row has no agent_ref \{name: ...\} \(got None\)",
        ),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, rollouts, inputs, message):
    cfg = RewardProfileConfig(
        materialized_inputs_jsonl_fpath=write_jsonl(tmp_path / "m.jsonl", inputs or [materialized(0, 0, "a")]),
        rollouts_jsonl_fpath=write_jsonl(tmp_path / "r.jsonl", rollouts),
    )
    with pytest.raises(DataError, match=message):
        reward_profile(cfg)


def ng(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / name), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_command_line(worked, tmp_path):
    """NeMo Gym's parameter names, both command names, `--help`, and a misspelt parameter with a suggestion."""
    args = [
        f"+materialized_inputs_jsonl_fpath={worked.materialized_inputs_jsonl_fpath}",
        f"+rollouts_jsonl_fpath={worked.rollouts_jsonl_fpath}",
    ]
    done = ng("ng_reward_profile", *args, "++allow_partial_rollouts=True", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "Reward profiling outputs:" in done.stdout
        and len(read_jsonl(output_paths(worked.rollouts_jsonl_fpath)[0])) == 2
    )

    refused = ng("nemo_gym_reward_profile", *args, cwd=tmp_path)
    assert refused.returncode == 2 and "3 of 6 materialized input rows have no rollout" in refused.stderr

    typo = ng("ng_reward_profile", *args, "+allow_partial_rollout=true", cwd=tmp_path)
    assert typo.returncode == 2
    assert "unknown parameter +allow_partial_rollout (did you mean 'allow_partial_rollouts'?)" in typo.stderr

    shown = ng("ng_reward_profile", "--help", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("ng_reward_profile:")
    for field in ("materialized_inputs_jsonl_fpath", "rollouts_jsonl_fpath", "allow_partial_rollouts"):
        assert f"+{field}:" in shown.stdout


def test_std_of_single_value_groups_is_zero_not_nan(tmp_path):
    """Every task with one rollout (as in most of NeMo Gym's example files): std 0.0 for each field, never NaN."""
    inputs = [materialized(t, 0, "a") for t in range(3)]
    rollouts = [rollout(t, 0, float(t), t % 2 == 0, (5, t), "a") for t in range(3)]
    cfg = RewardProfileConfig(
        materialized_inputs_jsonl_fpath=write_jsonl(tmp_path / "m.jsonl", inputs),
        rollouts_jsonl_fpath=write_jsonl(tmp_path / "r.jsonl", rollouts),
    )
    reward_profile(cfg)
    rows = read_jsonl(output_paths(cfg.rollouts_jsonl_fpath)[0])
    assert [r["_ng_task_index"] for r in rows] == [0, 1, 2]
    assert all(r[k] == 0.0 for r in rows for k in r if k.startswith("std/"))
    # over the agent's 3 rollouts, rewards [0, 1, 2]: mean 1; sample std sqrt((1 + 0 + 1)/2) = 1
    (agent,) = json.loads(output_paths(cfg.rollouts_jsonl_fpath)[1].read_text())
    assert (agent["mean/reward"], agent["std/reward"]) == (1.0, 1.0) and not any(
        math.isnan(v) for v in agent.values() if isinstance(v, float)
    )


T_975_1 = 12.706204736174707  # Student's t, 97.5th percentile, 1 degree of freedom (tables; scipy.stats.t.ppf)


def test_nemo_gym_07_output_adds_repeat_level_metrics(worked, capsys):
    """NeMo Gym 0.7.0's output (the default) of the worked example: the same task rows, the repeat-level file (agents
    with two rollout indices or more), and the across-repeats keys in the agent rows."""
    worked.nemo_gym_version = "0.7.0"
    reward_profile_main(worked)
    assert "Masked from quality metrics: 0 rollout rows" in capsys.readouterr().out
    t0, _ = read_jsonl(output_paths(worked.rollouts_jsonl_fpath)[0])
    assert (t0["mean/reward"], t0["std/reward"]) == (0.5, pytest.approx(math.sqrt(0.5)))
    # agent_a: repeat 0 is task 0's rollout 0 (reward 1, input 10), repeat 1 its rollout 1 (reward 0, input 12);
    # agent_b has one repeat only: no rows
    r0, r1 = json.loads(repeat_level_metrics_path(worked.rollouts_jsonl_fpath).read_text())
    assert (r0["agent_ref"], r0["_ng_rollout_index"], r0["sample_count"], r0["missing_count"]) == (
        {"name": "agent_a"},
        0,
        1,
        0,
    )
    assert [r0[f"{s}/reward"] for s in ("mean", "median", "std", "sem", "min", "max", "p25", "p75")] == [1.0] * 2 + [
        0.0
    ] * 2 + [1.0] * 4
    assert "ci_low_95/reward" not in r0 and r1["mean/input_tokens"] == 12.0 and "judge_score" not in " ".join(r1)
    agent_a, agent_b = json.loads(output_paths(worked.rollouts_jsonl_fpath)[1].read_text())
    # across repeats, mean/reward [1, 0]: mean 0.5, std sqrt(0.5), se std/sqrt(2) = 0.5, 95 % t interval with 1
    # degree of freedom 0.5 ± 12.7062 * 0.5
    assert agent_a["mean_across_repeats/mean/reward"] == 0.5
    assert agent_a["se_across_repeats/mean/reward"] == pytest.approx(0.5)
    assert agent_a["ci_low_95_across_repeats/mean/reward"] == pytest.approx(0.5 - T_975_1 * 0.5)
    assert agent_a["ci_high_95_across_repeats/mean/reward"] == pytest.approx(0.5 + T_975_1 * 0.5)
    # judge_score is in repeat 0 only: one observation, se 0, no interval
    assert agent_a["se_across_repeats/mean/judge_score"] == 0.0
    assert "ci_low_95_across_repeats/mean/judge_score" not in agent_a
    assert not any("across_repeats" in k for k in agent_b)


def test_t_interval():
    assert t_interval_95(2.0, 1.0, 2) == pytest.approx((2.0 - T_975_1, 2.0 + T_975_1))
    assert t_interval_95(2.0, 0.0, 5) == (2.0, 2.0) and t_interval_95(2.0, 1.0, 1) is None


def test_masked_rollouts_are_left_out_and_counted(tmp_path, capsys):
    """NeMo Gym 0.7.0's masked samples (`mask_sample: true`): out of every statistic, counted in their agent's
    coverage keys; an agent whose every rollout is masked keeps a row of those keys; the flag is no statistic."""
    inputs = [materialized(t, r, "a") for t in (0, 1) for r in (0, 1)] + [materialized(2, 0, "b")]
    masked = {"mask_sample": True, "failure_kind": "judge_failed"}
    rollouts = [
        rollout(0, 0, 1.0, True, (1, 1), "a", mask_sample=False),
        rollout(0, 1, 0.0, True, (1, 1), "a", **masked),
        rollout(1, 0, 0.0, True, (1, 1), "a", **masked),
        rollout(1, 1, 0.0, True, (1, 1), "a", **masked),
        rollout(2, 0, 0.0, True, (1, 1), "b", **masked),
    ]
    cfg = RewardProfileConfig(
        materialized_inputs_jsonl_fpath=write_jsonl(tmp_path / "m.jsonl", inputs),
        rollouts_jsonl_fpath=write_jsonl(tmp_path / "r.jsonl", rollouts),
    )
    reward_profile_main(cfg)
    printed = capsys.readouterr().out
    assert "Reward profile completion: 5/5 rollout rows" in printed
    assert "Masked from quality metrics: 4 rollout rows" in printed
    (task,) = read_jsonl(output_paths(cfg.rollouts_jsonl_fpath)[0])  # tasks 1 and 2: every rollout masked
    assert (task["_ng_task_index"], task["mean/reward"], task["num_rollouts"]) == (0, 1.0, 1)
    assert not any("mask_sample" in k for k in task)
    agent_a, agent_b = json.loads(output_paths(cfg.rollouts_jsonl_fpath)[1].read_text())
    assert agent_a["mean/reward"] == 1.0 and {k: v for k, v in agent_a.items() if k.startswith("coverage/")} == {
        "coverage/measured_rollouts": 1,
        "coverage/masked_rollouts": 3,
        "coverage/measured_tasks": 1,
        "coverage/fully_masked_tasks": 1,
    }
    assert agent_b == {
        "agent_ref": {"name": "b"},
        "coverage/measured_rollouts": 0,
        "coverage/masked_rollouts": 1,
        "coverage/measured_tasks": 0,
        "coverage/fully_masked_tasks": 1,
    }
    assert json.loads(repeat_level_metrics_path(cfg.rollouts_jsonl_fpath).read_text()) == []


def test_a_task_sent_to_several_agents_is_profiled_per_task_and_agent(tmp_path):
    """NeMo Gym 0.7.0's fan-out: a task that ran through agents b and a has a row per (task, agent), by task then
    agent name, each with its agent_ref and its own rollouts (numbered on across the agents); 0.4.0's output profiles
    by task whatever the agent. Against 0.7.0's own ng_reward_profile on a fan-out collection:
    tests/test_nemo_gym07.py::test_fan_out_and_num_repeats_by_agent_as_0_7_0_applies_them."""
    inputs = [materialized(0, 0, "b"), materialized(0, 1, "a"), materialized(0, 2, "a"), materialized(1, 0, "a")]
    rollouts = [
        rollout(0, 0, 0.0, False, (1, 1), "b"),
        rollout(0, 1, 1.0, True, (1, 1), "a"),
        rollout(0, 2, 0.5, True, (1, 1), "a"),
        rollout(1, 0, 1.0, True, (1, 1), "a"),
    ]
    cfg = RewardProfileConfig(
        materialized_inputs_jsonl_fpath=write_jsonl(tmp_path / "m.jsonl", inputs),
        rollouts_jsonl_fpath=write_jsonl(tmp_path / "r.jsonl", rollouts),
    )
    profile = reward_profile(cfg)
    rows = read_jsonl(profile.profiling_fpath)
    assert [(r["_ng_task_index"], r["agent_ref"]["name"], r["num_rollouts"], r["mean/reward"]) for r in rows] == [
        (0, "a", 2, 0.75),
        (0, "b", 1, 0.0),
        (1, "a", 1, 1.0),
    ]
    assert [info["_ng_rollout_index"] for info in rows[0]["rollout_infos"]] == [1, 2]
    assert rows[0]["sample"]["agent_ref"] == {"name": "a"} and rows[0]["expected_num_rollouts"] == 2
    assert list(rows[0]).index("agent_ref") == list(rows[0]).index("sample") - 1  # after the statistics
    cfg.nemo_gym_version = "0.4.0"  # 0.4.0 profiles by task whatever the agent
    assert reward_profile(cfg).completed_rollouts == 4
    assert [r["num_rollouts"] for r in read_jsonl(profile.profiling_fpath)] == [3, 1]
