"""simple_agent over real HTTP with a real resources server and the scripted policy."""

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


def server(path: str, config: dict, addresses: dict[str, str] | None = None, name: str = "x"):
    cls = load_server_class(REPO / path / "app.py")
    return cls(
        config,
        name=name,
        client=ServerClient(addresses=addresses or {}, timeouts=ClientTimeouts(read_s=30, max_retries=0)),
    )


@pytest.fixture
def agent_url():
    """Start resources + model + agent; yield a function (model config, agent config) -> agent URL."""
    with ExitStack() as stack:

        def start(
            model: dict | None = None,
            agent: dict | None = None,
            resources: str = "resources_servers/example_single_tool_call",
        ) -> str:
            env_url = stack.enter_context(serve(server(resources, {}).build_app()))
            model_url = stack.enter_context(
                serve(server("responses_api_models/scripted_model", model or {}).build_app())
            )
            agent_config = {
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
                **(agent or {}),
            }
            agent_server = server(
                "responses_api_agents/simple_agent", agent_config, {"env": env_url, "policy_model": model_url}
            )
            return stack.enter_context(serve(agent_server.build_app()))

        yield start


def test_tool_call_then_answer_is_verified(agent_url):
    url = agent_url({"default_reply": "Cold."})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    assert [item["type"] for item in answer["response"]["output"]] == [
        "function_call",
        "function_call_output",
        "message",
    ]
    assert json.loads(answer["response"]["output"][1]["output"]) == {
        "city": "San Francisco",
        "weather_description": "The weather in San Francisco is cold.",
    }
    assert answer["reward"] == 1.0 and answer["stop_reason"] == "completed"
    assert answer["responses_create_params"] == WEATHER_ROW["responses_create_params"]  # the row comes back whole


def test_bad_tool_arguments_go_back_to_the_model_as_text(agent_url):
    url = agent_url({"raw_tool_arguments": {"get_weather": "{city: sf"}, "max_tool_rounds": 1})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    output = answer["response"]["output"][1]["output"]
    assert output.startswith("Error: the arguments of get_weather are not a valid JSON object")
    assert answer["response"]["output"][-1]["type"] == "message"  # the model got the error and answered


def test_schema_violation_goes_back_as_text(agent_url):
    url = agent_url({"tool_arguments": {"get_weather": {"town": "sf"}}})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    assert answer["response"]["output"][1]["output"].startswith("Error: tool get_weather rejected the call (422)")


def test_max_steps_ends_the_episode(agent_url):
    url = agent_url({"max_tool_rounds": 100}, {"max_steps": 3})
    answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60).json()
    kinds = [item["type"] for item in answer["response"]["output"]]
    assert kinds.count("function_call") == 3 and "message" not in kinds
    assert answer["stop_reason"] == "max_steps"


def test_v1_responses_runs_the_loop_only(agent_url):
    url = agent_url()
    response = httpx.post(f"{url}/v1/responses", json=WEATHER_ROW["responses_create_params"], timeout=60).json()
    assert response["object"] == "response" and response["output"][-1]["type"] == "message"


def test_unreachable_model_gives_502_with_failure_class():
    with ExitStack() as stack:
        env_url = stack.enter_context(serve(server("resources_servers/example_single_tool_call", {}).build_app()))
        config = {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
        }
        agent_server = server(
            "responses_api_agents/simple_agent", config, {"env": env_url, "policy_model": "http://127.0.0.1:9"}
        )
        url = stack.enter_context(serve(agent_server.build_app()))
        answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60)
    assert answer.status_code == 502
    assert answer.json()["error"]["type"] == "unavailable" and answer.json()["error"]["server"] == "policy_model"


@pytest.mark.parametrize("policy", ["scripted", "unreachable"])
def test_every_rollout_ends_its_session(policy):
    """A verified rollout ends its session with the verify answer (`/verify?close_session=true`, no separate
    `/close_session` call); a rollout that fails before its verify answer closes it with `/close_session`."""
    calls: list[str] = []
    with ExitStack() as stack:
        env = server("resources_servers/example_single_tool_call", {})
        env_app = env.build_app()

        @env_app.middleware("http")
        async def record(request, call_next):
            calls.append(request.url.path)
            return await call_next(request)

        env_url = stack.enter_context(serve(env_app))
        model_url = (
            stack.enter_context(
                serve(server("responses_api_models/scripted_model", {"default_reply": "Cold."}).build_app())
            )
            if policy == "scripted"
            else "http://127.0.0.1:9"
        )
        config = {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
        }
        url = stack.enter_context(
            serve(
                server(
                    "responses_api_agents/simple_agent", config, {"env": env_url, "policy_model": model_url}
                ).build_app()
            )
        )
        answer = httpx.post(f"{url}/run", json=WEATHER_ROW, timeout=60)
    if policy == "scripted":
        assert answer.status_code == 200 and answer.json()["reward"] == 1.0
        assert calls == ["/seed_session", "/get_weather", "/verify"]
    else:
        assert answer.status_code == 502
        assert calls == ["/seed_session", "/close_session"]
    assert env.sessions == {}


def test_tool_arguments_as_text_or_an_object_and_clear_errors_otherwise():

    from nemo_gym.env.tool_routes import tool_arguments  # simple_agent's, shared by the agents

    assert (
        tool_arguments('{"city": "sf"}') == {"city": "sf"} == tool_arguments({"city": "sf"})
    )  # text, or parsed by the endpoint
    assert tool_arguments("") == tool_arguments(None) == {}
    for raw in ("[1]", "3", "{city: sf", ["city"], 3, "[" * 100_000):
        with pytest.raises(ValueError):  # the agent answers the model with the error (StopReason.parse_error), no crash
            tool_arguments(raw)
