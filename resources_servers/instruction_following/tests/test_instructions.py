"""Every instruction checker on texts that follow it and texts that do not (no server needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]


instructions = import_file(SERVER_DIR / "instructions.py")

# (instruction id, kwargs, text, followed?) — at least one True and one False per instruction id.
CASES: list[tuple[str, dict[str, Any], str, bool]] = [
    ("keywords:existence", {"keywords": ["moon", "bright"]}, "The Moon is BRIGHT tonight.", True),
    ("keywords:existence", {"keywords": ["moon", "bright"]}, "The moon is dim.", False),
    ("keywords:existence", {"keywords": ["sun"]}, "It was a sunny day.", False),  # whole words only
    (
        "keywords:frequency",
        {"keyword": "tea", "frequency": 2, "relation": "at least"},
        "Tea, more tea, and cake.",
        True,
    ),
    ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "at least"}, "Tea and teapots.", False),
    ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "less than"}, "Tea and teapots.", True),
    ("keywords:frequency", {"keyword": "tea", "frequency": 1, "relation": "exactly"}, "tea tea", False),
    ("keywords:forbidden_words", {"forbidden_words": ["very", "nice"]}, "A pleasant, calm evening.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["very", "nice"]}, "A Very calm evening.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["nice"]}, "Nicer days ahead.", True),  # whole words only
    (
        "keywords:letter_frequency",
        {"letter": "a", "let_frequency": 3, "let_relation": "at least"},
        "A banana.",
        True,
    ),  # 4 a's
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 3, "let_relation": "less than"}, "A banana.", False),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 1, "let_relation": "less than"},
        "No such letter.",
        True,
    ),
    (
        "language:response_language",
        {"language": "fr"},
        "Le chat dort sur le canapé pendant que la pluie tombe dehors.",
        True,
    ),
    (
        "language:response_language",
        {"language": "fr"},
        "The cat sleeps on the sofa while the rain falls outside.",
        False,
    ),
    ("language:response_language", {"language": "en"}, "12345 !!!", False),  # nothing to detect
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "exactly"},
        "One. Two is Dr. Who! Three?",
        True,
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "at least"},
        "Only one sentence here.",
        False,
    ),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at most"}, "One. Two.", True),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}, "One. Two.", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n\nSecond part.", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "A\n***\n***\nB", False),  # empty middle paragraph
    ("length_constraints:number_paragraphs", {"num_paragraphs": 1}, "***\nOnly one.\n***", True),  # empty ends are fine
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five", True),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four", False),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at most"}, "it's fine", True),  # it, s, fine
    ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}, "one two three", False),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "finally"},
        "Start here.\n\n**Finally**, the end.",
        True,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "finally"},
        "Start here.\n\nAt last, the end.",
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "start"},
        "Start here.\n\nMore.\n\nAnd more.",
        False,
    ),  # three paragraphs
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], see you at [place].", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], see you there.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Thanks!\n\nP.S. Bring tea.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Thanks! Bring tea.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.P.S Also this.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.S. Only one.", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Tips:\n* drink water\n- sleep well", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Tips:\n* drink water\n* sleep well\n* walk", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "**Bold** is not a bullet\n* one", True),
    ("detectable_format:constrained_response", {}, "My answer is yes.", True),
    ("detectable_format:constrained_response", {}, "Yes, definitely.", False),
    ("detectable_format:constrained_response", {"options": ["Option A", "Option B"]}, "Option B", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "A *first* and **second** part.", True),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "Only *one* here, and ** ** empty.",
        False,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\nIntro.\nSECTION 2\nBody.",
        True,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\nIntro and body.",
        False,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "Section 1\nA\nSection 2\nB",
        False,
    ),
    ("detectable_format:json_format", {}, '{"answer": [1, 2]}', True),
    ("detectable_format:json_format", {}, '```json\n{"answer": "yes"}\n```', True),
    ("detectable_format:json_format", {}, 'Here it is: {"answer": "yes"}', False),
    ("detectable_format:json_format", {}, "[" * 100_000 + "]" * 100_000, False),  # too deep for the parser: no crash
    ("detectable_format:title", {}, "<<The Moon>>\nIt shines.", True),
    ("detectable_format:title", {}, "The Moon\nIt shines. << >>", False),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", True),
    ("combination:two_responses", {}, "Same.\n******\nSame.", False),
    ("combination:two_responses", {}, "One.\n******\nTwo.\n******\nThree.", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write about tea."}, "write about tea. Tea is a drink.", True),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write about tea."},
        "Sure! Write about tea. Tea is a drink.",
        False,
    ),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, 'Tea is good. Any other questions?"', True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Bye.", False),
    ("startend:start_checker", {"start_phrase": "Here is my answer"}, "  here is my answer: tea.", True),
    ("startend:start_checker", {"start_phrase": "Here is my answer"}, "Well, here is my answer.", False),
    ("startend:quotation", {}, '"Tea is a drink."', True),
    ("startend:quotation", {}, 'Tea is a "drink".', False),
    ("startend:quotation", {}, '"', False),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "TEA is GOOD. I agree.",
        True,
    ),  # TEA, GOOD, I
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "TEA is GOOD.",
        False,
    ),
    ("change_case:english_capital", {}, "TEA IS A DRINK, 100%.", True),
    ("change_case:english_capital", {}, "TEA IS A Drink.", False),
    ("change_case:english_lowercase", {}, "tea is a drink, 100%.", True),
    ("change_case:english_lowercase", {}, "tea is a Drink.", False),
    ("punctuation:no_comma", {}, "Tea is hot. Cake is sweet.", True),
    ("punctuation:no_comma", {}, "Tea, cake.", False),
]


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "text", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_checker(instruction_id: str, kwargs: dict[str, Any], text: str, expected: bool) -> None:
    [bound] = instructions.bind_instructions([instruction_id], [kwargs])
    assert bound.check(text) is expected


def test_every_instruction_has_positive_and_negative_cases() -> None:
    covered = {(c[0], c[3]) for c in CASES}
    assert len(instructions.INSTRUCTIONS) >= 20
    for instruction_id in instructions.INSTRUCTIONS:
        assert (instruction_id, True) in covered and (instruction_id, False) in covered, instruction_id


def test_every_instruction_has_a_description() -> None:
    for instruction_id in instructions.INSTRUCTIONS:
        [bound] = instructions.bind_instructions([instruction_id], [example_kwargs(instruction_id)])
        assert bound.describe().strip(), instruction_id


def example_kwargs(instruction_id: str) -> dict[str, Any]:
    return next(kwargs for i, kwargs, _, _ in CASES if i == instruction_id)


@pytest.mark.parametrize(
    ("ids", "kwargs", "message"),
    [
        (["punctuation:no_coma"], [{}], "did you mean 'punctuation:no_comma'"),
        (["punctuation:no_comma", "detectable_format:title"], [{}], "has 2 entries but kwargs has 1"),
        (["length_constraints:number_words"], [{"num_words": 5}], "relation"),
        (["length_constraints:number_words"], [{"num_words": 5, "relation": "around"}], "relation"),
        (["length_constraints:number_words"], [{"num_words": -1, "relation": "at least"}], "num_words"),
        (["punctuation:no_comma"], [{"surprise": 1}], "surprise"),
        (["keywords:letter_frequency"], [{"letter": "ab", "let_frequency": 1, "let_relation": "at least"}], "letter"),
        (["language:response_language"], [{"language": "klingon"}], "langdetect knows no language"),
    ],
)
def test_bad_rows_name_the_problem(ids: list[str], kwargs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        instructions.bind_instructions(ids, kwargs)


def test_none_kwargs_are_dropped_as_in_ifevals_hf_copy() -> None:
    [bound] = instructions.bind_instructions(["punctuation:no_comma"], [{"num_words": None, "relation": None}])
    assert bound.check("no commas here")
    [bound] = instructions.bind_instructions(["detectable_format:title"], [None])
    assert bound.check("<<t>>")


def test_loose_variants_drop_first_and_last_lines_and_asterisks() -> None:
    # IFEval's loose reading: the text, minus its first line, minus its last line, minus both; each also without '*'.
    assert instructions.loose_variants("Sure!\n**Body**\nBye") == [
        "Sure!\n**Body**\nBye",
        "**Body**\nBye",
        "Sure!\n**Body**",
        "**Body**",
        "Sure!\nBody\nBye",
        "Body\nBye",
        "Sure!\nBody",
        "Body",
    ]
    assert instructions.loose_variants("one line") == ["one line"]  # repeats dropped


def test_strict_and_loose_reading() -> None:
    [title] = instructions.bind_instructions(["startend:quotation"], [{}])
    text = 'Here you go:\n"Tea is a drink."'
    assert not instructions.follows(title, text, loose=False)
    assert instructions.follows(title, text, loose=True)  # without its first line
    [lower] = instructions.bind_instructions(["change_case:english_lowercase"], [{}])
    assert not instructions.follows(lower, "", loose=False) and not instructions.follows(lower, "", loose=True)


def test_language_detection_is_deterministic() -> None:
    [language] = instructions.bind_instructions(["language:response_language"], [{"language": "es"}])
    text = "El gato duerme en el sofá."
    assert len({language.check(text) for _ in range(5)}) == 1
