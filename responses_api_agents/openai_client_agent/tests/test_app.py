"""openai_client_agent over real HTTP: the `openai` client on scripted_model's Chat Completions, the
example_single_tool_call resources server."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from live_servers import serve

from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.retry_policy import ClientTimeouts

REPO = Path(__file__).resolve().parents[3]
WEATHER_ROW = json.loads(
    (REPO / "resources_servers/example_single_tool_call/data/example.jsonl").read_text().splitlines()[0]
)


def server(path: str, config: dict, addresses: dict[str, str] | None = None):
    cls = load_server_class(REPO / path / "app.py")
    return cls(
        config,
        name="x",
        client=ServerClient(addresses=addresses or {}, timeouts=ClientTimeouts(read_s=30, max_retries=0)),
    )


@pytest.fixture
def agent_url():
    """Start resources + scripted model + agent; yield a function (model config, agent config) -> agent URL."""
    with ExitStack() as stack:

        def start(model: dict | None = None, agent: dict | None = None) -> str:
            env_url = stack.enter_context(serve(server("resources_servers/example_single_tool_call", {}).build_app()))
            model_url = stack.enter_context(
                serve(server("responses_api_models/scripted_model", model or {}).build_app())
            )
            config = {
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
                **(agent or {}),
            }
            agent_server = server(
                "responses_api_agents/openai_client_agent", config, {"env": env_url, "policy_model": model_url}
            )
            return stack.enter_context(serve(agent_server.build_app()))

        yield start


def test_tool_call_then_answer_is_verified(agent_url):
    url = agent_url({"default_reply": "Cold."})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    output = answer["response"]["output"]
    assert [item["type"] for item in output] == ["function_call", "function_call_output", "message"]
    assert json.loads(output[1]["output"])["weather_description"] == "The weather in San Francisco is cold."
    assert output[2]["content"][0]["text"] == "Cold."
    assert answer["reward"] == 1.0 and answer["stop_reason"] == "completed"
    assert answer["response"]["id"].startswith("chatcmpl-")  # the last completion's id: the terminal call's
    assert not any("generation_token_ids" in item for item in output)  # a harness keeps no token ids


def test_bad_tool_arguments_go_back_to_the_model_as_text(agent_url):
    url = agent_url({"raw_tool_arguments": {"get_weather": "{city: sf"}})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    output = answer["response"]["output"]
    assert output[1]["output"].startswith("Error: the arguments of get_weather are not a valid JSON object")
    assert output[-1]["type"] == "message"  # the model got the error and answered


def test_max_steps_ends_the_episode(agent_url):
    url = agent_url({"max_tool_rounds": 100}, {"max_steps": 3})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    kinds = [item["type"] for item in answer["response"]["output"]]
    assert kinds.count("function_call") == 3 and "message" not in kinds
    assert answer["stop_reason"] == "max_steps"


def test_a_failing_model_fails_the_rollout_typed(agent_url):
    url = agent_url({"error_status": 503})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60)
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["type"] == "http_error" and error["server"] == "policy_model" and "503" in error["message"]
