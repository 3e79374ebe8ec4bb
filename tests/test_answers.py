"""nemo_gym.env.answers: each extraction form, its order, malformed model output and normalisation."""

from __future__ import annotations

import time
from typing import Any

import pytest

from nemo_gym.env.answers import (
    first_answer,
    last_answer_phrase,
    last_answer_tag,
    last_assistant_text,
    last_boxed,
    last_line,
    message_output_text,
    normalize_text,
    strip_thinking,
)
from nemo_gym.env.testing import assistant_response


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("\\boxed{1} then \\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),  # the last box, nested braces matched
        ("\\boxed{ 7 }", "7"),
        ("\\boxed{}", ""),  # an empty box is an (empty) answer, not None
        ("\\boxed{3} and \\boxed{5", "3"),  # the unclosed last box is skipped
        ("\\boxed{5", None),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


def test_last_boxed_without_skipping_or_stripping() -> None:
    assert (
        last_boxed("\\boxed{3} and \\boxed{5", skip_unclosed=False) is None
    )  # mcqa: an unclosed last box is no answer
    assert last_boxed("\\boxed{ B }", strip=False) == " B "


def test_tags_phrases_and_lines() -> None:
    assert last_answer_tag("<answer>1</answer> <ANSWER> 2 </ANSWER>") == "2"
    assert last_answer_tag("<answer>open") is None
    assert last_answer_phrase("The answer is 3.\nNo, the answer is: **4**") == "4"
    assert (
        last_answer_phrase("The answer is 3, no, the answer is 4") == "3, no, the answer is 4"
    )  # one match per line, to its end
    assert last_answer_phrase("The answer is 4.", decoration=" *_`.") == "4"
    assert last_answer_phrase("answer: **") is None  # nothing left once decoration is stripped
    assert last_line("a\n  b  \n\n") == "b" and last_line(" \n ") is None
    assert strip_thinking("<think>\\boxed{1}</think>x<think>y</think>") == "x"


@pytest.mark.parametrize(
    "unit", ["\\boxed{", "<think>", "<answer>", "<ANSWER>", "<think> <answer> \\boxed{ The answer is: "]
)
def test_extraction_is_linear_on_a_megabyte_of_unclosed_tags(unit: str) -> None:
    # A model stuck in a loop. The lazy regexes and the box scanned from every `\boxed{` this replaced took
    # 6 to 90 s on a tenth of this text (quadratic); linear, it takes a fraction of a second.
    text = unit * (2**20 // len(unit))
    start_s = time.monotonic()
    assert strip_thinking(text) == text  # nothing closed, nothing dropped
    assert last_boxed(text) is None and last_answer_tag(text) is None
    assert time.monotonic() - start_s < 5.0


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("It is \\boxed{Paris}.\n<answer>Lyon</answer>", "Paris"),
        ("<answer> Lyon </answer>\nThe answer is Nice", "Lyon"),
        ("Hmm. The answer is: *Nice*\nbye", "Nice"),
        ("Hmm.\nRome", "Rome"),
        ("   ", None),
    ],
)
def test_first_answer_tries_the_forms_in_order(text: str, answer: str | None) -> None:
    assert first_answer(text, ("boxed", "answer_tag", "answer_phrase", "last_line")) == answer


def test_first_answer_with_one_form() -> None:
    assert first_answer("Hmm.\nParis", ("full",)) == "Hmm.\nParis"
    assert first_answer("Paris", ("boxed",)) is None


@pytest.mark.parametrize(
    ("response", "text"),
    [
        (assistant_response("first", "last"), "last"),
        (assistant_response("answer", "  "), "answer"),  # a blank last message is skipped
        ({"output": [{"type": "message", "role": "user", "content": [{"type": "output_text", "text": "user"}]}]}, ""),
        ({"output": "not a list"}, ""),
        ({"output": 5}, ""),
        ({"output": [None, 3, {"type": "message", "content": "plain string"}]}, ""),
        (
            {
                "output": [
                    {
                        "type": "message",
                        "content": [{"type": "output_text", "text": 7}, {"type": "output_text", "text": "ok"}],
                    }
                ]
            },
            "ok",
        ),
        ({}, ""),
    ],
)
def test_last_assistant_text_never_raises(response: dict[str, Any], text: str) -> None:
    assert last_assistant_text(response) == text


def test_normalize_text() -> None:
    assert normalize_text("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_text("ﬁne", nfkc=True) == "fine"  # the ligature becomes two letters
    assert normalize_text("The Tower!", lower=False) == "Tower"
    assert normalize_text("A  b,c", strip_punctuation=False, strip_articles=False) == "a b,c"


@pytest.mark.parametrize(
    ("item", "text"),
    [
        (
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}],
            },
            "ab",
        ),
        (
            {
                "type": "message",
                "content": [
                    {"type": "refusal", "refusal": "no"},
                    {"type": "output_text", "text": 3},
                    "x",
                    {"type": "output_text", "text": "c"},
                ],
            },
            "c",
        ),
        ({"type": "message", "content": "a plain string"}, ""),  # not content parts
        ({"type": "function_call", "content": [{"type": "output_text", "text": "a"}]}, None),
        ({"content": [{"type": "output_text", "text": "a"}]}, None),  # no type: not a message item
        ("message", None),
    ],
)
def test_message_output_text(item: Any, text: str | None) -> None:
    assert message_output_text(item) == text
