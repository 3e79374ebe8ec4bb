"""nemo_gym.art with real server processes on loopback: `ServerProcess` (the way LocalBackend starts
vllm_model) serving scripted_model, and `ruler_score_group` judging through it with the llm_judge group
judge's prompt and parser. vLLM itself: tests/test_art_e2e.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import psutil
import pytest

import nemo_gym.art as art
from nemo_gym.art.ruler import RulerError
from nemo_gym.art.server_process import ServerProcess
from nemo_gym.common.errors import ServerStartError
from nemo_gym.common.layout import REPO_ROOT

pytestmark = pytest.mark.integration

SCRIPTED_APP = REPO_ROOT / "responses_api_models" / "scripted_model" / "app.py"
SCORES = json.dumps(
    {"scores": [{"id": "1", "score": 0.9, "explanation": "right"}, {"id": "2", "score": 0.2, "explanation": "wrong"}]}
)


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    """A scripted_model child process: a reply that is not JSON for groups mentioning BROKEN, else two scores."""
    config = {"model_name": "judge", "rules": [{"match": "BROKEN", "reply": "I like both."}], "default_reply": SCORES}
    server = ServerProcess(SCRIPTED_APP, config, name="judge", state_dir=tmp_path_factory.mktemp("judge"))
    asyncio.run(server.start(timeout_s=120))
    yield server
    server.stop()


def test_server_process_requires_its_token(judge_server):
    assert httpx.get(f"{judge_server.url}/health").status_code == 200
    body = {"model": "judge", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{judge_server.url}/v1/chat/completions", json=body).status_code == 401
    answer = httpx.post(
        f"{judge_server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {judge_server.token}"}
    )
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == SCORES


def answer(text: str) -> art.Trajectory:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": text},
    ]
    return art.Trajectory(messages_and_choices=messages, reward=0.0, metrics={"length": len(text)})


def judge_model(server: ServerProcess) -> art.Model:
    return art.Model("judge", inference_base_url=f"{server.url}/v1", inference_api_key=server.token)


def test_ruler_scores_distinct_trajectories_once_and_keeps_the_old_reward(judge_server):
    group = art.TrajectoryGroup([answer("Paris"), answer("Lyon"), answer("Paris")], metadata={"task": "capital"})
    scored = asyncio.run(art.ruler_score_group(group, judge_model(judge_server), reference="Paris"))
    assert scored.rewards == [0.9, 0.2, 0.9]  # identical trajectories: one judged entry, one score
    assert [t.metrics["independent_reward"] for t in scored] == [0.0, 0.0, 0.0]
    assert [t.metrics["ruler_score"] for t in scored] == [0.9, 0.2, 0.9] and scored.trajectories[0].metrics[
        "length"
    ] == 5
    assert scored.metadata == {"task": "capital"} and group.rewards == [0.0, 0.0, 0.0]  # the input is unchanged


def test_ruler_fails_typed_or_swallows(judge_server):
    group = art.TrajectoryGroup([answer("BROKEN"), answer("Lyon")])
    with pytest.raises(RulerError, match="no valid scores in 2 replies"):
        asyncio.run(art.ruler_score_group(group, judge_model(judge_server)))
    assert (
        asyncio.run(
            art.ruler_score_group(
                group, "judge", judge_client=judge_model(judge_server).openai_client(), swallow_exceptions=True
            )
        )
        is None
    )


@pytest.mark.long
def test_server_process_reports_a_bad_config_and_stops_its_tree(tmp_path):
    bad = ServerProcess(SCRIPTED_APP, {"no_such_field": 1}, name="bad", state_dir=tmp_path)
    with pytest.raises(ServerStartError, match="exited with code 2"):
        asyncio.run(bad.start(timeout_s=60))
    good = ServerProcess(SCRIPTED_APP, {}, name="good", state_dir=tmp_path)
    asyncio.run(good.start(timeout_s=60))
    pid = good.process.pid
    good.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
