"""nemo_gym.env.gymnasium over real HTTP (FastAPI TestClient) with a tiny game defined here: the generated
`reset` tool, `/step`, 409s, sessions, verify of the session's episode and replay of a stored trajectory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import Field

from nemo_gym.env.gymnasium import GymnasiumEnv, StepResult, assistant_actions, message_text
from nemo_gym.env.resources_server import VerifyRequest, VerifyResult
from nemo_gym.env.testing import episode_response


@dataclass
class Countdown:
    """Say numbers from `start` down to 0; a wrong number ends the game, `max_turns` turns truncate it."""

    next: int
    max_turns: int
    turns: int = 0
    total_reward: float = 0.0


class CountdownRequest(VerifyRequest):
    start: int = Field(ge=0, le=9, description="the first number to say")
    max_turns: int = Field(5, ge=1, description="turns before the game is truncated")


class CountdownEnv(GymnasiumEnv):
    verify_request_type = CountdownRequest
    reset_description = "Start counting down from `start`."

    def new_episode(self, task: Any) -> Countdown:
        return Countdown(next=task.start, max_turns=task.max_turns)

    def reset_observation(self, episode: Countdown) -> tuple[str, dict[str, Any]]:
        return f"Say {episode.next}.", {"start": episode.next}

    def play(self, episode: Countdown, action: str) -> StepResult:
        episode.turns += 1
        right = action.strip() == str(episode.next)
        reward = 1.0 if right else -1.0
        episode.total_reward += reward
        episode.next -= 1
        terminated = not right or episode.next < 0
        return StepResult(
            observation="ok" if right else "wrong",
            reward=reward,
            terminated=terminated,
            truncated=not terminated and episode.turns >= episode.max_turns,
            info={"turns": episode.turns},
        )

    def score(self, episode: Countdown, finished: bool) -> VerifyResult:
        return VerifyResult(reward=max(episode.total_reward, 0.0) / 10, turns=episode.turns, finished=finished)


ROW = {"responses_create_params": {"input": []}, "start": 2}


@pytest.fixture
def client() -> Iterator[TestClient]:
    server = CountdownEnv(name="countdown")
    with TestClient(server.build_app()) as client:
        client.server = server
        yield client


def test_reset_tool_schema_is_the_task_fields(client: TestClient) -> None:
    tools = {t["name"]: t for t in client.get("/tools").json()}
    assert set(tools) == {"reset", "step"}
    reset = tools["reset"]
    assert reset["description"] == "Start counting down from `start`."
    assert reset["parameters"]["properties"]["start"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 9,
        "description": "the first number to say",
    }
    assert reset["parameters"]["required"] == ["start"]  # max_turns has a default
    assert tools["step"]["parameters"]["required"] == ["action"]


def test_reset_step_until_terminated(client: TestClient) -> None:
    headers = {"X-Session-Id": "s"}
    assert client.post("/reset", json={"start": 1}, headers=headers).json() == {
        "observation": "Say 1.",
        "info": {"start": 1},
    }
    step = client.post("/step", json={"action": "1"}, headers=headers).json()
    assert step == {"observation": "ok", "reward": 1.0, "terminated": False, "truncated": False, "info": {"turns": 1}}
    assert client.post("/step", json={"action": "0"}, headers=headers).json()["terminated"] is True
    over = client.post("/step", json={"action": "0"}, headers=headers)
    assert over.status_code == 409 and "over" in over.text
    # a new reset starts again in the same session
    assert client.post("/reset", json={"start": 0}, headers=headers).status_code == 200
    assert client.post("/step", json={"action": "0"}, headers=headers).json()["terminated"] is True


def test_truncation_ends_the_episode(client: TestClient) -> None:
    headers = {"X-Session-Id": "t"}
    client.post("/reset", json={"start": 9, "max_turns": 1}, headers=headers)
    step = client.post("/step", json={"action": "9"}, headers=headers).json()
    assert step["truncated"] is True and step["terminated"] is False
    assert client.post("/step", json={"action": "8"}, headers=headers).status_code == 409


def test_bad_requests_are_4xx(client: TestClient) -> None:
    assert client.post("/step", json={"action": "1"}, headers={"X-Session-Id": "none"}).status_code == 409
    for body in ({}, {"start": 10}, {"start": "two"}, {"start": 1, "extra": 1}):
        assert client.post("/reset", json=body, headers={"X-Session-Id": "x"}).status_code == 422, body
    assert client.post("/step", json={"action": 3}, headers={"X-Session-Id": "x"}).status_code == 422


def test_verify_scores_the_sessions_episode_of_the_same_task(client: TestClient) -> None:
    headers = {"X-Session-Id": "v"}
    client.post("/reset", json={"start": 2}, headers=headers)
    for action in ("2", "1", "0"):
        client.post("/step", json={"action": action}, headers=headers)
    verified = client.post("/verify", json={**ROW, "response": episode_response("junk")}, headers=headers).json()
    assert (
        verified["reward"] == 0.3
        and verified["replayed"] is False
        and verified["finished"] is True
        and verified["turns"] == 3
    )


def test_verify_replays_the_trajectory_without_a_matching_episode(client: TestClient) -> None:
    headers = {"X-Session-Id": "r"}
    client.post("/reset", json={"start": 5}, headers=headers)  # another task: not used for the row's
    verified = client.post(
        "/verify", json={**ROW, "response": episode_response("2", "1", "0", "ignored")}, headers=headers
    ).json()
    assert verified["reward"] == 0.3 and verified["replayed"] is True and verified["turns"] == 3  # stops at terminated
    unfinished = client.post("/verify", json={**ROW, "response": episode_response("2")}).json()
    assert unfinished["finished"] is False and unfinished["turns"] == 1 and unfinished["replayed"] is True


@pytest.mark.parametrize(
    "output", [[], None, "text", [None, 3, {"type": "message", "role": "assistant", "content": 5}]]
)
def test_verify_survives_malformed_trajectories(client: TestClient, output: Any) -> None:
    verified = client.post("/verify", json={**ROW, "response": {"output": output}})
    assert verified.status_code == 200 and verified.json()["reward"] == 0.0


def test_verify_rejects_a_row_without_task_fields(client: TestClient) -> None:
    assert (
        client.post("/verify", json={"responses_create_params": {"input": []}, "response": {"output": []}}).status_code
        == 422
    )


def test_assistant_actions_one_per_model_turn() -> None:
    output = [
        {"type": "message", "role": "user", "content": "obs"},
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "message", "role": "assistant", "content": "b"},
        {"type": "message", "role": "user", "content": "obs"},
        {"role": "assistant", "content": [{"text": "c"}, {"text": 5}]},  # type defaults to message
    ]
    assert assistant_actions({"output": output}) == ["ab", "c"]
    assert assistant_actions({"output": "x"}) == [] and message_text({"content": None}) == "" and message_text(3) == ""
