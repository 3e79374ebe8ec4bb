"""gymnasium_agent over real HTTP with the real wordle and blackjack servers and the scripted policy."""

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
WORDLE_ROW = json.loads(
    (REPO / "resources_servers/wordle/data/example.jsonl").read_text().splitlines()[0]
)  # target: venue
BLACKJACK_ROW = json.loads(
    (REPO / "resources_servers/blackjack/data/example.jsonl").read_text().splitlines()[0]
)  # seed 1000


def server(path: str, config: dict, addresses: dict[str, str] | None = None):
    cls = load_server_class(REPO / path / "app.py")
    return cls(
        config,
        name="x",
        client=ServerClient(addresses=addresses or {}, timeouts=ClientTimeouts(read_s=30, max_retries=0)),
    )


@pytest.fixture
def agent_url():
    """Start environment + scripted model + agent; yield a function (environment, model config, agent config) -> agent URL."""  # noqa: E501
    with ExitStack() as stack:

        def start(environment: str, model: dict, agent: dict | None = None, env_config: dict | None = None) -> str:
            env_url = stack.enter_context(
                serve(server(f"resources_servers/{environment}", env_config or {}).build_app())
            )
            model_url = stack.enter_context(serve(server("responses_api_models/scripted_model", model).build_app()))
            config = {
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
                **(agent or {}),
            }
            agent_server = server(
                "responses_api_agents/gymnasium_agent", config, {"env": env_url, "policy_model": model_url}
            )
            return stack.enter_context(serve(agent_server.build_app()))

        yield start


def run(url: str, row: dict) -> dict:
    answer = httpx.post(f"{url}/run", json=row, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def texts(output: list[dict]) -> list[tuple[str, str]]:
    return [(item["role"], "".join(p["text"] for p in item["content"])) for item in output]


def test_wordle_solved_in_two_turns(agent_url):
    # The first observation has no CRANE: the default reply guesses it; its feedback names CRANE: guess VENUE.
    url = agent_url(
        "wordle", {"default_reply": "Let me open with CRANE", "rules": [{"match": "CRANE", "reply": "So: VENUE"}]}
    )
    answer = run(url, WORDLE_ROW)
    roles = [role for role, _ in texts(answer["response"]["output"])]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    # crane vs venue: c r a _ _ ; n is in venue (position 3) → Y; e in place → G
    assert "CRANE  _ _ _ Y G" in texts(answer["response"]["output"])[2][1]
    assert answer["reward"] == 1.0 and answer["solved"] is True and answer["turns"] == 2
    assert answer["stop_reason"] == "completed" and answer["replayed"] is False
    assert answer["target_word"] == "venue"  # the row comes back whole


def test_wordle_invalid_replies_use_up_the_six_guesses(agent_url):
    url = agent_url("wordle", {"default_reply": "I am not sure."})
    answer = run(url, WORDLE_ROW)
    assert answer["reward"] == 0.0 and answer["turns"] == 6 and answer["stop_reason"] == "completed"
    assert answer["failure_reason"] == "out_of_guesses"
    assert "no 5-letter word found" in texts(answer["response"]["output"])[2][1]


def test_max_turns_truncates_and_the_unfinished_game_scores_zero(agent_url):
    url = agent_url("wordle", {"default_reply": "CRANE"}, {"max_turns": 2})
    answer = run(url, WORDLE_ROW)
    assert answer["stop_reason"] == "max_steps" and answer["turns"] == 2
    assert answer["reward"] == 0.0 and answer["failure_reason"] == "episode_unfinished"


def test_blackjack_stand_on_seed_1000_wins(agent_url):
    # seed 1000: player 4+8 = 12 vs dealer's Ace; the dealer draws A, 4, 10, 7 and busts at 23.
    url = agent_url("blackjack", {"default_reply": "I will stand."})
    answer = run(url, BLACKJACK_ROW)
    assert answer["reward"] == 1.0 and answer["outcome"] == "win" and answer["stop_reason"] == "completed"
    assert (
        "Dealer's hand: Ace of Clubs, Ace of Diamonds, 4 of Hearts, 10 of Spades, 7 of Hearts (total 23)"
        in texts(answer["response"]["output"])[-1][1]
    )


def test_blackjack_invalid_actions_are_truncated_as_a_forfeit(agent_url):
    url = agent_url("blackjack", {"default_reply": "Hmm."}, env_config={"max_steps": 3})
    answer = run(url, BLACKJACK_ROW)
    assert answer["stop_reason"] == "max_steps" and answer["turns"] == 3
    assert answer["reward"] == -1.0 and answer["outcome"] == "forfeit"


def test_aggregate_metrics_count_stop_reasons(agent_url):
    url = agent_url("blackjack", {"default_reply": "stand"})
    answers = [run(url, BLACKJACK_ROW) for _ in range(2)]
    metrics = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": answers}, timeout=30).json()
    assert metrics["num_rollouts"] == 2 and metrics["stop_reasons"] == {"completed": 2}


@pytest.mark.parametrize("body", [{}, {"verify_responses": 5}, {"verify_responses": [1, 2]}, [], "x"])
def test_aggregate_metrics_rejects_a_malformed_body_with_422(agent_url, body):
    url = agent_url("blackjack", {})
    assert httpx.post(f"{url}/aggregate_metrics", json=body, timeout=30).status_code == 422
    route = httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"]["/aggregate_metrics"]["post"]
    assert route["requestBody"]["required"] is True  # the typed body is declared in OpenAPI


def test_row_schema_comes_from_the_environment(agent_url):
    url = agent_url("wordle", {})
    schema = httpx.get(f"{url}/row_schema", timeout=30).json()
    assert "target_word" in schema["required"]


def test_v1_responses_asks_for_a_row(agent_url):
    url = agent_url("wordle", {})
    answer = httpx.post(f"{url}/v1/responses", json=WORDLE_ROW["responses_create_params"], timeout=30)
    assert answer.status_code == 422 and "POST /run" in answer.text


def test_unreachable_model_gives_502_with_failure_class():
    with ExitStack() as stack:
        env_url = stack.enter_context(serve(server("resources_servers/wordle", {}).build_app()))
        config = {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
        }
        agent_server = server(
            "responses_api_agents/gymnasium_agent", config, {"env": env_url, "policy_model": "http://127.0.0.1:9"}
        )
        url = stack.enter_context(serve(agent_server.build_app()))
        answer = httpx.post(f"{url}/run", json=WORDLE_ROW, timeout=60)
    assert answer.status_code == 502
    assert answer.json()["error"]["type"] == "unavailable" and answer.json()["error"]["server"] == "policy_model"
