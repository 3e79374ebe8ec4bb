"""Rows missing the task fields an environment needs are rejected before any rollout, with file:line."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest
from live_servers import serve

from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.common.errors import DataError
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app
from nemo_gym.serving.server import Session

REPO = Path(__file__).resolve().parent.parent


class AnswerRequest(VerifyRequest):
    expected_answer: str


class Exact(ResourcesServer):
    verify_request_type = AnswerRequest
    calls = 0

    async def verify(self, request: AnswerRequest, session: Session) -> VerifyResult:
        Exact.calls += 1
        text = "".join(p.get("text", "") for item in request.response["output"] for p in item.get("content") or [])
        return VerifyResult(reward=float(request.expected_answer in text))


def test_missing_task_field_is_named_with_file_and_line(tmp_path):
    rows = [
        {"responses_create_params": {"input": "say B"}, "expected_answer": "B"},
        {"responses_create_params": {"input": "say B"}, "expected_answer": 3},
        {"responses_create_params": {"input": "say B"}},
    ]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ExitStack() as stack:
        env_url = stack.enter_context(serve(Exact().build_app()))
        model = load_server_class(REPO / "responses_api_models/scripted_model/app.py")({"default_reply": "B"})
        model_url = stack.enter_context(serve(model.build_app()))
        agent_cls = load_server_class(REPO / "responses_api_agents/simple_agent/app.py")
        agent = agent_cls(
            {
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "m"},
            },
            client=ServerClient(addresses={"env": env_url, "m": model_url}),
        )
        agent_url = stack.enter_context(serve(agent.build_app()))
        head_app = build_head_app()
        head_app.state.servers["agent"] = {"name": "agent", "url": agent_url}
        head_url = stack.enter_context(serve(head_app))

        async def collect(path: Path):
            cfg = CollectConfig(
                agent_name="agent",
                input_jsonl_fpath=str(path),
                output_jsonl_fpath=str(tmp_path / f"{path.stem}_out.jsonl"),
                progress=False,
                head_server_url=head_url,
            )
            async with ServerClient(head_url) as client:
                return await collect_rollouts(cfg, client)

        import asyncio

        with pytest.raises(DataError, match=r"tasks.jsonl:2: task field expected_answer: 3 is not of type 'string'"):
            asyncio.run(collect(data))
        assert Exact.calls == 0  # nothing was dispatched
        data.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], rows[2]]))
        with pytest.raises(DataError, match=r"tasks.jsonl:2: task field row: 'expected_answer' is a required property"):
            asyncio.run(collect(data))
        good = tmp_path / "good.jsonl"
        good.write_text(json.dumps(rows[0]) + "\n")
        summary = asyncio.run(collect(good))
        assert summary.rollouts_done == 1 and summary.mean_reward == 1.0
