"""NeMo Gym's instruction_following rows: its 29 instruction ids beyond IFEval's (`iftrain.py`), IFEval's own
readings (`semantics: nemo_gym`), per-row `grading_mode`, and NeMo Gym 0.4.0's own rows and rollouts
(`nemo_gym/`, Apache 2.0). Over HTTP. Each expected value is worked out by hand in a comment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify, server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
NEMO_GYM_ROWS = read_jsonl(SERVER_DIR / "tests/nemo_gym/example.jsonl")
NEMO_GYM_ROLLOUTS = read_jsonl(SERVER_DIR / "tests/nemo_gym/example_rollouts.jsonl")
iftrain = import_file(SERVER_DIR / "iftrain.py")
PROMPT = {"input": [{"role": "user", "content": "Write something."}]}


@pytest.fixture(scope="module")
def nemo():
    with server_client(SERVER_DIR, {"semantics": "nemo_gym"}) as c:
        yield c


@pytest.fixture(scope="module")
def ours():
    with server_client(SERVER_DIR) as c:
        yield c


def followed(client, instruction_id: str, kwargs: dict[str, Any] | None, text: str) -> bool:
    row = {
        "responses_create_params": PROMPT,
        "instruction_id_list": [instruction_id],
        "kwargs": [kwargs],
        "response": assistant_response(text),
    }
    [answer] = post_verify(client, row)["follow_instruction_list"]
    return answer


# -- NeMo Gym's own rows ---------------------------------------------------------------------------------


def test_nemo_gym_rollouts_get_nemo_gyms_follow_lists_and_rewards(nemo):
    """NeMo Gym's recorded rollouts, re-verified under `semantics: nemo_gym` (binary reward for rows without
    `grading_mode`, NeMo Gym's default): the same follow lists and rewards [0, 1, 0, 0, 1]. By hand, the
    instructions not followed:
    1. count:lowercase_counting N=3: the answer has 111 lower-case words (`\\b[a-z]+\\b`), not at most 3.
    3. first_word:first_word_sent "relationship": a sentence starts "Relationship-informed", and the first
       word is the whole whitespace-separated token.
    4. nth_paragraph_first_word (4 paragraphs, 3rd starts "crash"): the 3rd paragraph starts
       "Crash—emotion"; IFEval cuts the first token at . , ? ! ' " only, so the word is "crash—emotion".
    The other instructions hold: e.g. letters:letter_counting "at least 3 letters" and last_word_answer
    "contest" (the answer ends "a new kind of contest.")."""
    for rollout in NEMO_GYM_ROLLOUTS:
        row = {
            k: v
            for k, v in rollout.items()
            if k not in ("reward", "follow_all_instructions", "follow_instruction_list")
        }
        result = post_verify(nemo, row)
        assert result["follow_instruction_list"] == rollout["follow_instruction_list"]
        assert result["reward"] == rollout["reward"] and result["grading_mode"] == "binary"
    assert [r["reward"] for r in NEMO_GYM_ROLLOUTS] == [0.0, 1.0, 0.0, 0.0, 1.0]


def test_nemo_gym_rows_are_accepted(nemo, ours):
    for client in (nemo, ours):
        for row in NEMO_GYM_ROWS:
            assert client.post("/seed_session", json=row, headers={"X-Session-Id": str(row["id"])}).status_code == 200
            result = post_verify(client, {**row, "response": assistant_response("A short answer.")})
            assert len(result["follow_instruction_list"]) == len(row["instruction_id_list"])
            assert result["id"] == row["id"]  # the row comes back


def test_every_id_of_nemo_gyms_example_rows_is_known():
    ids = {i for row in NEMO_GYM_ROWS for i in row["instruction_id_list"]}
    app = import_file(SERVER_DIR / "app.py")
    assert ids <= set(app.REGISTRIES["nemo_gym"]) and ids <= set(app.REGISTRIES["ours"])
    assert {
        "count:lowercase_counting",
        "paragraphs:paragraphs",
        "first_word:first_word_sent",
        "last_word:last_word_answer",
        "letters:letter_counting",
    } <= ids


# -- the 29 more ids: each followed and not ----------------------------------------------------------------

IFTRAIN_CASES = [
    # (id, kwargs, a text that follows it, one that does not) -- the reasons by hand:
    # phrases found from "The" to "worm": 2, each 6 words with one word changed (cat / eats) | none changed
    (
        "copy:repeat_phrase",
        {"phrase": "The early bird catches the worm", "small_n": 2},
        "The early cat catches the worm. The early bird eats the worm.",
        "The early bird catches the worm. The early bird catches the worm.",
    ),
    ("copy:copy", {"prompt_to_repeat": "Write a haiku."}, "  write a HAIKU. ", "Write a haiku. Here it is."),
    # "Hello brave new world"[6:15] == "brave new"
    (
        "new:copy_span_idx",
        {"prompt_to_repeat": "Hello brave new world", "n_start": 6, "n_end": 15},
        "Brave new",
        "brave new world",
    ),
    (
        "copy:copying_simple",
        {"prompt_to_repeat": "Tell me a joke."},
        "tell me a joke.",
        "Tell me a joke. Why did the chicken...",
    ),
    (
        "copy:copying_multiple",
        {"prompt_to_repeat": "Say hi", "N": 2},
        "Say hi\n******\nsay hi",
        "Say hi ****** Say hi ****** Say hi",
    ),
    # pieces between hyphens are exactly the sentences | "I ran. " keeps a space
    ("detectable_format:sentence_hyphens", None, "I ran.-You walked.", "I ran. - You walked."),
    # c->l, l->f are not one letter up | a->b is
    ("keywords:no_adjacent_consecutive", None, "cats like fish", "a big cat"),
    ("detectable_format:square_brackets", None, "[Hello] [world]", "[Hello] world"),
    # "Moon" once | "moon" twice as text: "moon", "honeymoon"
    ("keywords:word_once", {"keyword": "moon"}, "The Moon is bright.", "moon and honeymoon"),
    (
        "keywords:word_count_different_numbers",
        {"keyword": "sun", "frequency": 2, "relation": "at least"},
        "Sun, sun!",
        "The sun.",
    ),
    # " blue " is not there (case counts) | it is
    ("keywords:exclude_word_harder", {"keyword": "blue"}, "The sky is Blue today", "The blue sky"),
    ("paragraphs:paragraphs", {}, "First.\n***\nSecond.", "First.\n***\nSecond.\n***\nThird."),
    # an empty piece between two "\n\n"
    ("paragraphs:paragraphs2", {}, "First.\n\nSecond.", "First.\n\n\n\nSecond."),
    (
        "first_word:first_word_sent",
        {"first_word": "relationship"},
        "Relationship one. Relationship two!",
        "Relationship one. Another two.",
    ),
    # the first token is "Well" | "I"
    ("first_word:first_word_answer", {"first_word": "Well"}, "Well I think so.", "I think so, well"),
    # last words "end." and "END!" less punctuation | "not."
    ("last_word:last_word_sent", {"last_word": "end"}, "This is the end. Not the END!", "The end. Or not."),
    ("last_word:last_word_answer", {"last_word": "contest"}, "A new kind of contest.", "The contest is over"),
    # "<<I" "am>>" "<<at" "home>>" | "at" does not open a pair
    ("detectable_format:bigram_wrapping", None, "<<I am>> <<at home>>", "<<I am>> at home"),
    ("punctuation:punctuation_dot", None, "No dots here!", "A dot."),
    ("punctuation:punctuation_exclamation", None, "Calm.", "Wow!"),
    # lower-case words: sat, on, mat (3) | cat, sat, on, the, mat (5)
    ("count:lowercase_counting", {"N": 3}, "The Cat sat on mat", "The cat sat on the mat"),
    ("letters:letter_counting", {"N": 3, "relation": "at least"}, "abc", "a1!"),
    # z in "zigzag": 2 | "zebra": 1
    ("letters:letter_counting2", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zigzag", "Zebra"),
    # 3 paragraphs of 1 sentence of 3 tokens ("I", "ran", ".") | "You sat down." has 4
    (
        "count:counting_composition",
        {"n_sent": 1, "n_words": 3},
        "I ran.\n***\nYou sat.\n***\nWe won.",
        "I ran.\n***\nYou sat down.\n***\nWe won.",
    ),
    # tokens One two three . | "two" twice
    ("count:count_unique", None, "One two three.", "One two one two."),
    ("count:count_increment_word", {"keyword1": "red", "keyword2": "blue"}, "red blue blue", "red red blue blue"),
    # "I" reads the same backwards | no word does
    ("keywords:palindrome", None, "I saw a racecar", "no palindromes here"),
    # sentence 2 "I see cat now." word 3 is "cat" | "a"
    (
        "keywords:keyword_specific_position",
        {"keyword": "cat", "n": 2, "m": 3},
        "Hello there. I see cat now.",
        "Hello there. I see a cat.",
    ),
    # tokens start "Yes" and end "yes" | end "."
    ("keywords:start_end", None, "Yes, I agree, yes", "Yes, I agree, yes."),
]


def test_the_cases_cover_every_added_id():
    assert {case[0] for case in IFTRAIN_CASES} == set(iftrain.IFTRAIN) and len(iftrain.IFTRAIN) == 29


@pytest.mark.parametrize(("instruction_id", "kwargs", "good", "bad"), IFTRAIN_CASES, ids=[c[0] for c in IFTRAIN_CASES])
def test_added_instruction(nemo, ours, instruction_id, kwargs, good, bad):
    for client in (nemo, ours):  # the added ids read the same under both semantics
        assert followed(client, instruction_id, kwargs, good) is True
        assert followed(client, instruction_id, kwargs, bad) is False


def test_repeat_phrase_reads_the_last_phrase_as_the_reference_does(nemo):
    """The reference needs each phrase found with at most one word changed and exactly one in the last: a
    changed phrase then an unchanged one (1, 0) does not follow; an unchanged then a changed one (0, 1) does."""
    kwargs = {"phrase": "The early bird catches the worm", "small_n": 2}
    assert (
        followed(nemo, "copy:repeat_phrase", kwargs, "The early cat catches the worm. The early bird catches the worm.")
        is False
    )
    assert (
        followed(nemo, "copy:repeat_phrase", kwargs, "The early bird catches the worm. The early cat catches the worm.")
        is True
    )


def test_phrase_stretches_find_what_the_regex_finds():
    """`phrase_stretches` against `re.findall(first + " .*? " + last)` on 3,000 random texts over a small
    alphabet (words "a", "b", "ab", spaces, line breaks), so that starts, ends and breaks interleave."""
    import random
    import re

    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(["a", "b", "ab", " ", " ", "\n"]) for _ in range(rng.randint(0, 40)))
        for first, last in (("a", "b"), ("ab", "a"), ("a", "a")):
            assert iftrain.phrase_stretches(text, first, last) == re.findall(first + " .*? " + last, text), (
                text,
                first,
                last,
            )


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "error"),
    [
        ("count:lowercase_counting", {"N": -1}, "N"),
        ("count:lowercase_counting", {"n": 3}, "n"),  # an unknown key
        ("letters:letter_counting", {"N": 3, "relation": "about"}, "relation"),
        ("new:copy_span_idx", {"prompt_to_repeat": "x", "n_start": 0}, "n_end"),
        ("paragraphs:paragraph", {}, "paragraphs:paragraphs"),  # an unknown id, with the close one
    ],
)
def test_bad_kwargs_get_422_naming_them(nemo, instruction_id, kwargs, error):
    row = {
        "responses_create_params": PROMPT,
        "instruction_id_list": [instruction_id],
        "kwargs": [kwargs],
        "response": assistant_response("x"),
    }
    answer = nemo.post("/verify", json=row)
    assert answer.status_code == 422 and error in answer.text, answer.text


# -- IFEval's own readings (semantics: nemo_gym) vs ours ------------------------------------------------------


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "text", "by_nemo_gym", "by_ours"),
    [
        # "light" inside "lightning": IFEval matches text anywhere, ours whole words
        ("keywords:existence", {"keywords": ["light"]}, "A flash of lightning.", True, False),
        # "sun" in "sunny" and "sun": 2 vs 1 whole word
        ("keywords:frequency", {"keyword": "sun", "frequency": 2, "relation": "at least"}, "A sunny sun.", True, False),
        # first token "Crash—then" is cut at . , ? ! ' " only: "crash—then" | ours: the first \w+ run, "Crash"
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "crash"},
            "Intro.\n\nCrash—then silence.",
            False,
            True,
        ),
        # "P.S." in the middle of a line: IFEval finds it anywhere, ours at a line's start
        ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Thanks. P.S. see you", True, False),
        # no letters: langdetect reads nothing; IFEval counts that as followed, ours not
        ("language:response_language", {"language": "en"}, "12345 67890", True, False),
        # all lower case but French: IFEval also asks langdetect for English
        (
            "change_case:english_lowercase",
            None,
            "bonjour mes amis, je suis très content de vous voir aujourd'hui.",
            False,
            True,
        ),
        # tokens "U.S" "." "NASA" "FBI": 3 upper-case | ours \w+ runs "U" "S" "NASA" "FBI": 4
        (
            "change_case:capital_word_frequency",
            {"capital_frequency": 4, "capital_relation": "at least"},
            "U.S. NASA and FBI",
            False,
            True,
        ),
    ],
)
def test_ifeval_readings_under_nemo_gym_semantics(nemo, ours, instruction_id, kwargs, text, by_nemo_gym, by_ours):
    assert followed(nemo, instruction_id, kwargs, text) is by_nemo_gym
    assert followed(ours, instruction_id, kwargs, text) is by_ours


def test_each_reference_reading_is_tested():
    reference = import_file(SERVER_DIR / "ifeval_reference.py")
    tested = {
        "keywords:existence",
        "keywords:frequency",
        "length_constraints:nth_paragraph_first_word",
        "detectable_content:postscript",
        "language:response_language",
        "change_case:english_lowercase",
        "change_case:capital_word_frequency",
        "change_case:english_capital",
    }
    assert set(reference.REFERENCE_CHECKS) == tested


def test_english_capital_asks_for_english(nemo, ours):
    """All capitals either way; IFEval also needs langdetect (seeded) to read English: the English text is, the
    French one is not (it reads "de" for this upper-case French)."""
    english, french = (
        "HELLO MY FRIENDS, I AM VERY HAPPY TO SEE YOU TODAY.",
        "BONJOUR MES AMIS, JE SUIS TRÈS CONTENT DE VOUS VOIR AUJOURD'HUI.",
    )
    assert followed(nemo, "change_case:english_capital", None, english) is True
    assert followed(nemo, "change_case:english_capital", None, french) is False
    assert followed(ours, "change_case:english_capital", None, french) is True


# -- grading_mode ---------------------------------------------------------------------------------------------


def _two_instructions(grading_mode: str | None = None) -> dict[str, Any]:
    # "no comma" followed, "at least 50 words" not: fraction 1/2, binary 0
    row = {
        "responses_create_params": PROMPT,
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [None, {"num_words": 50, "relation": "at least"}],
        "response": assistant_response("Short and plain."),
    }
    return {**row, "grading_mode": grading_mode} if grading_mode else row


@pytest.mark.parametrize(
    ("config", "grading_mode", "reward"),
    [
        ({}, None, 0.5),  # ours: fraction by default
        ({"semantics": "nemo_gym"}, None, 0.0),  # NeMo Gym: binary by default
        ({"semantics": "nemo_gym"}, "fraction", 0.5),  # the row's grading_mode wins
        ({}, "binary", 0.0),
        (
            {"semantics": "nemo_gym", "all_or_nothing": False},
            None,
            0.5,
        ),  # an explicit all_or_nothing wins over the semantics' default
        ({"all_or_nothing": True}, None, 0.0),
    ],
)
def test_grading_mode(config, grading_mode, reward):
    with server_client(SERVER_DIR, config) as client:
        result = post_verify(client, _two_instructions(grading_mode))
    assert result["reward"] == reward and result["grading_mode"] == ("binary" if reward == 0.0 else "fraction")


def test_bad_grading_mode_gets_422(nemo):
    answer = nemo.post("/verify", json=_two_instructions("partial"))
    assert answer.status_code == 422 and "grading_mode" in answer.text
