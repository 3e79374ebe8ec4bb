"""Statistics of rewards and of the numbers of verify answers: `describe` (NeMo Gym 0.4.0's five statistics, used by
`ng_profile` and `ng_reward_profile`) and NeMo Gym 0.4.0's `/aggregate_metrics` answer (`nemo_gym_aggregate_metrics`,
which every `ResourcesServer` answers beside its own metrics), with the per-group statistics it is made of
(`profile_groups`, also the rows of `ng_reward_profile`'s files: `nemo_gym.upstream.reward_profile`).

Statistics over the values a field has in a group (fields a rollout lacks are skipped, as pandas skips NaN): `std` is
the sample standard deviation (divides by n - 1); a group of one rollout has std 0.0 for each of its fields, and a
field with one value among several rollouts has no std key (NeMo Gym: `DataFrame.std`, ddof=1, whose NaNs it replaces
by 0 only when the whole group has no std). Numbers are floats; means are exact sums, so they may differ from pandas's
in the last bits (tests/test_reward_profile_parity.py compares with a relative tolerance of 1e-12).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from nemo_gym.common.jsonl import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

__all__ = [
    "MASK_SAMPLE_KEY",
    "STATS",
    "describe",
    "is_number",
    "mask_reason",
    "numeric_fields",
    "profile_groups",
    "nemo_gym_aggregate_metrics",
]

Pair = tuple[int, int]  # (task index, rollout index)


STATS = ("mean", "max", "min", "median", "std")  # the statistics of `describe`, in NeMo Gym 0.4.0's order

# NeMo Gym 0.7.0's verify answer field (`BaseVerifyResponse.mask_sample`): the environment or its infrastructure
# failed (a judge that did not answer, a lost session), so the reward is not a measurement of the policy
MASK_SAMPLE_KEY = "mask_sample"


def mask_reason(rollout: dict[str, Any]) -> str | None:
    """Why a rollout's reward is not a measurement, or None when it is: a rollout whose verify answer set
    `mask_sample: true` (NeMo Gym 0.7.0) is masked, its reason the answer's `failure_kind` (0.7.0's vocabulary, e.g.
    `judge_failed`), `"token_id_capture"` for a rollout that could not be rebuilt from its recorded model calls, or
    `"unspecified"`. Masked rollouts stay out of reward statistics (`ng_profile`; 0.7.0's
    `reward_profile.select_measured`) and out of GRPO's groups (`nemo_gym.train.grpo.StepGroups`)."""
    if rollout.get(MASK_SAMPLE_KEY) is not True:
        return None
    kind = rollout.get("failure_kind")
    if isinstance(kind, str) and kind:
        return kind
    # a rollout the collector could not rebuild from its recorded model calls (nemo_gym.collect.token_capture)
    return "token_id_capture" if isinstance(rollout.get("_ng_token_capture"), dict) else "unspecified"


def describe(values: list[float]) -> dict[str, float]:
    """`mean`, `max`, `min`, `median` and `std` of `values` (non-empty), each a float.

    `std` is the sample standard deviation, sqrt(sum((v - mean)^2) / (n - 1)), and 0.0 for a single value: the
    `std` of NeMo Gym 0.4.0's reward profile (pandas `DataFrame.std`, ddof=1). The mean is an exact sum
    (`statistics.fmean`), so it can differ from pandas's in the last bits.
    """
    return {
        "mean": statistics.fmean(values),
        "max": float(max(values)),
        "min": float(min(values)),
        "median": float(statistics.median(values)),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # booleans included: they count as 0/1


def _usage(rollout: dict[str, Any]) -> dict[str, Any]:
    response = rollout.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else {}


def _profiled(key: str, private_keys: bool) -> bool:
    """Whether a rollout's top-level key is profiled: not the two indices, and (NeMo Gym 0.7.0, `private_keys`
    False) no `_`-prefixed key at all."""
    return key not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY) and (private_keys or not key.startswith("_"))


def numeric_fields(rollout: dict[str, Any], private_keys: bool = True) -> dict[str, int | float]:
    """The fields profiled for one rollout: top-level numbers and booleans (as 0/1) with `response.usage`'s numbers
    merged over them, without `_ng_task_index` and `_ng_rollout_index` (and without any `_`-prefixed key when
    `private_keys` is False, as NeMo Gym 0.7.0 profiles)."""
    merged = {**{k: v for k, v in rollout.items() if _profiled(k, private_keys)}, **_usage(rollout)}
    return {k: int(v) if isinstance(v, bool) else v for k, v in merged.items() if is_number(v)}


def _rollout_info(pair: Pair, rollout: dict[str, Any], private_keys: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"rollout_id": f"{pair[0]}:{pair[1]}", TASK_INDEX_KEY: pair[0], ROLLOUT_INDEX_KEY: pair[1]}
    if "reward" in rollout:
        info["reward"] = rollout["reward"]
    own = ((k, v) for k, v in rollout.items() if _profiled(k, private_keys) and k not in ("reward", "response"))
    for k, v in [*_usage(rollout).items(), *own]:
        if is_number(v):
            info[k] = int(v) if isinstance(v, bool) else v
    return info


def _group_stats(rollouts: list[dict[str, int | float]], field_order: list[str]) -> dict[str, float]:
    """`<stat>/<field>` over one group's rollouts (their `numeric_fields`); see the module docstring for std."""
    values: dict[str, list[float]] = defaultdict(list)
    for fields in rollouts:
        for k, v in fields.items():
            values[k].append(v)
    described = {k: describe(v) for k, v in values.items()}
    for k, v in values.items():
        if len(v) == 1 and len(rollouts) > 1:  # one value among several rollouts: no std (pandas: NaN, dropped)
            del described[k]["std"]
    return {f"{stat}/{k}": described[k][stat] for stat in STATS for k in field_order if stat in described.get(k, {})}


def profile_groups(
    inputs: dict[Pair, dict[str, Any]],
    rollouts: dict[Pair, dict[str, Any]],
    private_keys: bool = True,
    per_agent: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of `<stem>_reward_profiling.jsonl` (one per task with rollouts) and of `<stem>_agent_metrics.json`
    (one per agent name) for materialized rows and their rollouts, both keyed by (task, rollout); see the module
    docstring for the fields. `rollouts` must be sorted by key; every rollout's pair is in `inputs`. `private_keys`
    False: `_`-prefixed fields are not profiled (NeMo Gym 0.7.0; 0.4.0 profiles all but the two indices).
    `per_agent` (NeMo Gym 0.7.0, when a task ran through several agents: `fan_out`): one row per (task, agent
    name), by task then name, each with its `agent_ref` after the statistics."""
    fields = {pair: numeric_fields(rollout, private_keys) for pair, rollout in rollouts.items()}
    field_order = list(dict.fromkeys(k for f in fields.values() for k in f))

    def group_of(pair: Pair) -> tuple[int, str | None]:
        return pair[0], inputs[pair]["agent_ref"]["name"] if per_agent else None

    expected: dict[tuple[int, str | None], int] = defaultdict(int)
    for pair in inputs:
        expected[group_of(pair)] += 1
    by_group: dict[tuple[int, str | None], list[Pair]] = defaultdict(list)
    by_agent: dict[str, list[Pair]] = defaultdict(list)
    for pair in rollouts:  # sorted by (task, rollout)
        by_group[group_of(pair)].append(pair)
        by_agent[inputs[pair]["agent_ref"]["name"]].append(pair)

    task_rows = []
    for group in sorted(by_group):
        pairs, agent = by_group[group], {"agent_ref": {"name": group[1]}} if per_agent else {}
        sample = {k: v for k, v in inputs[pairs[0]].items() if k not in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY)}
        task_rows.append(
            {
                TASK_INDEX_KEY: group[0],
                **_group_stats([fields[p] for p in pairs], field_order),
                **agent,
                "sample": sample,
                "num_rollouts": len(pairs),
                "expected_num_rollouts": expected[group],
                "missing_num_rollouts": expected[group] - len(pairs),
                "reward_profile_completion_pct": 100.0 * len(pairs) / expected[group],
                "rollout_infos": [_rollout_info(p, rollouts[p], private_keys) for p in pairs],
            }
        )
    agent_rows = [
        {**_group_stats([fields[p] for p in by_agent[name]], field_order), "agent_ref": {"name": name}}
        for name in sorted(by_agent)
    ]
    return task_rows, agent_rows


def nemo_gym_aggregate_metrics(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """NeMo Gym 0.4.0's `/aggregate_metrics` answer (`AggregateMetrics`) for verify answers: `group_level_metrics`
    (one `profile_groups` task row per `_ng_task_index`), `agent_metrics` (the statistics over all of them) and
    `key_metrics` (its `mean/*` entries, NeMo Gym's default headline). Answers without indices count as task 0,
    numbered in order, as NeMo Gym does; `{}`-valued keys for no answers."""
    if not verify_responses:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    inputs: dict[Pair, dict[str, Any]] = {}
    rollouts: dict[Pair, dict[str, Any]] = {}
    for answer in verify_responses:
        task, rollout = answer.get(TASK_INDEX_KEY, 0), answer.get(ROLLOUT_INDEX_KEY, 0)
        while (task, rollout) in rollouts:  # repeated or missing indices: the next free rollout number
            rollout += 1
        inputs[task, rollout] = {TASK_INDEX_KEY: task, ROLLOUT_INDEX_KEY: rollout, "agent_ref": {"name": "agent"}}
        rollouts[task, rollout] = answer
    task_rows, agent_rows = profile_groups(inputs, dict(sorted(rollouts.items())))
    agent_metrics = {k: v for k, v in agent_rows[0].items() if k != "agent_ref"}
    return {
        "group_level_metrics": task_rows,
        "agent_metrics": agent_metrics,
        "key_metrics": {k: v for k, v in agent_metrics.items() if k.startswith("mean/")},
    }
