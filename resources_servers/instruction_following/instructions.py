"""Verifiable instructions in the style of IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for
Large Language Models", arXiv:2311.07911): a registry of checkers, each an instruction id, a pydantic model of
its keyword arguments, a description (the sentence a prompt uses to ask for it) and `check(text, args) -> bool`.

Instruction ids and keyword-argument names are IFEval's (`length_constraints:number_words` with `num_words`
and `relation`, ...), so IFEval rows (`{"key", "prompt", "instruction_id_list", "kwargs"}`) are read as they
are; `None`-valued kwargs (the Hugging Face copy of IFEval lists every key of every instruction) are dropped
before validation. The code is ours. Where it departs from IFEval's reference implementation:

- `relation` accepts `less than`, `at most`, `exactly` and `at least` (IFEval: `less than`, `at least`).
- Keywords match as whole words, case-insensitively, everywhere (IFEval's existence and frequency checks
  match substrings).
- Sentences are split by the rule-based `syntok` segmenter (IFEval: its own regex splitter); words are `\\w+`
  runs, as IFEval's; upper-case words are `\\w+` runs that are upper case (IFEval: nltk's word tokenizer).
- `change_case:english_capital` / `english_lowercase` check the case only (IFEval also asks `langdetect` for
  English); the language is `language:response_language`'s job.
- `detectable_content:postscript` needs the marker at the start of a line (IFEval: anywhere in a line).
- `language:response_language` fails on a text `langdetect` cannot read (IFEval passes it); `langdetect` is
  seeded, so the same text always gets the same language.
- Added: `startend:start_checker` (`start_phrase`) and optional `options` for
  `detectable_format:constrained_response` (IFEval's three "My answer is ..." options by default).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import langdetect
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from syntok import segmenter

from nemo_gym.config import did_you_mean

__all__ = [
    "Instruction",
    "BoundInstruction",
    "INSTRUCTIONS",
    "Relation",
    "bind_instructions",
    "loose_variants",
    "follows",
    "follow_lists",
]

Relation = Literal["less than", "at most", "exactly", "at least"]
LANGUAGE_NAMES = {
    "en": "English",
    "fr": "French",
    "de": "German",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "nl": "Dutch",
    "sw": "Swahili",
}
DEFAULT_CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
langdetect.DetectorFactory.seed = 0  # langdetect samples n-grams at random: a fixed seed makes it deterministic


class Args(BaseModel):
    """Keyword arguments of an instruction: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(Args):
    """An instruction without keyword arguments."""


@dataclass(frozen=True)
class Instruction:
    """One verifiable instruction type: `check(text, args)` says whether `text` follows it."""

    instruction_id: str
    args_model: type[Args]
    check: Callable[[str, Any], bool]
    describe: Callable[[Any], str]


@dataclass(frozen=True)
class BoundInstruction:
    """An instruction with its validated keyword arguments (one entry of a row's `instruction_id_list`)."""

    instruction: Instruction
    args: Args

    @property
    def instruction_id(self) -> str:
        return self.instruction.instruction_id

    def check(self, text: str) -> bool:
        return self.instruction.check(text, self.args)

    def describe(self) -> str:
        return self.instruction.describe(self.args)


INSTRUCTIONS: dict[str, Instruction] = {}


def register(
    instruction_id: str,
    args_model: type[Args],
    describe: Callable[[Any], str],
    registry: dict[str, Instruction] | None = None,
) -> Callable:
    """Decorator: add `check(text, args) -> bool` to `registry` (default `INSTRUCTIONS`) under `instruction_id`."""

    def decorator(check: Callable[[str, Any], bool]) -> Callable[[str, Any], bool]:
        (INSTRUCTIONS if registry is None else registry)[instruction_id] = Instruction(
            instruction_id, args_model, check, describe
        )
        return check

    return decorator


# -- counting helpers -----------------------------------------------------------------------------------
def compare(count: int, relation: Relation, threshold: int) -> bool:
    """Whether `count <relation> threshold` holds."""
    return {
        "less than": count < threshold,
        "at most": count <= threshold,
        "exactly": count == threshold,
        "at least": count >= threshold,
    }[relation]


def count_words(text: str) -> int:
    """Number of `\\w+` runs (IFEval's word count)."""
    return len(re.findall(r"\w+", text))


def count_sentences(text: str) -> int:
    """Number of sentences `syntok` finds (rule-based, linear time; blank lines also end a sentence)."""
    return sum(1 for paragraph in segmenter.analyze(text) for sentence in paragraph if sentence)


def word_pattern(word: str) -> re.Pattern[str]:
    """`word` as a whole word (no word character on either side), case-insensitive."""
    return re.compile(r"(?<!\w)" + re.escape(word.strip()) + r"(?!\w)", re.IGNORECASE)


def non_blank(items: list[str]) -> list[str]:
    return [item for item in items if item.strip()]


@lru_cache(maxsize=1)
def known_languages() -> frozenset[str]:
    """Language codes `langdetect` knows (ISO 639-1, plus e.g. `zh-cn`), from its bundled profiles."""
    return frozenset(path.name for path in (Path(langdetect.__file__).parent / "profiles").iterdir())


# -- keyword arguments ----------------------------------------------------------------------------------
class KeywordsArgs(Args):
    keywords: list[str] = Field(min_length=1, description="words that must all appear")


class KeywordFrequencyArgs(Args):
    keyword: str = Field(min_length=1)
    frequency: int = Field(ge=0)
    relation: Relation


class ForbiddenWordsArgs(Args):
    forbidden_words: list[str] = Field(min_length=1)


class LetterFrequencyArgs(Args):
    letter: str = Field(pattern=r"^[A-Za-z]$", description="one English letter, counted case-insensitively")
    let_frequency: int = Field(ge=0)
    let_relation: Relation


class LanguageArgs(Args):
    language: str = Field(description="language code as langdetect writes it, e.g. en, fr, de")

    @field_validator("language")
    @classmethod
    def _known(cls, language: str) -> str:
        if language not in known_languages():
            raise ValueError(
                f"langdetect knows no language {language!r} (known: {', '.join(sorted(known_languages()))})"
            )
        return language


class SentencesArgs(Args):
    num_sentences: int = Field(ge=0)
    relation: Relation


class ParagraphsArgs(Args):
    num_paragraphs: int = Field(ge=1)


class WordsArgs(Args):
    num_words: int = Field(ge=0)
    relation: Relation


class NthParagraphArgs(Args):
    num_paragraphs: int = Field(ge=1)
    nth_paragraph: int = Field(ge=1)
    first_word: str = Field(pattern=r"^\w+$")


class PlaceholdersArgs(Args):
    num_placeholders: int = Field(ge=0)


class PostscriptArgs(Args):
    postscript_marker: str = Field(min_length=1, description="e.g. P.S. or P.P.S")


class BulletsArgs(Args):
    num_bullets: int = Field(ge=0)


class ConstrainedArgs(Args):
    options: list[str] = Field(default=list(DEFAULT_CONSTRAINED_OPTIONS), min_length=1)


class HighlightsArgs(Args):
    num_highlights: int = Field(ge=0)


class SectionsArgs(Args):
    section_spliter: str = Field(
        min_length=1, description="word that opens each section, e.g. SECTION (IFEval's spelling)"
    )
    num_sections: int = Field(ge=1)


class RepeatPromptArgs(Args):
    prompt_to_repeat: str = Field(min_length=1)


class EndArgs(Args):
    end_phrase: str = Field(min_length=1)


class StartArgs(Args):
    start_phrase: str = Field(min_length=1)


class CapitalWordsArgs(Args):
    capital_frequency: int = Field(ge=0)
    capital_relation: Relation


# -- keywords -------------------------------------------------------------------------------------------
@register(
    "keywords:existence",
    KeywordsArgs,
    lambda a: f"Include the keywords {', '.join(repr(k) for k in a.keywords)} in the response.",
)
def keywords_existence(text: str, args: KeywordsArgs) -> bool:
    return all(word_pattern(keyword).search(text) for keyword in args.keywords)


@register(
    "keywords:frequency",
    KeywordFrequencyArgs,
    lambda a: f"In your response, the word {a.keyword!r} should appear {a.relation} {a.frequency} times.",
)
def keyword_frequency(text: str, args: KeywordFrequencyArgs) -> bool:
    return compare(len(word_pattern(args.keyword).findall(text)), args.relation, args.frequency)


@register(
    "keywords:forbidden_words",
    ForbiddenWordsArgs,
    lambda a: f"Do not include the words {', '.join(repr(w) for w in a.forbidden_words)} in the response.",
)
def forbidden_words(text: str, args: ForbiddenWordsArgs) -> bool:
    return not any(word_pattern(word).search(text) for word in args.forbidden_words)


@register(
    "keywords:letter_frequency",
    LetterFrequencyArgs,
    lambda a: f"In your response, the letter {a.letter!r} should appear {a.let_relation} {a.let_frequency} times.",
)
def letter_frequency(text: str, args: LetterFrequencyArgs) -> bool:
    return compare(collections.Counter(text.lower())[args.letter.lower()], args.let_relation, args.let_frequency)


# -- language -------------------------------------------------------------------------------------------
@register(
    "language:response_language",
    LanguageArgs,
    lambda a: (
        f"Your ENTIRE response should be in {LANGUAGE_NAMES.get(a.language, a.language)} language, no other language is"
        " allowed."
    ),
)
def response_language(text: str, args: LanguageArgs) -> bool:
    try:
        return langdetect.detect(text) == args.language
    except langdetect.LangDetectException:  # no letters to read
        return False


# -- length ---------------------------------------------------------------------------------------------
@register(
    "length_constraints:number_sentences",
    SentencesArgs,
    lambda a: f"Your response should contain {a.relation} {a.num_sentences} sentences.",
)
def number_sentences(text: str, args: SentencesArgs) -> bool:
    return compare(count_sentences(text), args.relation, args.num_sentences)


@register(
    "length_constraints:number_paragraphs",
    ParagraphsArgs,
    lambda a: f"There should be {a.num_paragraphs} paragraphs. Paragraphs are separated with the markdown divider: ***",
)
def number_paragraphs(text: str, args: ParagraphsArgs) -> bool:
    paragraphs = re.split(r"\s?\*\*\*\s?", text)
    inner = paragraphs[1:-1]
    if any(not p.strip() for p in inner):  # an empty paragraph between two dividers
        return False
    return len(non_blank(paragraphs)) == args.num_paragraphs


@register("length_constraints:number_words", WordsArgs, lambda a: f"Answer with {a.relation} {a.num_words} words.")
def number_words(text: str, args: WordsArgs) -> bool:
    return compare(count_words(text), args.relation, args.num_words)


@register(
    "length_constraints:nth_paragraph_first_word",
    NthParagraphArgs,
    lambda a: (
        f"There should be {a.num_paragraphs} paragraphs. Paragraphs and only paragraphs are separated with each other"
        f" by two new lines. Paragraph {a.nth_paragraph} must start with the word {a.first_word!r}."
    ),
)
def nth_paragraph_first_word(text: str, args: NthParagraphArgs) -> bool:
    paragraphs = non_blank(re.split(r"\n\s*\n", text))
    if len(paragraphs) != args.num_paragraphs or args.nth_paragraph > len(paragraphs):
        return False
    first = re.search(r"\w+", paragraphs[args.nth_paragraph - 1])
    return first is not None and first.group(0).lower() == args.first_word.lower()


# -- detectable content ---------------------------------------------------------------------------------
@register(
    "detectable_content:number_placeholders",
    PlaceholdersArgs,
    lambda a: (
        f"The response must contain at least {a.num_placeholders} placeholders represented by square brackets, such as"
        " [address]."
    ),
)
def number_placeholders(text: str, args: PlaceholdersArgs) -> bool:
    # IFEval's pattern is `\[.*?\]`; no bracket inside keeps the scan linear on a text of many '['.
    return len(re.findall(r"\[[^\[\]\n]*\]", text)) >= args.num_placeholders


@register(
    "detectable_content:postscript",
    PostscriptArgs,
    lambda a: f"At the end of your response, please explicitly add a postscript starting with {a.postscript_marker}",
)
def postscript(text: str, args: PostscriptArgs) -> bool:
    marker = args.postscript_marker.strip().lower()
    if marker == "p.p.s":
        body = r"p\.\s?p\.\s?s"
    elif marker == "p.s.":
        body = r"p\.\s?s\."
    else:
        body = re.escape(marker)
    return re.search(r"^[ \t]*" + body, text.lower(), flags=re.MULTILINE) is not None


# -- detectable format ----------------------------------------------------------------------------------
@register(
    "detectable_format:number_bullet_lists",
    BulletsArgs,
    lambda a: (
        f"Your answer must contain exactly {a.num_bullets} bullet points. Use the markdown bullet points such as:\n*"
        " This is point 1.\n* This is point 2"
    ),
)
def number_bullet_lists(text: str, args: BulletsArgs) -> bool:
    # IFEval's `^\s*` also spans blank lines (same count, quadratic time on many of them): `[ \t]*` here.
    stars = re.findall(r"^[ \t]*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^[ \t]*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == args.num_bullets


@register(
    "detectable_format:constrained_response",
    ConstrainedArgs,
    lambda a: f"Answer with one of the following options: {' '.join(repr(o) for o in a.options)}",
)
def constrained_response(text: str, args: ConstrainedArgs) -> bool:
    return any(option in text.strip() for option in args.options)


@register(
    "detectable_format:number_highlighted_sections",
    HighlightsArgs,
    lambda a: (
        f"Highlight at least {a.num_highlights} sections in your answer with markdown, i.e. *highlighted section*."
    ),
)
def number_highlighted_sections(text: str, args: HighlightsArgs) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h[2:-2].strip()]
    return len(single) + len(double) >= args.num_highlights


@register(
    "detectable_format:multiple_sections",
    SectionsArgs,
    lambda a: (
        f"Your response must have {a.num_sections} sections. Mark the beginning of each section with"
        f" {a.section_spliter} X, such as: {a.section_spliter} 1"
    ),
)
def multiple_sections(text: str, args: SectionsArgs) -> bool:
    sections = re.split(r"\s?" + re.escape(args.section_spliter.strip()) + r"\s?\d+\s?", text)
    return len(sections) - 1 >= args.num_sections


@register(
    "detectable_format:json_format",
    NoArgs,
    lambda a: "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```.",
)
def json_format(text: str, args: NoArgs) -> bool:
    body = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        body = body.removeprefix(fence)
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return False
    return True


@register(
    "detectable_format:title",
    NoArgs,
    lambda a: "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
)
def title(text: str, args: NoArgs) -> bool:
    return any(t[2:-2].strip() for t in re.findall(r"<<[^\n<>]+>>", text))  # no '<' '>' inside: linear time


# -- combination ----------------------------------------------------------------------------------------
@register(
    "combination:two_responses",
    NoArgs,
    lambda a: (
        "Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: ******."
    ),
)
def two_responses(text: str, args: NoArgs) -> bool:
    parts = text.split("******")
    if any(not part.strip() for part in parts[1:-1]):
        return False
    responses = non_blank(parts)
    return len(responses) == 2 and responses[0].strip() != responses[1].strip()


@register(
    "combination:repeat_prompt",
    RepeatPromptArgs,
    lambda a: (
        "First repeat the request word for word without change, then give your answer (1. do not say any words or "
        "characters before repeating the request; 2. the request you need to repeat does not include this sentence)"
    ),
)
def repeat_prompt(text: str, args: RepeatPromptArgs) -> bool:
    return text.strip().lower().startswith(args.prompt_to_repeat.strip().lower())


# -- start / end ----------------------------------------------------------------------------------------
@register(
    "startend:end_checker",
    EndArgs,
    lambda a: (
        f"Finish your response with this exact phrase {a.end_phrase!r}. No other words should follow this phrase."
    ),
)
def end_checker(text: str, args: EndArgs) -> bool:
    return text.strip().strip('"').lower().endswith(args.end_phrase.strip().lower())


@register(
    "startend:start_checker", StartArgs, lambda a: f"Start your response with the exact phrase {a.start_phrase!r}."
)
def start_checker(text: str, args: StartArgs) -> bool:
    return text.strip().lstrip('"').lower().startswith(args.start_phrase.strip().lower())


@register("startend:quotation", NoArgs, lambda a: "Wrap your entire response with double quotation marks.")
def quotation(text: str, args: NoArgs) -> bool:
    body = text.strip()
    return len(body) > 1 and body[0] == '"' and body[-1] == '"'


# -- case and punctuation -------------------------------------------------------------------------------
@register(
    "change_case:capital_word_frequency",
    CapitalWordsArgs,
    lambda a: (
        f"In your response, words with all capital letters should appear {a.capital_relation} {a.capital_frequency}"
        " times."
    ),
)
def capital_word_frequency(text: str, args: CapitalWordsArgs) -> bool:
    capitals = [word for word in re.findall(r"\w+", text) if word.isupper()]
    return compare(len(capitals), args.capital_relation, args.capital_frequency)


@register(
    "change_case:english_capital",
    NoArgs,
    lambda a: "Your entire response should be in English, and in all capital letters.",
)
def english_capital(text: str, args: NoArgs) -> bool:
    return text.isupper()


@register(
    "change_case:english_lowercase",
    NoArgs,
    lambda a: (
        "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed."
    ),
)
def english_lowercase(text: str, args: NoArgs) -> bool:
    return text.islower()


@register("punctuation:no_comma", NoArgs, lambda a: "In your entire response, refrain from the use of any commas.")
def no_comma(text: str, args: NoArgs) -> bool:
    return "," not in text


# -- rows -----------------------------------------------------------------------------------------------
def bind_instructions(
    instruction_ids: list[str], kwargs_list: list[dict[str, Any] | None], registry: dict[str, Instruction] | None = None
) -> list[BoundInstruction]:
    """The instructions of a row, with validated keyword arguments (`None` values dropped, as IFEval's HF copy
    lists every key of every instruction), looked up in `registry` (default `INSTRUCTIONS`).

    Raises:
        ValueError: lists of different lengths, an unknown instruction id (with a close id when there is one),
            or keyword arguments the instruction does not accept; the message names the entry.
    """
    if len(instruction_ids) != len(kwargs_list):
        raise ValueError(f"instruction_id_list has {len(instruction_ids)} entries but kwargs has {len(kwargs_list)}")
    bound = []
    registry = INSTRUCTIONS if registry is None else registry
    for index, (instruction_id, kwargs) in enumerate(zip(instruction_ids, kwargs_list)):
        instruction = registry.get(instruction_id)
        if instruction is None:
            raise ValueError(
                f"instruction {index}: unknown instruction id"
                f" {instruction_id!r}{did_you_mean(instruction_id, registry)}"
            )
        arguments = {key: value for key, value in (kwargs or {}).items() if value is not None}
        try:
            args = instruction.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'kwargs'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"instruction {index} ({instruction_id}): bad kwargs {arguments!r}: {problems}") from None
        bound.append(BoundInstruction(instruction, args))
    return bound


def loose_variants(text: str) -> list[str]:
    """IFEval's loose reading: the text, without its first line, without its last line, without both, and each
    of those four with every `*` removed; blank and repeated variants are dropped (the text itself first)."""
    lines = text.split("\n")
    trimmed = [text, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return list(dict.fromkeys(non_blank(trimmed + [variant.replace("*", "") for variant in trimmed])))


def follows(instruction: BoundInstruction, text: str, loose: bool) -> bool:
    """Whether `text` follows `instruction`: as written (strict), or in any loose variant (loose)."""
    if not loose:
        return bool(text.strip()) and instruction.check(text)
    return any(instruction.check(variant) for variant in loose_variants(text))


def follow_lists(instructions: list[BoundInstruction], text: str) -> tuple[list[bool], list[bool]]:
    """(strict, loose) follow lists of `text`, one bool per instruction. Each variant is checked at most once:
    the strict answer is the loose reading's first variant."""
    strict = [follows(instruction, text, loose=False) for instruction in instructions]
    others = loose_variants(text)[1:]
    loose = [
        ok or any(instruction.check(variant) for variant in others) for instruction, ok in zip(instructions, strict)
    ]
    return strict, loose
