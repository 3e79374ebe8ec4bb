"""Two rollout files compared (nemo_gym.eval.comparison) and the percentile bootstrap (nemo_gym.eval.bootstrap_ci):
worked examples by hand, and NeMo Gym's real rollouts for tool calls, turns and task keys."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nemo_gym.eval.bootstrap_ci import bootstrap_mean_ci
from nemo_gym.eval.comparison import (
    TaskTally,
    pair_tasks,
    paired_reward_difference,
    prompt_digest,
    summarize,
    task_key,
    tool_calls_and_turns,
)

REPO = Path(__file__).resolve().parent.parent
PEER_SERVERS = REPO.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
needs_peer_data = pytest.mark.skipif(
    not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found (../shared/peer_data)"
)


def peer_rows(server: str) -> list[dict]:
    return [
        json.loads(line)
        for line in (PEER_SERVERS / server / "data" / "example_rollouts.jsonl").read_text().splitlines()
    ]


def tally(
    rewards: list[float],
    tool_calls: int = 0,
    turns: int = 0,
    env: str = "e",
    prompt: str | None = None,
    threshold: float = 1.0,
) -> TaskTally:
    t = TaskTally(env, prompt)
    for r in rewards:
        t.add(r, r >= threshold, 0, 0)
    t.tool_calls, t.turns = tool_calls, turns
    return t


# -- tool calls and turns ---------------------------------------------------------------------------------
def test_tool_calls_and_turns_worked_examples():
    call, out, msg, think = (
        {"type": "function_call"},
        {"type": "function_call_output"},
        {"type": "message"},
        {"type": "reasoning"},
    )
    assert tool_calls_and_turns({"output": [msg]}) == (0, 1)  # answered at once: one model call
    assert tool_calls_and_turns({"output": [call, out, msg]}) == (1, 2)  # call, result, answer: two model calls
    assert tool_calls_and_turns({"output": [think, call, call, out, out, think, msg]}) == (
        2,
        2,
    )  # parallel calls: one turn
    assert tool_calls_and_turns({"output": [call, out]}) == (1, 1)  # stopped after the tool (max steps)
    assert tool_calls_and_turns({"output": [{"role": "assistant", "content": "hi"}]}) == (
        0,
        1,
    )  # a message without "type"
    assert tool_calls_and_turns(None) == (0, 0) and tool_calls_and_turns({"output": "x"}) == (0, 0)
    # gymnasium_agent's games: each observation goes back as a user message, and each answer is a model call
    said, seen = {"type": "message", "role": "assistant"}, {"type": "message", "role": "user"}
    assert tool_calls_and_turns({"output": [said, seen, said, seen, said]}) == (0, 3)


@needs_peer_data
def test_tool_calls_and_turns_of_peer_rollouts():
    # example_session_state_mgmt row 0: [call, call, out, out, call, out, message]: 3 calls in 3 turns
    assert tool_calls_and_turns(peer_rows("example_session_state_mgmt")[0]["response"]) == (3, 3)
    # example_single_tool_call: rows 0-1 answer in text (1 turn), rows 2-4 [call, out, message] (2 turns)
    assert [tool_calls_and_turns(r["response"]) for r in peer_rows("example_single_tool_call")] == [
        (0, 1),
        (0, 1),
        (1, 2),
        (1, 2),
        (1, 2),
    ]
    # example_multi_step row 2: 4 call/output pairs then the answer: 4 calls, 5 turns
    assert tool_calls_and_turns(peer_rows("example_multi_step")[2]["response"]) == (4, 5)


# -- task keys --------------------------------------------------------------------------------------------
@needs_peer_data
def test_task_key_is_the_task_index_else_the_prompt_and_agent():
    multireward = peer_rows("example_tool_call_multireward")
    assert [task_key(r) for r in multireward] == [1, 0, 4, 2, 3]  # `_ng_task_index`
    row = peer_rows("example_single_tool_call")[0]
    key = task_key(row)
    assert key.startswith("sha256:") and key == "sha256:" + prompt_digest(row)
    hotter = {**row, "responses_create_params": {**row["responses_create_params"], "temperature": 1.5}, "reward": 0.0}
    assert task_key(hotter) == key  # the same prompt with other sampling parameters is the same task
    assert task_key({**row, "agent_ref": {"name": "other_agent"}}) != key
    other_prompt = peer_rows("example_single_tool_call")[1]
    assert task_key(other_prompt) != key
    assert task_key({**row, "_ng_task_index": True}) == key  # a bool is not an index


# -- pairing, summary, difference -------------------------------------------------------------------------
def test_pair_tasks_statuses_order_and_deltas():
    baseline = {0: tally([0, 1]), 2: tally([1]), "sha256:b": tally([0]), 5: TaskTally("e")}  # task 5: no rollout
    candidate = {0: tally([1, 1]), 1: tally([1]), "sha256:b": tally([0]), "sha256:a": tally([1])}
    pairs = pair_tasks(baseline, candidate)
    assert [p.key for p in pairs] == [0, 1, 2, "sha256:a", "sha256:b"]  # indices first, then digests; task 5 left out
    assert [p.status for p in pairs] == ["both", "candidate only", "baseline only", "candidate only", "both"]
    # task 0: 1.0 - 0.5 = +0.5; task "sha256:b": 0 - 0 = 0
    assert [p.reward_delta for p in pairs] == [0.5, None, None, None, 0.0]


def test_summarize_weighs_rollouts():
    # task A: rewards [1, 0, 1] (2 pass), 4 tool calls, 6 turns; task B: [0.5] (none passes at 1.0), 0 calls, 1 turn
    summary = summarize([tally([1, 0, 1], tool_calls=4, turns=6), tally([0.5], tool_calls=0, turns=1), TaskTally("e")])
    assert (summary.num_tasks, summary.num_rollouts) == (2, 4)
    assert summary.mean_reward == pytest.approx(2.5 / 4)  # (1 + 0 + 1 + 0.5) / 4 rollouts
    assert summary.pass_rate == pytest.approx(2 / 4) and summary.tool_calls_per_rollout == pytest.approx(4 / 4)
    assert summary.turns_per_rollout == pytest.approx(7 / 4)
    assert summarize([]).mean_reward is None


def test_paired_difference_worked_example():
    # per-task deltas: task 0: 1 - 0 = +1; task 1: 1 - 1 = 0; task 2: 0.5 - 1 = -0.5; task 3: 1 - 0.5 = +0.5
    baseline = {0: tally([0]), 1: tally([1]), 2: tally([1, 1]), 3: tally([0, 1]), 9: tally([1])}
    candidate = {0: tally([1]), 1: tally([1]), 2: tally([0, 1]), 3: tally([1, 1])}
    diff = paired_reward_difference(pair_tasks(baseline, candidate), resamples=2000)
    assert diff.num_tasks == 4 and diff.mean_difference == pytest.approx(
        (1 + 0 - 0.5 + 0.5) / 4
    )  # 0.25; task 9 unpaired
    assert (diff.improved, diff.worsened, diff.unchanged) == (2, 1, 1)
    low, high = diff.ci95
    # a resample mean is a mean of 4 deltas from {-0.5, 0, 0.5, 1}: at least -0.5, at most 1, and the interval holds
    # 0.25
    assert -0.5 <= low < 0.25 < high <= 1.0
    assert (
        diff.ci95 == paired_reward_difference(pair_tasks(baseline, candidate), resamples=2000).ci95
    )  # seeded: repeats
    none = paired_reward_difference(pair_tasks({0: tally([1])}, {1: tally([1])}))
    assert none.num_tasks == 0 and none.mean_difference is None and none.ci95 is None


def test_prompt_mismatch_is_flagged_not_fatal():
    pairs = pair_tasks(
        {0: tally([0], prompt="p0"), 1: tally([0], prompt="p1")},
        {0: tally([1], prompt="p0"), 1: tally([1], prompt="other")},
    )
    assert [p.same_prompt for p in pairs] == [True, False]
    assert paired_reward_difference(pairs, resamples=100).prompt_mismatches == [1]


# -- the bootstrap ----------------------------------------------------------------------------------------
def test_bootstrap_worked_examples():
    assert bootstrap_mean_ci([0.25] * 7) == (0.25, 0.25)  # every resample has the same mean
    # two values 0 and 1: a resample mean is 0 (p = 1/4), 0.5 (1/2) or 1 (1/4); the 2.5 % and 97.5 % quantiles
    # of 10,000 draws are 0 and 1 (about 2,500 draws at each end)
    assert bootstrap_mean_ci([0.0, 1.0]) == (0.0, 1.0)
    # 80 % interval of the same: 10 % and 90 % quantiles fall in the 25 % / 25 % tails: 0 and 1 again; at 40 %
    # (30 % and 70 % quantiles) both fall in the middle mass: 0.5
    assert bootstrap_mean_ci([0.0, 1.0], confidence=0.4) == (0.5, 0.5)


def test_bootstrap_is_the_one_the_learning_benchmark_had():
    """Draw for draw the function benchmarks/learning_basic_arithmetic.py had (its --report-only figures hold)."""

    def old_bootstrap(per_task: list[float], resamples: int, rng: random.Random) -> tuple[float, float]:
        means = sorted(sum(rng.choices(per_task, k=len(per_task))) / len(per_task) for _ in range(resamples))
        return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]

    draw = random.Random(3)
    values = [draw.random() for _ in range(37)]
    old_rng, new_rng = random.Random(0), random.Random(0)
    for resamples in (10_000, 1000, 200):  # several calls on one generator, as the benchmark makes
        assert bootstrap_mean_ci(values, resamples, rng=new_rng) == old_bootstrap(values, resamples, old_rng)


@pytest.mark.parametrize(("values", "resamples", "confidence"), [([], 100, 0.95), ([1.0], 0, 0.95), ([1.0], 100, 1.0)])
def test_bootstrap_bad_arguments(values, resamples, confidence):
    with pytest.raises(ValueError):
        bootstrap_mean_ci(values, resamples, confidence)


def test_bootstrap_numpy_and_pure_python_draws_agree(monkeypatch):
    """numpy's draws (vectorized, in chunks) and the pure-Python ones give the same interval up to Monte Carlo error."""
    import nemo_gym.eval.bootstrap_ci as bootstrap_ci

    draw = random.Random(5)
    values = [
        float(draw.random() < 0.3) - float(draw.random() < 0.1) for _ in range(200)
    ]  # per-task deltas in {-1, 0, 1}
    with_numpy = bootstrap_mean_ci(values, 4000)
    assert with_numpy == bootstrap_mean_ci(values, 4000)  # seeded
    monkeypatch.setattr(bootstrap_ci, "_CHUNK_DRAWS", 1000)  # 5 resamples a chunk: 800 chunks
    assert bootstrap_mean_ci(values, 4000) == with_numpy  # chunking does not change the draws
    monkeypatch.setattr(bootstrap_ci, "_numpy", lambda: None)  # a core-only install
    pure_python = bootstrap_mean_ci(values, 4000)
    # the mean's standard error is about sd / sqrt(200) ~ 0.03; the bounds' Monte Carlo error is a small part of it
    assert pure_python != with_numpy and all(abs(a - b) < 0.01 for a, b in zip(pure_python, with_numpy))
