"""Our `ng_reward_profile` and NVIDIA NeMo Gym 0.4.0's own `ng_reward_profile` on the same files give the same
output: NeMo Gym-written rollouts (the example collections its wheel ships with their materialized inputs) and
rollouts written by our collector. Same files, same keys, same types, the same values; floats equal within a
relative 1e-12 (our means and stds use exact sums, pandas's differ in the last bits). `ng_profile`'s per-task
avg/std/min/max/median_reward and total_samples equal NeMo Gym's mean/std/min/max/median/reward and num_rollouts.

NeMo Gym is installed by `nemo_gym_peer.peer_venv()` (minutes, once); its command runs in its own venv with a
temporary folder as working directory (Hydra writes `outputs/` there)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_servers import serve
from nemo_gym_peer import peer_env, peer_server_dir, peer_venv

from nemo_gym.collect.command import CollectConfig, collect_main
from nemo_gym.collect.files import OutputPaths
from nemo_gym.collect.profile import profile_rollouts
from nemo_gym.common.errors import ServerUnavailableError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.agent_server import AgentServer
from nemo_gym.serving.head import build_head_app

pytestmark = [pytest.mark.integration, pytest.mark.peer]

BIN = Path(sys.executable).parent
# NeMo Gym 0.4.0 example collections with their _materialized_inputs: blackjack has one task of 5 rollouts with
# rewards [-1, 1, -1, 1, 1] (std/reward 1.0954 = the sample std; population: 0.9798); longmt_eval has sparse task
# indices and continuous rewards; grl_tetris negative rewards and booleans; asr_with_pc and cvdp many verifier fields.
PEER_EXAMPLES = ["blackjack", "longmt_eval", "grl_tetris", "asr_with_pc", "cvdp"]
REWARD_STATS = {
    "avg_reward": "mean/reward",
    "std_reward": "std/reward",
    "min_reward": "min/reward",
    "max_reward": "max/reward",
    "median_reward": "median/reward",
}


def both_profiles(
    tmp_path: Path, materialized: Path, rollouts: Path, *extra: str
) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Run NeMo Gym's and our ng_reward_profile, each on its own copy of the two files; name → (process, folder)."""
    out = {}
    for name, command, env, release in [
        ("nemo_gym", peer_venv() / "bin" / "ng_reward_profile", peer_env(), []),
        ("ours", BIN / "ng_reward_profile", None, ["+nemo_gym_version=0.4.0"]),  # 0.4.0's output (ours: 0.7.0's)
    ]:
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(materialized, folder / "rollouts_materialized_inputs.jsonl")
        shutil.copy(rollouts, folder / "rollouts.jsonl")
        args = [
            str(command),
            "+materialized_inputs_jsonl_fpath=rollouts_materialized_inputs.jsonl",
            "+rollouts_jsonl_fpath=rollouts.jsonl",
            *extra,
            *release,
        ]
        out[name] = (subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=300), folder)
    return out


def outputs(folder: Path) -> tuple[list[dict], list[dict]]:
    profiling = read_jsonl(folder / "rollouts_reward_profiling.jsonl")
    return profiling, json.loads((folder / "rollouts_agent_metrics.json").read_text())


def assert_same(theirs: Any, ours: Any, where: str = "") -> None:
    """Equal structure, keys and types; floats within a relative 1e-12 (1e-12 absolute near 0)."""
    assert type(ours) is type(theirs), f"{where}: {theirs!r} vs {ours!r}"
    if isinstance(theirs, dict):
        assert set(ours) == set(theirs), (
            f"{where}: keys only in NeMo Gym's {set(theirs) - set(ours)}, only in ours {set(ours) - set(theirs)}"
        )
        for key in theirs:
            assert_same(theirs[key], ours[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(theirs, ours)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float):
        assert math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=1e-12), f"{where}: NeMo Gym {theirs!r}, ours {ours!r}"
    else:
        assert ours == theirs, f"{where}: NeMo Gym {theirs!r}, ours {ours!r}"


def assert_parity(runs: dict[str, tuple[subprocess.CompletedProcess, Path]]) -> tuple[list[dict], list[dict]]:
    for name, (done, _) in runs.items():
        assert done.returncode == 0, f"{name}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    theirs, ours = outputs(runs["nemo_gym"][1]), outputs(runs["ours"][1])
    assert_same(theirs[0], ours[0], "reward_profiling")
    assert_same(theirs[1], ours[1], "agent_metrics")
    return theirs


def assert_ng_profile_agrees(tmp_path: Path, materialized: Path, rollouts: Path, theirs: list[dict]) -> None:
    """ng_profile with the materialized inputs as its task file: per task, NeMo Gym's reward numbers."""
    profile_rollouts(str(materialized), str(rollouts), str(tmp_path / "ng_profile.jsonl"))
    rows = read_jsonl(tmp_path / "ng_profile.jsonl")
    assert len(rows) == len(theirs)
    for ours, task in zip(rows, theirs):
        for our_key, their_key in REWARD_STATS.items():
            assert math.isclose(ours[our_key], task[their_key], rel_tol=1e-12, abs_tol=1e-12), (
                task["_ng_task_index"],
                our_key,
            )
        assert ours["total_samples"] == task["num_rollouts"]


@pytest.mark.parametrize("example", PEER_EXAMPLES)
def test_nemo_gym_rollouts_profile_the_same(tmp_path, example):
    data = peer_server_dir("resources_servers", example) / "data"
    materialized, rollouts = data / "example_rollouts_materialized_inputs.jsonl", data / "example_rollouts.jsonl"
    theirs = assert_parity(both_profiles(tmp_path, materialized, rollouts))
    assert theirs[0] and all("std/reward" in task for task in theirs[0])
    if example == "blackjack":  # the worked example: rewards [-1, 1, -1, 1, 1]; squared deviations from 0.2 sum to 4.8
        assert theirs[0][0]["std/reward"] == pytest.approx(math.sqrt(4.8 / 4), rel=1e-12)  # n - 1 = 4, not n = 5
    assert_ng_profile_agrees(tmp_path, materialized, rollouts, theirs[0])


class ProfiledAgent(AgentServer):
    """Rollout (t, r): reward REWARDS[t][r], `correct` (bool), usage tokens, `judge_score` in rollout 0 only;
    the pairs in FAILING fail (502), so task 3 is partial and task 4 has no rollout."""

    REWARDS = {0: [1.0, 0.0, 1.0], 1: [0.25, 0.5, 1.0], 2: [0.0, 0.0, 0.0], 3: [2.0, -1.0, 0.5], 4: [1.0, 1.0, 0.0]}
    FAILING = {(3, 1), (4, 0), (4, 1), (4, 2)}

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        task, index = row["_ng_task_index"], row["_ng_rollout_index"]
        if (task, index) in self.FAILING:
            raise ServerUnavailableError("policy model unreachable", server="policy_model")
        usage = {
            "input_tokens": 10 + task,
            "output_tokens": 3 + 2 * index,
            "total_tokens": 13 + task + 2 * index,
            "input_tokens_details": {"cached_tokens": 0},
        }
        reward = self.REWARDS[task][index]
        answer = {**row, "response": {"output": [], "usage": usage}, "reward": reward, "correct": reward >= 1.0}
        return answer | ({"judge_score": 0.1 * task} if index == 0 else {})


@pytest.fixture
def our_collection(tmp_path) -> OutputPaths:
    """Rollouts written by our collector (ng_collect_rollouts' collect_main) from a real agent server on loopback:
    5 tasks x 3 repeats, agents agent_a (tasks 0-2) and agent_b (tasks 3-4, by their agent_ref), 4 failed pairs."""
    rows = [
        {
            "responses_create_params": {"input": f"task {t}"},
            "difficulty": t,
            **({"agent_ref": {"name": "agent_b"}} if t >= 3 else {}),
        }
        for t in range(5)
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = OutputPaths.for_output(tmp_path / "collected" / "rollouts.jsonl")
    with (
        serve(build_head_app()) as head,
        serve(ProfiledAgent(name="agent_a").build_app()) as url_a,
        serve(ProfiledAgent(name="agent_b").build_app()) as url_b,
    ):
        for name, url in [("agent_a", url_a), ("agent_b", url_b)]:
            registration = {
                "name": name,
                "server_type": "responses_api_agents",
                "implementation": "test",
                "url": url,
                "pid": os.getpid(),
            }
            httpx.post(head + "/register", json=registration, trust_env=False).raise_for_status()
        cfg = CollectConfig(
            agent_name="agent_a",
            input_jsonl_fpath=str(tmp_path / "in.jsonl"),
            output_jsonl_fpath=str(paths.output),
            num_repeats=3,
            head_server_url=head,
            progress=False,
            max_retries=0,
            num_samples_in_parallel=4,
        )
        assert collect_main(cfg) == 1  # 1: some rollouts failed (they are in the failures file)
    assert (
        len(paths.materialized_inputs.read_text().splitlines()) == 15
        and len(paths.output.read_text().splitlines()) == 11
    )
    return paths


def test_our_collector_rollouts_profile_the_same(tmp_path, our_collection):
    work = tmp_path / "profiles"
    (work / "strict").mkdir(parents=True)
    (work / "partial").mkdir()
    # a partial collection: both refuse it without allow_partial_rollouts
    refused = both_profiles(work / "strict", our_collection.materialized_inputs, our_collection.output)
    assert (
        refused["nemo_gym"][0].returncode != 0
        and "Missing rollout results for 4 materialized input rows" in refused["nemo_gym"][0].stderr
    )
    assert (
        refused["ours"][0].returncode == 2
        and "4 of 15 materialized input rows have no rollout" in refused["ours"][0].stderr
    )

    runs = both_profiles(
        work / "partial", our_collection.materialized_inputs, our_collection.output, "++allow_partial_rollouts=True"
    )
    tasks, agents = assert_parity(runs)
    assert [t["_ng_task_index"] for t in tasks] == [0, 1, 2, 3] and [a["agent_ref"]["name"] for a in agents] == [
        "agent_a",
        "agent_b",
    ]
    # task 0, rewards [1, 0, 1]: mean 2/3; squared deviations 1/9 + 4/9 + 1/9 = 6/9; / (3 - 1) = 1/3; std 0.5773503
    assert tasks[0]["std/reward"] == pytest.approx(math.sqrt(1 / 3), rel=1e-12)
    # task 3: rollouts 0 and 2 only, rewards [2, 0.5]: std sqrt((0.75^2 * 2) / 1) = 1.0606602; judge_score is in one of
    # them: no std
    assert (tasks[3]["num_rollouts"], tasks[3]["missing_num_rollouts"]) == (2, 1) and tasks[3][
        "std/reward"
    ] == pytest.approx(1.0606602, abs=1e-7)
    assert "mean/judge_score" in tasks[3] and "std/judge_score" not in tasks[3]
    assert (
        "Input rows: 5 total; 3 complete; 1 partial; 1 without rollouts dropped from output." in runs["ours"][0].stdout
    )
    assert (
        "Input rows: 5 total; 3 complete; 1 partial; 1 without rollouts dropped from output."
        in runs["nemo_gym"][0].stdout
    )
    assert_ng_profile_agrees(work, our_collection.materialized_inputs, our_collection.output, tasks)
