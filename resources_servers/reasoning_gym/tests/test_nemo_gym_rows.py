"""NeMo Gym's row shape (`question`, `answer`, `metadata.source_dataset`), every generator of the installed
reasoning-gym, answer-less entries, and stated answers that end with a period. Through real HTTP.

`nemo_gym/example*.jsonl` are NeMo Gym 0.4.0's own rows and rollouts (Apache 2.0; `nemo_gym/README.md`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify, server_client

SERVER_DIR = Path(__file__).resolve().parents[1]
NEMO_GYM_ROWS = read_jsonl(SERVER_DIR / "tests/nemo_gym/example.jsonl")
NEMO_GYM_ROLLOUTS = read_jsonl(SERVER_DIR / "tests/nemo_gym/example_rollouts.jsonl")
# Generators whose entries have no reference answer (null): many answers are right, the checker reads the
# metadata. With the metadata field holding a right answer, where there is one.
ANSWER_LESS = {
    "boxnet": None,
    "graph_color": "possible_answer",
    "propositional_logic": "example_answer",
    "rubiks_cube": "example_correct_answer",
    "rush_hour": None,
}


@pytest.fixture(scope="module")
def client():
    with server_client(SERVER_DIR) as c:
        yield c


def _verify(client, row: dict[str, Any], text: str) -> dict[str, Any]:
    return post_verify(client, {**row, "response": assistant_response(text)})


def nemo_gym_row(entry: dict[str, Any]) -> dict[str, Any]:
    """A reasoning_gym entry in NeMo Gym's row shape (what its create_dataset.py writes)."""
    entry = json.loads(json.dumps(entry, default=str))  # tuples -> lists, as in a JSONL file
    return {"responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]}, **entry}


def generator_entries(name: str, size: int = 3) -> list[dict[str, Any]]:
    if name == "composite":  # a mix of generators; it has no default config
        specs = [
            DatasetSpec(name="leg_counting", weight=1, config={}),
            DatasetSpec(name="spell_backward", weight=1, config={}),
        ]
        dataset = reasoning_gym.create_dataset(name, size=size, seed=0, datasets=specs)
    else:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=0)
    return [dataset[i] for i in range(size)]


def library_score(entry: dict[str, Any], answer: str) -> float:
    """What the library's own checker gives `answer` on the entry as generated (composite entries: their
    generator's checker)."""
    return reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])(answer, entry)


@pytest.mark.long
def test_entries_score_the_same_after_json_but_arc_grids():
    """A row is JSON: the entry's tuples become lists. Only the ARC checkers (arc_agi, rearc) then score
    their own reference differently (0.05: they compare a tuple board with `==`); the server restores that
    grid, so `test_every_generator_...` compares with the score of the entry as generated."""
    changed = set()
    for name in sorted(DATASETS):
        for entry in generator_entries(name):
            if entry["answer"] is not None and library_score(entry, entry["answer"]) != library_score(
                json.loads(json.dumps(entry, default=str)), entry["answer"]
            ):
                changed.add(name)
    assert changed == {"arc_agi", "rearc"}


# -- NeMo Gym's rows -------------------------------------------------------------------------------------


def test_nemo_gym_rows_with_their_reference_answers(client):
    # knights_knaves scores a set of (name, role) pairs read from the answer: the reference gives the same set.
    for row in NEMO_GYM_ROWS:
        for text in (row["answer"], f"<answer>{row['answer']}</answer>", f"\\boxed{{{row['answer']}}}"):
            result = _verify(client, row, text)
            assert result["reward"] == 1.0 and result["dataset"] == "knights_knaves", text
            assert result["metadata"] == row["metadata"]  # the row comes back with the verifier fields


def test_nemo_gym_rollouts_get_nemo_gyms_rewards(client):
    """NeMo Gym's recorded rollouts, re-verified here, get the rewards its verifier recorded: [1, 1, 0, 0, 0].

    By hand: rollouts 1-2 answer with just "Olivia is a laggard, and Lily is a pioneer." (the reference's
    pairs) -> 1.0 in both. Rollouts 3-5 write an essay ending "**Zoey is a fool, and Riley is a sage**.": NeMo
    Gym scores the whole essay, we score its last line; in both, knights_knaves reads bold-marked words as
    names ("**zoey") or no role ("sage**"), so the pairs it finds are not the reference's two -> 0.0.
    """
    by_question = {row["question"]: row for row in NEMO_GYM_ROWS}
    rewards = []
    for rollout in NEMO_GYM_ROLLOUTS:
        row = by_question[rollout["responses_create_params"]["input"][0]["content"]]
        result = post_verify(client, {**row, "response": rollout["response"]})
        assert result["reward"] == rollout["reward"] == result["score"]
        rewards.append(result["reward"])
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(
            lambda row: row["metadata"].pop("source_dataset"), "metadata.source_dataset", id="no-source_dataset"
        ),
        pytest.param(
            lambda row: row["metadata"].update(source_dataset="knights_knave"),
            "knights_knaves",
            id="unknown-source_dataset",
        ),
        pytest.param(lambda row: row.pop("question"), "question", id="no-question"),
        pytest.param(lambda row: row.pop("answer"), "answer", id="no-answer"),
        pytest.param(lambda row: row.update(answer=3), "answer", id="answer-not-text"),
        pytest.param(lambda row: row.update(metadata="knights_knaves"), "metadata", id="metadata-not-object"),
    ],
)
def test_malformed_nemo_gym_rows_get_422_naming_the_field(client, mutate, field):
    row = {**json.loads(json.dumps(NEMO_GYM_ROWS[0])), "response": assistant_response("x")}
    mutate(row)
    answer = client.post("/verify", json=row)
    assert answer.status_code == 422 and field in answer.text, answer.text


# -- every generator -------------------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_generator_boxed_reference_scores_what_the_library_gives(client, name):
    """For every generator of the installed reasoning-gym, in both row shapes: the reference answer written as
    `\\boxed{...}` gets the library's own score of that answer (codeio's JSON answers hold unbalanced braces
    in strings); an answer-less entry, answered with the right answer its metadata holds (or a wrong one),
    gets the library's score of that answer, never a 422."""
    for entry in generator_entries(name):
        answer = entry["answer"]
        if answer is None:
            assert name in ANSWER_LESS
            right = entry["metadata"].get(ANSWER_LESS[name] or "", "no such move")
            answer = right if isinstance(right, str) else json.dumps(right)
        else:
            assert name not in ANSWER_LESS
        expected = min(max(library_score(entry, answer), 0.0), 1.0)
        ours = {**nemo_gym_row(entry), "dataset": name, "entry": json.loads(json.dumps(entry, default=str))}
        for row in (nemo_gym_row(entry), ours):
            result = _verify(client, row, f"Reasoning first.\n\\boxed{{{answer}}}")
            assert result["reward"] == pytest.approx(expected), (name, answer, result.get("extracted_answer"))
        if ANSWER_LESS.get(name):
            assert expected == 1.0  # the metadata's answer is a right one


def test_answer_less_entries_are_accepted():
    assert {
        name for name in DATASETS if name != "composite" and generator_entries(name, 1)[0]["answer"] is None
    } == set(ANSWER_LESS)


def test_unparsable_answer_scores_zero_with_the_checkers_error(client):
    """prime_factorization's checker raises ValueError on "xyz": the model's fault (its reference scores), so
    reward 0 with `checker_error`, not a 422."""
    row = nemo_gym_row(generator_entries("prime_factorization", 1)[0])
    result = _verify(client, row, "\\boxed{xyz}")
    assert result["reward"] == 0.0 and result["checker_error"].startswith("ValueError")


def test_entry_its_checker_rejects_gets_422(client):
    """An entry whose own reference answer the checker cannot score is a data problem: 422, never a silent 0."""
    row = nemo_gym_row(generator_entries("prime_factorization", 1)[0])
    row["answer"] = "not a factorization"
    answer = client.post("/verify", json={**row, "response": assistant_response("\\boxed{xyz}")})
    assert answer.status_code == 422 and "own answer" in answer.text


# -- a stated answer that ends with a period ----------------------------------------------------------------


def test_stated_answer_keeps_a_period_that_belongs_to_it(client):
    """sentence_reordering's answers end with a period. "The answer is Smith has to perform." used to be read
    as "Smith has to perform" and score 0.75 (3 of 4 words in place: the last is "perform" vs "perform.");
    both readings now go through the library's checker and the better one counts: 1.0."""
    entry = next(e for e in generator_entries("sentence_reordering", 3) if e["answer"] == "Smith has to perform.")
    assert library_score(entry, "Smith has to perform") == 0.75
    ours = {**nemo_gym_row(entry), "dataset": "sentence_reordering", "entry": json.loads(json.dumps(entry))}
    for row in (ours, nemo_gym_row(entry)):
        result = _verify(client, row, "The sentence reads naturally, so the answer is Smith has to perform.")
        assert result["reward"] == 1.0 and result["extracted_answer"] == "Smith has to perform."
    # A period that only ends the sentence is still dropped: "... the answer is 8." scores "8".
    leg = nemo_gym_row(generator_entries("basic_arithmetic", 1)[0])
    assert _verify(client, leg, f"So the answer is {leg['answer']}.")["reward"] == 1.0
