"""NeMo Gym's equivalence_rule semantics (`grading_rule: exact | seq_match | weighted_seq_match`) on NeMo Gym
0.4.0's own rows and rollouts (`nemo_gym/`, Apache 2.0), over HTTP; our rules stay the default.

Expected values are worked out by hand from NeMo Gym's description: lower case, trim, collapse whitespace;
exact = equal; seq_match = difflib's 2M/T (M matched characters, T both lengths); weighted_seq_match =
0.85 x seq_match + 0.15 x seq_match of the reference's first 10 characters against as many of the reply's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify, server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
text_rules = import_file(SERVER_DIR / "text_rules.py")
NEMO_GYM_ROWS = read_jsonl(SERVER_DIR / "tests/nemo_gym/example.jsonl")
NEMO_GYM_ROLLOUTS = read_jsonl(SERVER_DIR / "tests/nemo_gym/example_rollouts.jsonl")
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]},
    "expected_answer": "Paris!",
}


@pytest.fixture(scope="module", params=["exact", "seq_match", "weighted_seq_match"])
def nemo_client(request):
    with server_client(SERVER_DIR, {"grading_rule": request.param}) as c:
        yield c


def _scores(rule: str, row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    with server_client(SERVER_DIR, {"grading_rule": rule}) as client:
        return post_verify(client, {**row, "response": response})


def test_nemo_gym_rollouts_get_nemo_gyms_rewards_by_exact():
    """NeMo Gym's config (`lc.yaml`) uses `exact`; its recorded rewards are [1, 0, 0, 0, 0]. By hand: rollout 1
    replies with the 753-character reference itself; rollout 2's reply equals the reference for 1375
    normalised characters, then its closing code differs ("zmexyv..." vs "z85jwh..."); rollout 3 has no
    message; rollouts 4-5 answer "5" to a reference "6"."""
    with server_client(SERVER_DIR, {"grading_rule": "exact"}) as client:
        rewards = [
            post_verify(
                client,
                {**{k: v for k, v in r.items() if k not in ("reward", "equivalence_score")}, "response": r["response"]},
            )["reward"]
            for r in NEMO_GYM_ROLLOUTS
        ]
    assert rewards == [r["reward"] for r in NEMO_GYM_ROLLOUTS] == [1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        # Rollout 2: 1396 vs 1388 normalised characters, M = 1377 (the 1375-character common start and 2 more
        # in the codes): 2 x 1377 / 2784 = 0.989224...; weighted: the first 10 characters agree (1.0), so
        # 0.85 x 0.989224 + 0.15 x 1.0 = 0.990841.
        ("seq_match", [1.0, 2 * 1377 / 2784, 0.0, 0.0, 0.0]),
        ("weighted_seq_match", [1.0, 0.85 * 2 * 1377 / 2784 + 0.15, 0.0, 0.0, 0.0]),
    ],
)
def test_nemo_gym_rollouts_by_the_sequence_rules(rule, expected):
    with server_client(SERVER_DIR, {"grading_rule": rule}) as client:
        results = [post_verify(client, {**r, "response": r["response"]}) for r in NEMO_GYM_ROLLOUTS]
    assert [r["reward"] for r in results] == pytest.approx(expected)
    assert [r["equivalence_score"] for r in results] == pytest.approx(expected)
    assert {r["grading_rule"] for r in results} == {rule}


def test_nemo_gym_rows_with_their_expected_answers(nemo_client):
    for row in NEMO_GYM_ROWS:
        result = post_verify(
            nemo_client, {**row, "response": assistant_response(f"  {row['expected_answer'].upper()} ")}
        )
        assert result["reward"] == 1.0  # case and outer whitespace do not count
        assert result["hashid"] == row["hashid"]  # the row comes back with the verifier fields


@pytest.mark.parametrize(
    ("reply", "exact", "seq_match", "weighted"),
    [
        # "paris" vs "paris!": M = 5, T = 11 -> 10/11; prefix "paris!" vs "paris" -> 10/11 too.
        ("Paris", 0.0, 10 / 11, 10 / 11),
        ("  PARIS!\n", 1.0, 1.0, 1.0),
        # "the answer is paris!" (20) vs "paris!" (6): M = 6 -> 12/26; prefix "paris!" vs "the an" -> M = 1
        # ("a") -> 2/12; weighted = 0.85 x 12/26 + 0.15 x 2/12 = 0.417308.
        ("The answer is   Paris!", 0.0, 12 / 26, 0.85 * 12 / 26 + 0.15 * 2 / 12),
        ("", 0.0, 0.0, 0.0),  # nothing in common
    ],
)
def test_rules_worked_by_hand(reply, exact, seq_match, weighted):
    for rule, expected in (("exact", exact), ("seq_match", seq_match), ("weighted_seq_match", weighted)):
        assert _scores(rule, ROW, assistant_response(reply))["reward"] == pytest.approx(expected), rule


def test_every_message_is_read_joined():
    """NeMo Gym joins the text of all output messages (no separator), not only the last one's."""
    response = assistant_response("ris!")
    response["output"].insert(
        0, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Pa"}]}
    )
    assert _scores("exact", ROW, response)["reward"] == 1.0


def test_several_references_take_the_best():
    row = {**ROW, "expected_answer": ["Lyon", "Paris!"]}
    assert _scores("seq_match", row, assistant_response("Paris"))["reward"] == pytest.approx(10 / 11)


def test_our_rules_stay_the_default():
    """No `grading_rule`: our rules, which read the boxed answer and find 0.75 equal to 3/4."""
    row = {**ROW, "expected_answer": "3/4"}
    with server_client(SERVER_DIR) as client:
        result = post_verify(client, {**row, "response": assistant_response("So \\boxed{0.75}")})
    assert result["reward"] == 1.0 and result["matched_rule"] == "fraction_decimal"
    assert _scores("exact", row, assistant_response("So \\boxed{0.75}"))["reward"] == 0.0


def test_a_huge_reply_is_scored_in_time():
    """difflib on a megabyte of reply takes about a second. By hand: M = 5 of T = 1,020,006 characters gives
    seq_match 1e-5; the prefix "paris " vs "paris!" is 10/12: 0.85 x 1e-5 + 0.15 x 10/12 = 0.125."""
    result = _scores("weighted_seq_match", ROW, assistant_response("paris " * 170_000))
    assert result["reward"] == pytest.approx(0.15 * 10 / 12, abs=1e-4)


def test_malformed_rows_are_422(nemo_client):
    without = {k: v for k, v in ROW.items() if k != "expected_answer"}
    for row in (without, {**ROW, "expected_answer": 6}, {**ROW, "expected_answer": ""}):
        answer = nemo_client.post("/verify", json={**row, "response": assistant_response("x")})
        assert answer.status_code == 422 and "expected_answer" in answer.text, answer.text


def test_unknown_grading_rule_is_a_config_error():
    with pytest.raises(Exception, match="grading_rule"):
        with server_client(SERVER_DIR, {"grading_rule": "fuzzy"}):
            pass
