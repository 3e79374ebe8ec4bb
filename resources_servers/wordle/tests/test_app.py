"""Wordle: the rules (marks with duplicate letters, guess parsing, turns) and the server over HTTP (TestClient)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import episode_response, server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
DATA = SERVER_DIR / "data"


game = import_file(SERVER_DIR / "wordle_game.py")


answer = episode_response  # observations and the given assistant turns, alternating


# -- rules -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "guess, secret, marks",
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "venue", "___YG"),  # n elsewhere, e in place
        ("babes", "abbey", "YYGG_"),  # b in place at 3; the first b and the a elsewhere
        ("keeps", "abbey", "_Y___"),  # one e in the secret: only the first e of the guess is marked
        ("speed", "abide", "__Y_Y"),  # two e guessed, one in the secret
        ("lolly", "hello", "_YGG_"),  # the two l in place use up both l: the first l gets _
        ("geese", "eerie", "_GY_G"),  # three e in each: two in place, the third elsewhere
        ("eerie", "geese", "YG__G"),
        ("ABBEY", "Keeps", "___Y_"),  # case does not matter
    ],
)
def test_feedback_marks_duplicate_letters_like_the_nyt_game(guess, secret, marks):
    assert game.feedback(guess, secret) == marks


@pytest.mark.parametrize(
    "text, guess",
    [
        ("I think CRANE fits", "crane"),
        ("CRANE is my guess", "crane"),  # capitals first
        ("my guess: slate.", "slate"),  # no capitals: the last 5-letter word
        ("SLATE? No: **TRACE**", "trace"),
        ("", None),
        ("no idea at all", None),
        ("CRANES", None),  # 6 letters
    ],
)
def test_parse_guess_takes_the_last_capitalised_five_letter_word(text, guess):
    assert game.parse_guess(text) == guess


def test_invalid_guesses_use_turns_until_the_game_ends():
    episode = game.WordleEpisode(secret="venue")
    allowed = game.load_words("allowed_words.txt")
    observations = []
    for turn in range(1, 7):
        reward, observation = episode.step("QQQQQ" if turn % 2 else "hmm", allowed)
        observations.append(observation)
        assert reward == 0.0 and episode.turns == turn
    assert "QQQQQ is not in the word list" in observations[0] and "no 5-letter word found" in observations[1]
    assert "Guesses left: 4." in observations[1]
    assert episode.terminated and not episode.solved and "Out of guesses: the word was VENUE" in observations[-1]


def test_guess_penalty_shapes_the_solving_reward():
    # Solved at turn 3 with penalty 0.1: 1 - 0.1 * (3 - 1) = 0.8.
    episode = game.WordleEpisode(secret="venue", guess_penalty=0.1)
    rewards = [episode.step(word, None)[0] for word in ("CRANE", "SLATE", "VENUE")]
    assert rewards == [0.0, 0.0, pytest.approx(0.8)] and episode.solved and episode.terminated


def test_bundled_word_lists_and_tasks():
    targets = (DATA / "target_words.txt").read_text().split()
    allowed = game.load_words("allowed_words.txt")
    assert len(targets) == len(set(targets)) >= 500
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in targets) and set(targets) <= allowed
    tasks = read_jsonl(DATA / "tasks.jsonl")
    assert len(tasks) >= 50 and {t["target_word"] for t in tasks} <= set(targets)
    generator = import_file(SERVER_DIR / "generate_data.py")
    assert generator.task_rows(targets) == tasks  # the bundled tasks are what the script writes
    examples = read_jsonl(DATA / "example.jsonl")
    assert examples == tasks[:5]


# -- server ------------------------------------------------------------------------------------------------
@pytest.fixture
def client():
    with server_client(SERVER_DIR) as client:
        yield client


def test_reset_step_until_solved(client):
    headers = {"X-Session-Id": "s1"}
    first = client.post("/reset", json={"target_word": "venue"}, headers=headers).json()
    assert "6 guesses" in first["observation"]
    step = client.post("/step", json={"action": "Opening with CRANE"}, headers=headers).json()
    assert step == {
        "observation": "CRANE  _ _ _ Y G\nGuesses left: 5. Reply with your next 5-letter guess in capital letters.",
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "info": {"turns": 1, "solved": False},
    }
    step = client.post("/step", json={"action": "VENUE"}, headers=headers).json()
    assert step["reward"] == 1.0 and step["terminated"] is True
    again = client.post("/step", json={"action": "VENUE"}, headers=headers)
    assert again.status_code == 409 and "over" in again.text
    verified = client.post(
        "/verify",
        json={"responses_create_params": {"input": []}, "target_word": "venue", "response": answer("x")},
        headers=headers,
    ).json()
    assert (
        verified["reward"] == 1.0 and verified["replayed"] is False and verified["turns"] == 2
    )  # the session's game, not the replay


def test_step_without_reset_and_bad_target_are_4xx(client):
    assert client.post("/step", json={"action": "CRANE"}, headers={"X-Session-Id": "none"}).status_code == 409
    assert client.post("/reset", json={"target_word": "toolong"}, headers={"X-Session-Id": "s"}).status_code == 422
    assert client.post("/reset", json={"target_word": 12345}, headers={"X-Session-Id": "s"}).status_code == 422


def test_sessions_are_isolated_and_freed(client):
    client.post("/reset", json={"target_word": "venue"}, headers={"X-Session-Id": "a"})
    client.post("/reset", json={"target_word": "crane"}, headers={"X-Session-Id": "b"})
    assert client.post("/step", json={"action": "CRANE"}, headers={"X-Session-Id": "b"}).json()["terminated"] is True
    assert client.post("/step", json={"action": "CRANE"}, headers={"X-Session-Id": "a"}).json()["terminated"] is False
    client.post("/close_session", headers={"X-Session-Id": "a"})
    assert "a" not in client.server.sessions and "b" in client.server.sessions


def test_verify_replays_the_trajectory_without_a_session(client):
    body = {"responses_create_params": {"input": []}, "target_word": "venue"}
    solved = client.post("/verify", json={**body, "response": answer("CRANE", "I bet VENUE")}).json()
    assert (
        solved["reward"] == 1.0
        and solved["replayed"] is True
        and solved["turns"] == 2
        and solved["failure_reason"] is None
    )
    lost = client.post("/verify", json={**body, "response": answer(*["SLATE"] * 7)}).json()
    assert lost["reward"] == 0.0 and lost["turns"] == 6 and lost["failure_reason"] == "out_of_guesses"


@pytest.mark.parametrize(
    "output",
    [
        [],
        [{"type": "message", "role": "assistant", "content": 5}],
        [1, "x", None],
        [{"type": "message", "role": "assistant", "content": [{"text": "A" * 1_000_000}]}],
    ],
    ids=["empty", "content not text", "junk items", "huge"],
)
def test_bad_model_output_scores_zero_without_crashing(client, output):
    body = {"responses_create_params": {"input": []}, "target_word": "venue", "response": {"output": output}}
    verified = client.post("/verify", json=body)
    assert verified.status_code == 200 and verified.json()["reward"] == 0.0 and verified.json()["failure_reason"]


def test_missing_or_malformed_target_word_is_422(client):
    for fields in ({}, {"target_word": "abc"}, {"target_word": ["venue"]}):
        body = {"responses_create_params": {"input": []}, "response": answer("VENUE"), **fields}
        assert client.post("/verify", json=body).status_code == 422
