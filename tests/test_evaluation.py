"""ng_eval: pass@k / pass^k worked examples and brute force, grouping, exclusions, peer rollouts, the CLI."""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from nemo_gym.cli import COMMANDS, main
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.eval.command import EvalConfig, eval_main
from nemo_gym.eval.evaluation import compare, evaluate, load_task_results, pass_at_k, pass_hat_k
from nemo_gym.eval.table import format_table

REPO = Path(__file__).resolve().parent.parent
PEER_ROLLOUTS = (
    REPO.parent
    / "shared"
    / "peer_data"
    / "nemo_gym"
    / "resources_servers"
    / "example_tool_call_multireward"
    / "data"
    / "example_rollouts.jsonl"
)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rollout(task: int, index: int, reward: float, agent: str = "env_a", **extra) -> dict:
    return {
        "responses_create_params": {"input": f"q{task}"},
        "_ng_task_index": task,
        "_ng_rollout_index": index,
        "reward": reward,
        "agent_ref": {"name": agent},
        **extra,
    }


def picked(metrics: dict, **expected) -> bool:
    return {key: metrics[key] for key in expected} == expected


# -- the estimators ---------------------------------------------------------------------------------------
def test_worked_example_n5_c2():
    # pass@1 = 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-12)
    # pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)
    # pass@3 = 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9;  pass@4: n-c = 3 < 4, every 4 hold a pass: 1
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9, abs=1e-12)
    assert pass_at_k(5, 2, 4) == 1.0
    # pass^1 = C(2,1)/C(5,1) = 2/5 = 0.4;  pass^2 = C(2,2)/C(5,2) = 1/10 = 0.1;  pass^3: c = 2 < 3: 0
    assert pass_hat_k(5, 2, 1) == pytest.approx(0.4, abs=1e-12)
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1, abs=1e-12)
    assert pass_hat_k(5, 2, 3) == 0.0


@pytest.mark.parametrize("n", [1, 4, 8])
def test_edge_cases_none_all_and_k_equal_n(n):
    for k in range(1, n + 1):
        assert pass_at_k(n, 0, k) == 0.0 and pass_hat_k(n, 0, k) == 0.0  # nothing passes
        assert pass_at_k(n, n, k) == 1.0 and pass_hat_k(n, n, k) == 1.0  # everything passes
    assert pass_at_k(n, 1, n) == 1.0  # k = n draws every sample, the one pass among them
    assert pass_hat_k(n, n - 1, n) == 0.0  # ... and the one failure among them


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (1, 0, 2), (5, 2, 0), (5, 6, 1), (5, -1, 1)])
def test_bad_arguments_are_clear_errors(n, c, k):
    with pytest.raises(ValueError, match=r"1 <= k <= n|0 <= c <= n"):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError, match=r"1 <= k <= n|0 <= c <= n"):
        pass_hat_k(n, c, k)


def test_equal_to_brute_force_over_subsets():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 8)
        c, k = rng.randint(0, n), rng.randint(1, n)
        passes = [i < c for i in range(n)]  # which samples pass does not matter, only how many
        subsets = list(itertools.combinations(range(n), k))
        any_pass = sum(any(passes[i] for i in s) for s in subsets) / len(subsets)
        all_pass = sum(all(passes[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(any_pass, abs=1e-12), (n, c, k)
        assert pass_hat_k(n, c, k) == pytest.approx(all_pass, abs=1e-12), (n, c, k)


def test_stable_for_large_n():
    # exact rationals with math.comb; the product form stays accurate where C(1000, 500) overflows a float
    for n, c, k in [(200, 3, 50), (1000, 10, 500), (1000, 990, 500)]:
        exact_at = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        exact_hat = Fraction(math.comb(c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact_at), rel=1e-10)
        assert pass_hat_k(n, c, k) == pytest.approx(float(exact_hat), rel=1e-10, abs=1e-300)


# -- tasks, groups, exclusions ------------------------------------------------------------------------------
def test_per_environment_and_overall(tmp_path):
    # env_a: task 0 rewards [1, 0, 0, 1] (c=2), task 1 [0, 0, 0, 0] (c=0); env_b (dataset field): task 2 [1, 1, 1, 0.5]
    # (c=3)
    rows = [rollout(0, i, r) for i, r in enumerate([1, 0, 0, 1])] + [rollout(1, i, 0) for i in range(4)]
    rows += [rollout(2, i, r, agent="env_a", dataset="env_b") for i, r in enumerate([1, 1, 1, 0.5])]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    report = evaluate(load_task_results(path), [1, 2], pass_threshold=1.0)
    a, b, overall = report["environments"]["env_a"], report["environments"]["env_b"], report["overall"]
    # env_a pass@1 = mean(2/4, 0) = 0.25; pass@2 = mean(1 - C(2,2)/C(4,2), 0) = mean(5/6, 0) = 5/12
    assert a["pass@1"] == pytest.approx(0.25) and a["pass@2"] == pytest.approx(5 / 12)
    # env_a pass^2 = mean(C(2,2)/C(4,2), 0) = mean(1/6, 0) = 1/12; mean reward = 2/8
    assert a["pass^2"] == pytest.approx(1 / 12) and a["mean_reward"] == pytest.approx(0.25)
    # env_b: c=3 of n=4: pass@2 = 1 - 0 = 1 (n-c = 1 < 2); pass^2 = C(3,2)/C(4,2) = 3/6; mean reward = 3.5/4
    assert b["pass@1"] == pytest.approx(0.75) and b["pass@2"] == 1.0 and b["pass^2"] == pytest.approx(0.5)
    assert b["mean_reward"] == pytest.approx(0.875)
    # overall: every task weighs the same: pass@1 = (0.5 + 0 + 0.75) / 3; mean reward over 12 samples = 5.5/12
    assert overall["pass@1"] == pytest.approx(1.25 / 3) and overall["mean_reward"] == pytest.approx(5.5 / 12)
    assert (overall["num_tasks"], overall["num_samples"], overall["num_tasks_excluded"]) == (3, 12, 0)
    assert [(t["task"], t["n"], t["c"]) for t in report["tasks"]] == [(0, 4, 2), (1, 4, 0), (2, 4, 3)]


def test_failed_and_missing_tasks_are_excluded_and_counted(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    # task 0 complete (2 passes of 2); task 1 has one row and one infrastructure failure; task 2 has no row and
    # no failure record (interrupted); state says 3 tasks x 2 repeats
    write_jsonl(path, [rollout(0, 0, 1), rollout(0, 1, 1), rollout(1, 0, 0)])
    write_jsonl(
        tmp_path / "rollouts_failures.jsonl",
        [{"_ng_task_index": 1, "_ng_rollout_index": 1, "agent_ref": {"name": "env_a"}, "failure_class": "timeout"}],
    )
    write_jsonl(
        tmp_path / "rollouts_materialized_inputs.jsonl",
        [rollout(t, r, 0, agent="env_c" if t == 2 else "env_a") for t in range(3) for r in range(2)],
    )
    (tmp_path / "rollouts_state.json").write_text(json.dumps({"num_tasks": 3, "num_repeats": 2}))
    report_path = tmp_path / "eval.json"
    status = eval_main(EvalConfig(from_rollouts=str(path), output_json_fpath=str(report_path), k=[1, 2]))
    assert status == 1
    report = json.loads(report_path.read_text())
    assert (
        picked(report["overall"], num_tasks=1, num_samples=2, num_tasks_excluded=2, mean_reward=1.0)
        and report["overall"]["pass@2"] == 1.0
    )
    assert {(e["task"], e["environment"], e["reason"]) for e in report["excluded_tasks"]} == {
        (1, "env_a", "failed: timeout"),
        (2, "env_c", "missing: 0/2 samples"),
    }
    assert report["environments"]["env_c"]["pass@1"] is None  # nothing scored there, no zero


def test_from_rollouts_on_peer_rollouts(tmp_path, capsys):
    report_path = tmp_path / "peer_eval.json"
    assert eval_main(EvalConfig(from_rollouts=str(PEER_ROLLOUTS), output_json_fpath=str(report_path))) == 0
    report = json.loads(report_path.read_text())
    # 5 tasks x 1 sample, every reward 2.0 (>= 1.0): default k = [1, 4, 8] without those above n = 1
    assert report["k"] == [1]
    assert report["environments"].keys() == {"example_tool_call_multireward_simple_agent"}
    assert picked(report["overall"], num_tasks=5, num_samples=5, mean_reward=2.0)
    assert report["overall"]["pass@1"] == 1.0 and report["overall"]["pass^1"] == 1.0
    out = capsys.readouterr().out
    assert "example_tool_call_multireward_simple_agent" in out and "pass@1" in out and str(report_path) in out
    with pytest.raises(ConfigError, match=r"k=\[4\].*n=1"):
        eval_main(EvalConfig(from_rollouts=str(PEER_ROLLOUTS), output_json_fpath=str(report_path), k=[1, 4]))


def test_max_samples_and_rows_without_task_index(tmp_path):
    rows = [
        {"responses_create_params": {"input": q}, "reward": r, "agent_ref": {"name": "x"}}
        for q, r in [("a", 1), ("b", 0), ("a", 0), ("b", 0)]
    ]
    tasks = load_task_results(write_jsonl(tmp_path / "r.jsonl", rows))
    assert sorted(len(t.rewards) for t in tasks) == [2, 2] and all(t.key.startswith("sha256:") for t in tasks)
    assert len(load_task_results(tmp_path / "r.jsonl", max_tasks=1)) == 1


def test_rollout_without_reward_is_a_data_error(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [rollout(0, 0, 1), {**rollout(0, 1, 1), "reward": None}])
    with pytest.raises(DataError, match=r"r.jsonl:2: .*reward"):
        load_task_results(path)


def test_config_errors_before_any_collection(tmp_path):
    with pytest.raises(ConfigError, match="input_jsonl_fpath"):
        eval_main(EvalConfig(output_json_fpath=str(tmp_path / "e.json")))
    with pytest.raises(ConfigError, match=r"k=\[16\]"):  # no server needed: checked before collecting
        eval_main(
            EvalConfig(
                input_jsonl_fpath="tasks.jsonl", output_json_fpath=str(tmp_path / "e.json"), num_samples=8, k=[1, 16]
            )
        )


def test_cli_registration_help_and_plain_table(tmp_path, capsys, monkeypatch):
    assert "eval" in COMMANDS
    assert main("eval", ["--help"]) == 0 and "+pass_threshold" in capsys.readouterr().out
    assert main("eval", [f"+from_rollouts={PEER_ROLLOUTS}", f"+output_json_fpath={tmp_path / 'e.json'}", "+k=[2]"]) == 2
    assert "k=[2]" in capsys.readouterr().err
    report = evaluate(load_task_results(PEER_ROLLOUTS), None, 1.0)
    monkeypatch.setitem(sys.modules, "rich.console", None)  # rich not installed: plain text
    lines = format_table(report).splitlines()
    assert lines[0].split() == ["environment", "tasks", "samples", "excluded", "mean_reward", "pass@1", "pass^1"]
    assert lines[-1].split() == ["overall", "5", "5", "0", "2.0000", "1.0000", "1.0000"]


# -- two files compared (+baseline_rollouts) ---------------------------------------------------------------
CALL_AND_ANSWER = {
    "output": [
        {"type": "function_call", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "output": "1"},
        {"type": "message", "role": "assistant", "content": "done"},
    ]
}


def test_compare_worked_example(tmp_path):
    # baseline: task 0 [0, 0, 1, 1] (c=2), task 1 [0, 0, 0, 0], task 2 [1, 1, 1, 1] (baseline only); no tool call
    # candidate: task 0 [1, 1, 1, 0] (c=3), task 1 [1, 0, 0, 0] (c=1), task 3 (candidate only); each [call, output,
    # answer]
    base = [
        rollout(t, i, r)
        for t, rewards in ((0, [0, 0, 1, 1]), (1, [0] * 4), (2, [1] * 4))
        for i, r in enumerate(rewards)
    ]
    cand = [
        rollout(t, i, r, response=CALL_AND_ANSWER)
        for t, rewards in ((0, [1, 1, 1, 0]), (1, [1, 0, 0, 0]), (3, [1] * 4))
        for i, r in enumerate(rewards)
    ]
    baseline, candidate = (
        load_task_results(write_jsonl(tmp_path / "b.jsonl", base)),
        load_task_results(write_jsonl(tmp_path / "c.jsonl", cand)),
    )
    paired = compare(candidate, baseline, [1, 2], 1.0, resamples=500)
    assert (paired["num_tasks"], paired["baseline_only"], paired["candidate_only"]) == (2, [2], [3])
    b, c, d = (paired["overall"][side] for side in ("baseline", "candidate", "difference"))
    # baseline on tasks 0, 1: pass@1 = mean(2/4, 0) = 0.25; pass@2 = mean(1 - C(2,2)/C(4,2), 0) = (5/6) / 2 = 5/12;
    # pass^2 = mean(C(2,2)/C(4,2), 0) = 1/12; mean reward 2/8
    assert (b["pass@1"], b["pass@2"], b["pass^2"], b["mean_reward"]) == pytest.approx((0.25, 5 / 12, 1 / 12, 0.25))
    # candidate: pass@1 = mean(3/4, 1/4) = 0.5; pass@2 = mean(1 (n-c = 1 < 2), 1 - C(3,2)/C(4,2) = 1/2) = 0.75;
    # pass^2 = mean(C(3,2)/C(4,2) = 1/2, 0) = 0.25; mean reward 4/8
    assert (c["pass@1"], c["pass@2"], c["pass^2"], c["mean_reward"]) == pytest.approx((0.5, 0.75, 0.25, 0.5))
    assert (d["pass@1"], d["pass@2"], d["pass^2"], d["mean_reward"]) == pytest.approx((0.25, 1 / 3, 1 / 6, 0.25))
    # [call, output, answer]: 1 tool call and 2 turns a sample, against none
    assert (d["tool_calls_per_sample"], d["turns_per_sample"]) == (1.0, 2.0) and (b["num_tasks"], c["num_samples"]) == (
        2,
        8,
    )
    # per task: 0.75 - 0.5 = +0.25 and 0.25 - 0 = +0.25: every resample's mean is 0.25
    assert paired["mean_reward_difference"] == {
        "mean": 0.25,
        "ci95": [0.25, 0.25],
        "resamples": 500,
        "improved": 2,
        "worsened": 0,
        "unchanged": 0,
    }
    assert [(t["task"], t["status"], t["difference"]) for t in paired["tasks"]] == [
        (0, "both", 0.25),
        (1, "both", 0.25),
        (2, "baseline only", None),
        (3, "candidate only", None),
    ]
    assert paired["environments"]["env_a"] == paired["overall"]


def peer_before_after(tmp_path: Path) -> tuple[Path, Path]:
    """NeMo Gym's example_single_tool_call rollouts (rewards [0, 0, 1, 1, 1]) as "before"; "after": the same tasks, the
    two that answered in text now answering with task 2's get_weather trajectory (reward 1), and task 4 not collected.
    """
    rows = [json.loads(line) for line in PEER_SINGLE_TOOL_CALL.read_text().splitlines()]
    after = [
        {**row, "response": rows[2]["response"], "reward": 1.0} if i < 2 else row for i, row in enumerate(rows[:4])
    ]
    return write_jsonl(tmp_path / "before.jsonl", rows), write_jsonl(tmp_path / "after.jsonl", after)


PEER_SINGLE_TOOL_CALL = PEER_ROLLOUTS.parents[2] / "example_single_tool_call" / "data" / "example_rollouts.jsonl"


@pytest.mark.skipif(not PEER_SINGLE_TOOL_CALL.is_file(), reason="NeMo Gym peer data not found (../shared/peer_data)")
def test_eval_main_with_a_baseline_on_peer_rollouts(tmp_path, capsys):
    before, after = peer_before_after(tmp_path)
    report_path = tmp_path / "compare.json"
    assert (
        eval_main(
            EvalConfig(from_rollouts=str(after), baseline_rollouts=str(before), output_json_fpath=str(report_path))
        )
        == 0
    )
    report = json.loads(report_path.read_text())
    assert report["overall"]["mean_reward"] == 1.0 and report["k"] == [
        1
    ]  # the candidate's own report, as without a baseline
    comparison = report["comparison"]
    assert comparison["baseline_rollouts_jsonl_fpath"] == str(before)
    assert picked(
        comparison["baseline"]["overall"], num_tasks=5, mean_reward=0.6, tool_calls_per_sample=0.6, turns_per_sample=1.6
    )
    paired = comparison["paired"]
    # tasks 0-3 in both (keyed by prompt: the rows have no _ng_task_index): baseline [0, 0, 1, 1], candidate [1, 1, 1,
    # 1]
    assert paired["num_tasks"] == 4 and len(paired["baseline_only"]) == 1 and paired["candidate_only"] == []
    assert paired["overall"]["baseline"]["pass@1"] == 0.5 and paired["overall"]["candidate"]["pass@1"] == 1.0
    assert paired["overall"]["difference"]["turns_per_sample"] == pytest.approx(0.5)  # text answers were 1 turn, now 2
    diff = paired["mean_reward_difference"]
    # deltas [1, 1, 0, 0]: mean 0.5; resample means are multiples of 1/4 in [0, 1]
    assert (
        diff["mean"] == 0.5
        and 0.0 <= diff["ci95"][0] < 0.5 < diff["ci95"][1] <= 1.0
        and (diff["improved"], diff["unchanged"]) == (2, 2)
    )
    assert paired["prompt_mismatches"] == []
    out = capsys.readouterr().out
    for text in (
        f"baseline: {before}",
        f"candidate: {after}",
        "difference",
        "+0.5000",
        "95 % bootstrap interval",
        "baseline 1, candidate 0",
    ):
        assert text in out


def test_baseline_ks_exclusions_and_unknown_keys(tmp_path, capsys):
    # candidate: 4 samples of task 0; baseline: 2 samples of task 0 and one failed task 1
    cand = write_jsonl(tmp_path / "c.jsonl", [rollout(0, i, 1) for i in range(4)])
    base = write_jsonl(tmp_path / "b.jsonl", [rollout(0, i, 0) for i in range(2)] + [rollout(1, 0, 0)])
    write_jsonl(
        tmp_path / "b_failures.jsonl", [{"_ng_task_index": 1, "_ng_rollout_index": 1, "failure_class": "timeout"}]
    )
    report_path = tmp_path / "e.json"
    assert (
        eval_main(EvalConfig(from_rollouts=str(cand), baseline_rollouts=str(base), output_json_fpath=str(report_path)))
        == 1
    )  # a baseline task excluded
    report = json.loads(report_path.read_text())
    assert report["k"] == [1]  # default ks up to the fewest samples in either file (2)
    assert report["comparison"]["baseline"]["excluded_tasks"] == [
        {"task": 1, "environment": "env_a", "reason": "failed: timeout"}
    ]
    assert "1 baseline tasks excluded" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"k=\[4\].*baseline: .*b.jsonl"):
        eval_main(
            EvalConfig(
                from_rollouts=str(cand), baseline_rollouts=str(base), output_json_fpath=str(report_path), k=[1, 4]
            )
        )
    with pytest.raises(DataError, match=r"no_such.jsonl: no such file"):  # before any collection
        eval_main(
            EvalConfig(
                input_jsonl_fpath="tasks.jsonl",
                baseline_rollouts=str(tmp_path / "no_such.jsonl"),
                output_json_fpath=str(report_path),
            )
        )
    assert main("eval", [f"+from_rollouts={cand}", f"+baseline_rollout={base}"]) == 2
    assert "did you mean 'baseline_rollouts'" in capsys.readouterr().err


def test_a_bad_baseline_line_names_the_file_and_line(tmp_path):
    cand = write_jsonl(tmp_path / "c.jsonl", [rollout(0, 0, 1)])
    base = tmp_path / "b.jsonl"
    base.write_text(json.dumps(rollout(0, 0, 0)) + "\n{not json\n")
    with pytest.raises(DataError, match=r"b.jsonl:2: not valid JSON"):
        eval_main(
            EvalConfig(from_rollouts=str(cand), baseline_rollouts=str(base), output_json_fpath=str(tmp_path / "e.json"))
        )


def test_baseline_agent_name_needs_tasks_without_agent_ref(tmp_path):
    with pytest.raises(ConfigError, match=r"\+baseline_agent_name collects the baseline from \+input_jsonl_fpath"):
        eval_main(EvalConfig(from_rollouts=str(tmp_path / "r.jsonl"), baseline_agent_name="before"))
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"responses_create_params": {"input": "q"}},
            {"responses_create_params": {"input": "r"}, "agent_ref": {"name": "a"}},
        ],
    )
    with pytest.raises(
        ConfigError, match=r"tasks.jsonl:2: the row names its agent"
    ):  # before any collection: no server needed
        eval_main(
            EvalConfig(
                input_jsonl_fpath=str(tasks),
                agent_name="after",
                baseline_agent_name="before",
                output_json_fpath=str(tmp_path / "e.json"),
            )
        )
