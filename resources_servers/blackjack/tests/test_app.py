"""Blackjack: the rules (soft aces, the dealer's soft 17, naturals, actions) and the server over HTTP (TestClient)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import episode_response, server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]


game = import_file(SERVER_DIR / "blackjack_game.py")


def cards(*ranks: str) -> list[tuple[str, str]]:
    return [(rank, "Spades") for rank in ranks]


answer = episode_response  # observations and the given assistant turns, alternating


# -- rules -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ranks, value",
    [
        (("A", "6"), (17, True)),  # 1 + 6 + 10
        (("A", "6", "9"), (16, False)),  # 1 + 6 + 9; 26 with the ace as 11
        (("A", "A", "9"), (21, True)),  # only one ace counts 11: 11 + 1 + 9
        (("A", "A"), (12, True)),
        (("A", "A", "A", "A"), (14, True)),
        (("A", "K"), (21, True)),
        (("K", "Q", "A"), (21, False)),
        (("K", "Q", "5"), (25, False)),
        (("J", "Q"), (20, False)),
    ],
)
def test_hand_value_counts_one_ace_as_eleven_when_it_fits(ranks, value):
    assert game.hand_value(cards(*ranks)) == value


def test_dealer_stands_on_soft_17_unless_h17():
    shoe = cards("5", "10")
    dealer = cards("A", "6")
    game.dealer_plays(dealer, list(shoe), hits_soft_17=False)
    assert dealer == cards("A", "6")
    dealer = cards("A", "6")
    game.dealer_plays(dealer, list(shoe), hits_soft_17=True)  # A+6+5 = 12 (hard), then +10 = 22
    assert dealer == cards("A", "6", "5", "10") and game.hand_value(dealer) == (22, False)
    dealer = cards("10", "7")
    game.dealer_plays(dealer, list(shoe), hits_soft_17=True)  # a hard 17 always stands
    assert dealer == cards("10", "7")


@pytest.mark.parametrize(
    "player, dealer, outcome",
    [
        (("A", "K"), ("7", "4", "K"), ("win", 1.0)),  # a natural beats a three-card 21
        (("7", "4", "K"), ("A", "Q"), ("loss", -1.0)),
        (("A", "K"), ("A", "J"), ("push", 0.0)),
        (("10", "8"), ("10", "6", "9"), ("win", 1.0)),  # dealer bust
        (("10", "8"), ("10", "8"), ("push", 0.0)),
        (("10", "7"), ("10", "8"), ("loss", -1.0)),
    ],
)
def test_settle(player, dealer, outcome):
    assert game.settle(cards(*player), cards(*dealer)) == outcome


@pytest.mark.parametrize(
    "text, action",
    [
        ("I'll hit... no, STAND", "stand"),
        ("Hit.", "hit"),
        ("hitting is risky", None),
        ("standard play", None),
        ("", None),
    ],
)
def test_parse_action_takes_the_last_whole_word(text, action):
    assert game.parse_action(text) == action


def test_shoe_is_a_seeded_shuffle_of_whole_decks():
    assert game.shuffled_shoe(7) == game.shuffled_shoe(7) != game.shuffled_shoe(8)
    assert len(set(game.shuffled_shoe(7))) == 52 and len(game.shuffled_shoe(7, num_decks=2)) == 104


def test_hitting_to_bust_loses_and_invalid_actions_are_forfeited():
    episode = game.BlackjackEpisode.deal(1000, max_steps=20)
    while not episode.done:
        reward, observation = episode.step("hit")
    assert episode.outcome == "bust" and reward == -1.0 and episode.terminated and "Bust" in observation
    episode = game.BlackjackEpisode.deal(1000, max_steps=2)
    assert episode.step("maybe")[0] == 0.0 and not episode.done
    reward, observation = episode.step("?")
    assert reward == -1.0 and episode.truncated and not episode.terminated and "forfeited" in observation


def test_bundled_tasks():
    tasks = read_jsonl(SERVER_DIR / "data/tasks.jsonl")
    assert len(tasks) >= 50 and len({t["seed"] for t in tasks}) == len(tasks)
    assert import_file(SERVER_DIR / "generate_data.py").task_rows() == tasks


# -- server ------------------------------------------------------------------------------------------------
@pytest.fixture
def client():
    with server_client(SERVER_DIR) as client:
        yield client


def test_reset_step_verify(client):
    headers = {"X-Session-Id": "s1"}
    first = client.post("/reset", json={"seed": 1000}, headers=headers).json()
    assert first["observation"].startswith(
        "Your hand: 4 of Spades, 8 of Spades (total 12).\nDealer shows: Ace of Clubs."
    )
    step = client.post("/step", json={"action": "Stand."}, headers=headers).json()
    assert (
        step["reward"] == 1.0
        and step["terminated"] is True
        and step["truncated"] is False
        and step["info"]["outcome"] == "win"
    )
    assert client.post("/step", json={"action": "hit"}, headers=headers).status_code == 409
    body = {"responses_create_params": {"input": []}, "seed": 1000, "response": answer("x")}
    verified = client.post("/verify", json=body, headers=headers).json()
    assert verified["reward"] == 1.0 and verified["replayed"] is False and verified["outcome"] == "win"


def test_h17_config_changes_the_dealer(client):
    # Find a seed whose dealer stands on a soft 17 under S17; under H17 the same hand goes on.
    for seed in range(2000):
        episode = game.BlackjackEpisode.deal(seed)
        if game.hand_value(episode.dealer) == (17, True):
            break
    with server_client(SERVER_DIR, {"dealer_hits_soft_17": True}) as h17_client:
        h17_client.post("/reset", json={"seed": seed}, headers={"X-Session-Id": "h"})
        h17_client.post("/step", json={"action": "stand"}, headers={"X-Session-Id": "h"})
        h17 = h17_client.server
    client.post("/reset", json={"seed": seed}, headers={"X-Session-Id": "s"})
    client.post("/step", json={"action": "stand"}, headers={"X-Session-Id": "s"})
    assert len(client.server.sessions["s"]["episode"].dealer) == 2
    assert len(h17.sessions["h"]["episode"].dealer) > 2


def test_verify_replays_without_a_session_and_forfeits_unfinished_hands(client):
    body = {"responses_create_params": {"input": []}, "seed": 1000}
    won = client.post("/verify", json={**body, "response": answer("hmm", "I stand")}).json()
    assert won["reward"] == 1.0 and won["replayed"] is True and won["turns"] == 2
    unfinished = client.post("/verify", json={**body, "response": answer("no idea")}).json()
    assert unfinished["reward"] == -1.0 and unfinished["failure_reason"] == "episode_unfinished"
    forfeited = client.post(
        "/verify", json={**body, "response": answer(*["no idea"] * 10)}
    ).json()  # max_steps invalid replies
    assert (
        forfeited["reward"] == -1.0
        and forfeited["outcome"] == "forfeit"
        and forfeited["failure_reason"] == "no_decision"
    )
    assert won["failure_reason"] is None


@pytest.mark.parametrize(
    "output",
    [
        [],
        [None, 3],
        "stand",
        5,
        [{"type": "message", "role": "assistant", "content": {"text": "stand"}}],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": 21}]}],
    ],
)
def test_bad_model_output_is_an_unfinished_hand(client, output):
    # No valid action was ever read: the hand is scored as forfeited (-1), and the answer says why.
    verified = client.post(
        "/verify", json={"responses_create_params": {"input": []}, "seed": 3, "response": {"output": output}}
    )
    assert verified.status_code == 200, verified.text
    result = verified.json()
    assert (
        result["reward"] == -1.0
        and result["outcome"] == "unfinished"
        and result["failure_reason"] == "episode_unfinished"
    )


def test_missing_or_malformed_seed_is_422(client):
    for fields in ({}, {"seed": "abc"}, {"seed": [1]}):
        assert (
            client.post(
                "/verify", json={"responses_create_params": {"input": []}, "response": answer("stand"), **fields}
            ).status_code
            == 422
        )
    assert client.post("/reset", json={"seed": "x"}, headers={"X-Session-Id": "s"}).status_code == 422
    assert client.post("/step", json={"action": "stand"}, headers={"X-Session-Id": "nothing"}).status_code == 409
