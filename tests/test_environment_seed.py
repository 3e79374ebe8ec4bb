"""NeMo Gym 0.7.0's environment-server session protocol on our resources servers (`EnvironmentSeedRequest`): a
`/seed_session` body `{resources_session_id, episode_id, task_id, task_data}` seeds the session the caller names from
`task_data` (the row's fields) and answers `{resources_session_id}` with the session cookie; seeding the same id
again keeps that session; `/close_session` with `{resources_session_id, episode_id}` ends it, and a seed of a closed
id is refused (409); dataset rows seed as before. Our example_session_state_mgmt server, real HTTP through
FastAPI's TestClient."""

from __future__ import annotations

from fastapi.testclient import TestClient

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.serving.client import SESSION_COOKIE
from nemo_gym.serving.entrypoint import load_server_class

EPISODE = {"rollout_id": "0-0", "attempt": 0}
TASK = {"taskset": "example", "task_id": "0"}


def seed(session_id: str, initial_count: int) -> dict:
    task_data = {"initial_count": initial_count, "expected_count": initial_count + 2}
    return {"resources_session_id": session_id, "episode_id": EPISODE, "task_id": TASK, "task_data": task_data}


def test_an_environment_server_seeds_uses_and_closes_a_named_session():
    server_class = load_server_class(REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "app.py")
    with TestClient(server_class(name="counter").build_app()) as client:
        seeded = client.post("/seed_session", json=seed("s1", 5))
        assert (seeded.status_code, seeded.json()) == (200, {"resources_session_id": "s1"})
        assert seeded.cookies[SESSION_COOKIE] == "s1"
        # the client keeps the cookie, as 0.7.0's environment server hands it to the agent and sends it to /verify
        assert client.post("/increment_counter", json={"count": 2}).json() == {"success": True}
        again = client.post("/seed_session", json=seed("s1", 100))  # the same id: its session, not a new one
        assert again.json() == {"resources_session_id": "s1"}
        assert client.post("/get_counter_value", json={}).json() == {"count": 7}
        row = {**seed("s1", 5)["task_data"], "responses_create_params": {"input": "x"}, "response": {"output": []}}
        assert client.post("/verify", json=row).json()["reward"] == 1.0
        closed = client.post("/close_session", json={"resources_session_id": "s1", "episode_id": EPISODE})
        assert closed.json() == {"resources_session_id": "s1"}
        assert client.post("/get_counter_value", json={}).json() == {"count": 0}  # s1 is gone: a new session
        refused = client.post("/seed_session", json=seed("s1", 5))
        assert refused.status_code == 409 and "was closed" in refused.text
        bad = client.post("/seed_session", json={**seed("s2", 5), "task_data": {"no_count": 1}})
        assert bad.status_code == 422  # task_data is validated as the row is (initial_count is required)
        assert client.post("/seed_session", json={"initial_count": 3}).status_code == 200  # a dataset row, as before
