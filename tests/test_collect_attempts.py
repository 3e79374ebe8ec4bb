"""Which failed rollouts a rerun sends again, and as which attempt (`nemo_gym.collect.attempts`), against NeMo Gym
0.7.0's own resume (`RolloutCollectionHelper._load_from_cache`, in its venv) on the same histories. The collection
end to end, real HTTP on loopback:
`tests/test_collect_routing.py::test_a_rerun_does_not_retry_a_terminal_failure_nor_one_that_used_its_attempts`.
"""

from __future__ import annotations

import json

import pytest
from nemo_gym_peer07 import peer07_json

from nemo_gym.collect.attempts import MAX_ATTEMPTS, TERMINAL, RerunPolicy, attempt

# (task index, failed attempts as (failure class, terminal) in order, finished); rollout index 0 each
HISTORIES = [
    (0, [], True),
    (1, [("environment_server_failed", False)], False),
    (2, [("environment_server_failed", True)], False),
    (3, [("timeout", False), ("timeout", False)], False),
    (4, [("timeout", False)] * 3, False),
    (5, [("timeout_exceeded", True)], False),
    (6, [("skipped", False)], False),
    (7, [("skipped", True)], False),
    (8, [("reference_missing", False), ("eval_missing", True)], False),
    (9, [], False),
    (10, [("agent_run_error", False)] * 2, True),
]
SETTINGS = [(None, False), ("2", False), ("4", True), ("1", True)]  # NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, retry flag

PEER_RESUME = """
import json, sys
from pathlib import Path
from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
case = json.loads(sys.argv[1])
out = Path(case["dir"]) / "rollouts.jsonl"
config = RolloutCollectionConfig(
    input_jsonl_fpath=str(out), output_jsonl_fpath=str(out), retry_terminal_timeouts=case["flag"]
)
rows, _, _, _ = RolloutCollectionHelper()._load_from_cache(config)
print(json.dumps([[row["_ng_task_index"], row.get("_ng_attempt_index")] for row in rows]))
"""


def _their_files(directory) -> None:
    """The histories as 0.7.0's collector leaves them: materialized inputs, finished rollouts, a sidecar row per
    failed attempt (`_ng_failure_class`, `_ng_failure_terminal` when stamped)."""
    inputs, rollouts, sidecar = [], [], []
    for task, failed, finished in HISTORIES:
        key = {"_ng_task_index": task, "_ng_rollout_index": 0}
        inputs.append({**key, "responses_create_params": {"input": "q"}, "agent_ref": {"name": "agent"}})
        for index, (failure_class, terminal) in enumerate(failed):
            record = {**key, "_ng_failure_class": failure_class, **({"_ng_attempt_index": index} if index else {})}
            sidecar.append({**record, "_ng_failure_terminal": True} if terminal else record)
        if finished:
            rollouts.append({**key, "reward": 1.0})
    for name, rows in (
        ("rollouts_materialized_inputs", inputs),
        ("rollouts", rollouts),
        ("rollouts_failures", sidecar),
    ):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _ours(max_attempts: int, retry_terminal_timeouts: bool) -> list[list[int | None]]:
    """What we send on a rerun of the same histories: our failures file keeps each pair's last failed attempt (a
    pair whose failure was terminal is never sent again, so its last record is the terminal one)."""
    policy = RerunPolicy(max_attempts, retry_terminal_timeouts)
    sent = []
    for task, failed, finished in HISTORIES:
        row = {"_ng_task_index": task, "_ng_rollout_index": 0}
        if finished:
            continue
        record = None
        if failed:
            failure_class, terminal = failed[-1]
            record = {**row, "failure_class": failure_class, "_ng_attempt_index": len(failed) - 1}
            record = {**record, TERMINAL: True} if terminal else record
        if record is None or policy.held(record) is None:
            sent.append([task, attempt(row, record).get("_ng_attempt_index")])
    return sent


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("env_max", "flag"), SETTINGS)
def test_a_rerun_sends_what_0_7_0_sends(tmp_path, env_max, flag):
    """NeMo Gym 0.7.0's `_load_from_cache` on the same histories sends the same rollouts as the same attempts:
    terminal failures held (0.7.0's `retry_terminal_timeouts` retrying its timeout and repairable classes, never
    `skipped`), a rollout held after its max attempts."""
    _their_files(tmp_path)
    env = {"NEMO_GYM_MAX_ROLLOUT_ATTEMPTS": env_max} if env_max else {}
    theirs = peer07_json(PEER_RESUME, json.dumps({"dir": str(tmp_path), "flag": flag}), timeout=200, **env)
    assert theirs == _ours(int(env_max or 3), flag)


def test_what_a_rerun_holds_and_why():
    policy = RerunPolicy(max_attempts=2)
    assert policy.held({"failure_class": "timeout"}) is None  # attempt 0 failed: attempt 1 is sent
    assert policy.held({"failure_class": "timeout", "_ng_attempt_index": 1}) == MAX_ATTEMPTS
    assert policy.held({"failure_class": "timeout_exceeded", TERMINAL: True}) == TERMINAL
    assert (
        RerunPolicy(2, retry_terminal_timeouts=True).held({"failure_class": "timeout_exceeded", TERMINAL: True}) is None
    )
    assert RerunPolicy(9, retry_terminal_timeouts=True).held({"failure_class": "skipped"}) == TERMINAL
    assert attempt({"x": 1}, None) == {"x": 1}
    assert attempt({"x": 1}, {"_ng_attempt_index": 1}) == {"x": 1, "_ng_attempt_index": 2}
