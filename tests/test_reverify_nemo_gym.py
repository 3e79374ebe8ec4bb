"""Re-verify rollouts written by NVIDIA NeMo Gym with our resources servers, over HTTP.

For each server, every row of NeMo Gym's `data/example_rollouts.jsonl` (peer data, `../shared/peer_data`
beside the repo) goes through our `/verify` and must get the stored `reward` and stored verifier fields.
A rollout row keeps only NeMo Gym's verify answer, which for some servers drops task fields (mcqa's
`options`, the counter's `expected_count`), so each rollout is joined with its task row of
`data/example.jsonl` by the prompt, as NeMo Gym's own re-verification joins rollouts with the materialized
inputs. Before verifying, the trajectory's function calls are replayed against our tool routes, in the
rollout's session (`X-Session-Id`), and each answer must equal the `function_call_output` NeMo Gym recorded;
this is what rebuilds the counter of `example_session_state_mgmt`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.serving.entrypoint import load_server_class

REPO_ROOT = Path(__file__).resolve().parents[1]
PEER_SERVERS = REPO_ROOT.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
SERVERS = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt", "mcqa"]

# Server configs under which NeMo Gym's stored rewards are reproduced exactly. NeMo Gym's mcqa rollouts were
# scored before 0.7.0, which read the first \boxed{} holding a lone letter; see DRIFT_0_7_0 for the default.
STORED_SCORING_CONFIG = {"mcqa": {"legacy_boxed_parsing": True}}
# Where NeMo Gym 0.7.0's verifier (our default config) disagrees with the stored row, and what it gives:
# rollout 2 (0-based) of mcqa answers "\boxed{C: An individual ...}"; 0.7.0 reads the leading "C:" label (gold C).
DRIFT_0_7_0 = {("mcqa", 2): {"reward": 1.0, "extracted_answer": "C"}}

pytestmark = pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason=f"NeMo Gym peer data not found at {PEER_SERVERS}")


def prompt_key(row: dict[str, Any]) -> str:
    """The prompt of a row, without the fields the Responses API adds when it echoes it (e.g. `type`)."""
    messages = row["responses_create_params"]["input"]
    if isinstance(messages, str):
        return messages
    return json.dumps([(m.get("role"), m.get("content")) for m in messages])


def rollout_cases(name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(task row, stored rollout) pairs of a server's example rollouts."""
    tasks = {prompt_key(row): row for row in read_jsonl(PEER_SERVERS / name / "data" / "example.jsonl")}
    rollouts = read_jsonl(PEER_SERVERS / name / "data" / "example_rollouts.jsonl")
    return [(tasks[prompt_key(rollout)], rollout) for rollout in rollouts]


def make_client(name: str, config: dict[str, Any] | None = None) -> TestClient:
    cls = load_server_class(REPO_ROOT / "resources_servers" / name / "app.py")
    return TestClient(cls(config or {}, name=name).build_app())


def replay_tool_calls(client: TestClient, rollout: dict[str, Any], headers: dict[str, str]) -> None:
    """Send each function call of the trajectory to our tool route; compare with NeMo Gym's recorded output."""
    output = rollout["response"]["output"]
    recorded = {
        item["call_id"]: json.loads(item["output"]) for item in output if item["type"] == "function_call_output"
    }
    for call in (item for item in output if item["type"] == "function_call"):
        answer = client.post(f"/{call['name']}", json=json.loads(call["arguments"]), headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json() == recorded[call["call_id"]], f"tool {call['name']} answered differently from NeMo Gym"


def reverify(client: TestClient, task: dict[str, Any], rollout: dict[str, Any], session_id: str) -> dict[str, Any]:
    """Seed, replay the tools and verify one rollout in its own session; returns our verify answer."""
    headers = {"X-Session-Id": session_id}
    assert client.post("/seed_session", json=task, headers=headers).status_code == 200
    replay_tool_calls(client, rollout, headers)
    body = {**task, "responses_create_params": rollout["responses_create_params"], "response": rollout["response"]}
    answer = client.post("/verify", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stored_verifier_fields(rollout: dict[str, Any]) -> dict[str, Any]:
    """`reward` and the verifier fields NeMo Gym stored (e.g. `extracted_answer`, `set_overlap`)."""
    return {k: v for k, v in rollout.items() if k not in ("responses_create_params", "response")}


@pytest.mark.parametrize("name", SERVERS)
def test_stored_rewards_and_verifier_fields_are_reproduced(name: str) -> None:
    with make_client(name, STORED_SCORING_CONFIG.get(name)) as client:
        for index, (task, rollout) in enumerate(rollout_cases(name)):
            answer = reverify(client, task, rollout, session_id=f"{name}-{index}")
            expected = stored_verifier_fields(rollout)
            assert {k: answer.get(k) for k in expected} == expected, f"{name} rollout {index}"
            assert isinstance(answer["reward"], float)


@pytest.mark.parametrize("name", SERVERS)
def test_default_config_matches_nemo_gym_0_7_0(name: str) -> None:
    """Our default config scores as NeMo Gym 0.7.0: the stored values, except the listed drifts."""
    with make_client(name) as client:
        for index, (task, rollout) in enumerate(rollout_cases(name)):
            answer = reverify(client, task, rollout, session_id=f"{name}-default-{index}")
            expected = {**stored_verifier_fields(rollout), **DRIFT_0_7_0.get((name, index), {})}
            assert {k: answer.get(k) for k in expected} == expected, f"{name} rollout {index}"


def test_session_state_needs_the_replayed_calls() -> None:
    """Without the tool calls the counter stays at `initial_count`, so the stored reward 1.0 is not reached."""
    with make_client("example_session_state_mgmt") as client:
        task, rollout = rollout_cases("example_session_state_mgmt")[0]
        headers = {"X-Session-Id": "no-replay"}
        client.post("/seed_session", json=task, headers=headers)
        body = {**task, "responses_create_params": rollout["responses_create_params"], "response": rollout["response"]}
        assert client.post("/verify", json=body, headers=headers).json()["reward"] == 0.0


def verifier_cases() -> list[dict[str, Any]]:
    path = PEER_SERVERS / "example_single_tool_call" / "tests" / "verifier_cases.jsonl"
    return read_jsonl(path) if path.is_file() else []


@pytest.mark.parametrize("case", verifier_cases(), ids=lambda case: case["name"])
def test_nemo_gym_verifier_cases_of_example_single_tool_call(case: dict[str, Any]) -> None:
    with make_client("example_single_tool_call") as client:
        answer = client.post("/verify", json=case["request"])
    if case["kind"] == "malformed":
        assert 400 <= answer.status_code < 500, answer.text
        assert case["expected_error"] in answer.text
    else:
        assert answer.status_code == 200, answer.text
        assert answer.json()["reward"] == case["expected_reward"]
