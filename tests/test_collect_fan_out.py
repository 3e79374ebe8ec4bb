"""NeMo Gym 0.7.0's `fan_out` and `num_repeats` as a dict on our `ng_collect_rollouts` (`nemo_gym.collect.plan`):
which agent each rollout goes to, how many each row runs, their indices, the files and their resume. The plan alone,
then through the real head server and agents of tests/test_collect.py (uvicorn on loopback); against NeMo Gym
0.7.0's own collector: tests/test_nemo_gym07.py::test_fan_out_and_num_repeats_by_agent_as_0_7_0_applies_them."""

from __future__ import annotations

import json

import orjson
import pytest
from test_collect import agent, collect, config, gym, rows_of  # noqa: F401 (fixtures)

from nemo_gym.collect.files import OutputPaths
from nemo_gym.collect.plan import RolloutPlan, plan_rollouts
from nemo_gym.collect.sink import input_fingerprint
from nemo_gym.collect.tasks import routing_key
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.eval.evaluation import load_task_results


def task(name: str | None, **fields) -> dict:
    return {"responses_create_params": {"input": "q"}, "agent_ref": {"name": name} if name else None, **fields}


# -- the plan -----------------------------------------------------------------------------------------------
def test_an_int_without_fan_out_is_the_plain_plan_with_the_fingerprint_of_earlier_releases():
    tasks = [task("a", x=0), task("b", x=1)]
    plan = plan_rollouts(tasks, ["a", "b"], 3)
    assert plan.num_repeats == 3 and plan.state_repeats() == 3 and plan.total == 6
    assert plan.pairs() == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert plan.pairs(interleave_repeats=True) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    # what 0.1 wrote to <out>_state.json: the same fingerprint, so an output collected before this plan resumes
    legacy = __import__("hashlib").sha256(b"num_repeats=3\n")
    for row in tasks:
        legacy.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS) + b"\n")
    assert plan.fingerprint() == input_fingerprint(tasks, 3) == legacy.hexdigest()


def test_fan_out_runs_a_row_through_each_listed_agent_numbering_its_rollouts_on():
    tasks = [task("agent", x=0), task(None, x=1, task_source="ds"), task("agent", x=2)]
    plan = plan_rollouts(tasks, ["old", "ds", "agent"], 2, {"old": ["b", "agent"], "ds": ["c"]})
    row_of = plan.row_of()
    dispatched = {pair: row_of(pair)["agent_ref"]["name"] for pair in plan.pairs()}
    assert dispatched == {
        (0, 0): "b",
        (0, 1): "b",
        (0, 2): "agent",
        (0, 3): "agent",
        (1, 0): "c",
        (1, 1): "c",
        (2, 0): "agent",
        (2, 1): "agent",
    }
    assert plan.num_repeats is None and plan.state_repeats() == [4, 2, 2]
    assert row_of((0, 2)) is tasks[0]  # the row's own agent: its row as it was, agent_ref dict and all
    # interleaved: rollout index by rollout index, a task's second agent after every first one (0.7.0's stable sort)
    assert plan.pairs(interleave_repeats=True)[:4] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert plan.fingerprint() != plan_rollouts(tasks, ["old", "ds", "agent"], 2).fingerprint()


@pytest.mark.parametrize(
    ("num_repeats", "expected"),
    [
        ({"agent": 3, "ds": 1, "_default": 2}, [3, 3, 2, 3]),  # the dispatched agent's entry wins over the key's
        ({"ds": 1, "_default": 2}, [2, 1, 2, 1]),  # else the routing key's, as written before agent_map
        ({"b": 5, "ds": 1, "_default": 4}, [4, 1, 5, 1]),
    ],
)
def test_num_repeats_by_agent_or_routing_key(num_repeats, expected):
    tasks = [task("agent"), task("agent", task_source="ds"), task("b"), task("agent", task_source="ds")]
    plan = plan_rollouts(tasks, ["agent", "ds", "b", "ds"], num_repeats)
    assert plan.rollouts_per_task() == expected
    assert plan.pairs() == [(t, r) for t, n in enumerate(expected) for r in range(n)]


def test_a_row_no_entry_of_num_repeats_matches_is_refused_naming_it(capsys):
    tasks = [task("agent"), task("b"), task("c")]
    with pytest.raises(
        DataError, match=r"in\.jsonl:8: num_repeats has no entry for b and no '_default' \(unmatched: b, c"
    ):
        plan_rollouts(tasks, ["agent", "b", "c"], {"agent": 2, "typo": 1}, where=lambda t: f"in.jsonl:{t + 7}")
    plan_rollouts(tasks, ["agent", "b", "c"], {"agent": 2, "typo": 1, "_default": 1})
    assert "no row routes by typo (a typo?)" in capsys.readouterr().err


def test_the_routing_key_is_the_agent_ref_name_as_written_else_the_taskset_else_the_task_source():
    assert routing_key({"agent_ref": {"name": "a"}, "task_source": "ds"}) == "a"
    materialized = {"task_id": {"taskset": "sim:example", "task_id": "7"}, "task_input": {}, "task_source": "ds"}
    assert routing_key(materialized) == "sim:example"
    assert routing_key({"task_source": "ds"}) == "ds"
    assert routing_key({"agent_ref": None, "task_source": ["not", "a", "name"]}) is None
    assert RolloutPlan.uniform([], 1).total == 0


# -- ng_collect_rollouts --------------------------------------------------------------------------------------
def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fan_out": {"ds": []}}, r"fan_out\n.*fan_out\['ds'\] lists no agent"),
        ({"fan_out": {"ds": ["agent", "agent"]}}, r"lists \['agent'\] more than once: use num_repeats"),
        ({"num_repeats": 0}, r"num_repeats\n.*must be at least 1, got 0"),
        ({"num_repeats": {"agent": 2, "_default": 0}}, r"num_repeats\n.*must be at least 1, got \{'_default': 0\}"),
    ],
)
def test_bad_fan_out_and_num_repeats_are_refused(tmp_path, gym, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, gym, **overrides)


def test_fan_out_collects_a_row_through_each_agent_and_resumes(tmp_path, gym, agent):
    write_rows(
        tmp_path / "in.jsonl",
        [
            {"responses_create_params": {"input": "a"}, "x": 0, "task_source": "ds"},
            {"responses_create_params": {"input": "b"}, "x": 1, "agent_ref": {"name": "agent"}},
        ],
    )
    metrics_agent = gym["metrics_agent"]
    cfg = config(tmp_path, gym, num_repeats=2, fan_out={"ds": ["metrics_agent", "agent"]})
    summary = collect(cfg)
    assert summary.rollouts_expected == summary.rollouts_done == 6
    rows = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in rows_of(cfg.output_jsonl_fpath)}
    assert {pair: row["agent_ref"]["name"] for pair, row in rows.items()} == {
        (0, 0): "metrics_agent",
        (0, 1): "metrics_agent",
        (0, 2): "agent",
        (0, 3): "agent",
        (1, 0): "agent",
        (1, 1): "agent",
    }
    assert set(metrics_agent.calls) == {(0, 0), (0, 1)} and set(agent.calls) == {(0, 2), (0, 3), (1, 0), (1, 1)}
    assert rows[(0, 3)]["reward"] == pytest.approx(0.3)  # the rollout index goes on across the agents
    paths = OutputPaths.for_output(cfg.output_jsonl_fpath)
    assert len(rows_of(paths.materialized_inputs)) == 6
    assert json.loads(paths.state.read_text())["num_repeats"] == [4, 2]
    metrics = json.loads(paths.aggregate_metrics.read_text())
    assert {a["agent_ref"]["name"]: a["agent_metrics"].get("n") for a in metrics["agents"]} == {
        "agent": None,
        "metrics_agent": 2,
    }
    # every task has all its rollouts: none is "missing" for ng_eval
    assert [t.excluded for t in load_task_results(cfg.output_jsonl_fpath)] == [None, None]

    agent.reset()
    metrics_agent.reset()
    assert collect(cfg).rollouts_resumed == 6 and not agent.calls and not metrics_agent.calls
    with pytest.raises(ConfigError, match=r"num_repeats was \[4, 2\], now 2"):
        collect(config(tmp_path, gym, num_repeats=2))


def test_num_repeats_by_agent_collects_each_rows_count(tmp_path, gym, agent):
    write_rows(
        tmp_path / "in.jsonl",
        [
            {"responses_create_params": {"input": "a"}, "x": 0, "agent_ref": {"name": "old"}},
            {"responses_create_params": {"input": "b"}, "x": 1, "agent_ref": {"name": "metrics_agent"}},
            {"responses_create_params": {"input": "c"}, "x": 2},
        ],
    )
    cfg = config(
        tmp_path, gym, agent_map={"old": "metrics_agent"}, num_repeats={"old": 3, "metrics_agent": 2, "_default": 1}
    )
    collect(cfg)
    counts: dict[int, int] = {}
    for row in rows_of(cfg.output_jsonl_fpath):
        counts[row["_ng_task_index"]] = counts.get(row["_ng_task_index"], 0) + 1
    # row 0: routed to metrics_agent by agent_map, whose entry wins over its routing key's (old); row 2: _default
    assert counts == {0: 2, 1: 2, 2: 1}

    agent.reset()
    write_rows(tmp_path / "b.jsonl", [{"responses_create_params": {"input": "a"}, "x": 0}])
    with pytest.raises(DataError, match=r"b\.jsonl:1: num_repeats has no entry for agent"):
        collect(config(tmp_path / "b", gym, input_jsonl_fpath=str(tmp_path / "b.jsonl"), num_repeats={"x": 2}))
    assert not agent.calls
