"""IFEval's own reading of its instructions, where `instructions.py` departs from it, and the text helpers of
IFEval's reference code that NeMo Gym's instructions (`iftrain.py`) use.

NeMo Gym's instruction_following server checks rows with the `verifiable-instructions` package: the
instructions AllenAI's open-instruct trains on (`open_instruct/IFEvalG`, Lambert et al. 2024, "Tulu 3",
arXiv:2411.15124): IFEval's 25 with IFEval's reference code, plus 29 new ones. The server's
`semantics: nemo_gym` checks IFEval's ids with `REFERENCE_CHECKS` below instead of our readings. The code is
ours, written from that reference's behaviour. Where it still departs from it:

- Sentences for `length_constraints:number_sentences` are counted by `syntok`, as in `instructions.py`: the
  reference loads NLTK's Punkt model, a data download no package registry serves (both split ordinary
  prose alike; they differ on unusual abbreviations).
- Word tokens (`word_tokens`, for the reference's `nltk.word_tokenize`) are `syntok`'s tokens, which split
  like NLTK's Treebank tokenizer on ordinary text (punctuation apart, "don't" -> "do" "n't") but also split
  hyphenated words.
- Keywords are matched as literal text, case-insensitively (the reference passes them to `re` as patterns,
  so a keyword such as "c++" raised and the instruction counted as not followed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import langdetect
from syntok.tokenizer import Tokenizer

from . import instructions

__all__ = ["split_into_sentences", "word_tokens", "REFERENCE_CHECKS"]

# -- IFEval's rule-based sentence splitter ------------------------------------------------------------------
# Periods that do not end a sentence are first written as PERIOD, sentence ends as STOP; then every remaining
# '.', '?', '!' ends a sentence. The rules and their order are the reference's (`split_into_sentences`).
PERIOD, STOP = "<prd>", "<stop>"
LETTER = "([A-Za-z])"
STARTERS = (
    r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s|This\s|Wherever)"
)
SUFFIXES = "(Inc|Ltd|Jr|Sr|Co)"
NOT_A_SENTENCE_END: list[tuple[re.Pattern[str], Any]] = [
    (re.compile("(Mr|St|Mrs|Ms|Dr)[.]"), rf"\1{PERIOD}"),  # titles
    (re.compile("[.](com|net|org|io|gov|edu|me)"), rf"{PERIOD}\1"),  # web addresses
    (re.compile("([0-9])[.]([0-9])"), rf"\1{PERIOD}\2"),  # decimals
    (re.compile(r"\.{2,}"), lambda m: PERIOD * len(m.group(0)) + STOP),  # an ellipsis ends the sentence after it
]
AFTER_PHD: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\s" + LETTER + "[.] "), rf" \1{PERIOD} "),  # an initial
    (re.compile("([A-Z][.][A-Z][.](?:[A-Z][.])?) " + STARTERS), rf"\1{STOP} \2"),  # an acronym ending a sentence
    (re.compile(LETTER + "[.]" + LETTER + "[.]" + LETTER + "[.]"), rf"\1{PERIOD}\2{PERIOD}\3{PERIOD}"),
    (re.compile(LETTER + "[.]" + LETTER + "[.]"), rf"\1{PERIOD}\2{PERIOD}"),
    (re.compile(" " + SUFFIXES + "[.] " + STARTERS), rf" \1{STOP} \2"),
    (re.compile(" " + SUFFIXES + "[.]"), rf" \1{PERIOD}"),
    (re.compile(" " + LETTER + "[.]"), rf" \1{PERIOD}"),
]
QUOTE_MOVES = [(".\u201d", "\u201d."), ('."', '".'), ('!"', '"!'), ('?"', '"?')]  # the mark goes after the quote


def split_into_sentences(text: str) -> list[str]:
    """The sentences of `text` by IFEval's rules (abbreviations, initials, decimals, web addresses and
    ellipses do not end a sentence; '.', '?', '!' do), each stripped; a text ending in a sentence end has no
    empty last sentence. Line breaks are spaces."""
    text = " " + text.replace("\n", " ") + "  "
    for pattern, replacement in NOT_A_SENTENCE_END:
        text = pattern.sub(replacement, text)
    text = text.replace("Ph.D.", f"Ph{PERIOD}D{PERIOD}")
    for pattern, replacement in AFTER_PHD:
        text = pattern.sub(replacement, text)
    for before, after in QUOTE_MOVES:
        text = text.replace(before, after)
    for mark in ".?!":
        text = text.replace(mark, mark + STOP)
    sentences = [sentence.strip() for sentence in text.replace(PERIOD, ".").split(STOP)]
    return sentences[:-1] if sentences and not sentences[-1] else sentences


TOKENIZER = Tokenizer(replace_not_contraction=False)


def word_tokens(text: str) -> list[str]:
    """Words and punctuation marks of `text`, for the reference's `nltk.word_tokenize` (module docstring)."""
    return [token.value for token in TOKENIZER.tokenize(text)]


def literal(keyword: str) -> re.Pattern[str]:
    """`keyword` (stripped) as literal text, case-insensitive: the reference's keyword match, safely."""
    return re.compile(re.escape(keyword.strip()), re.IGNORECASE)


def detected_language(text: str) -> str | None:
    """`langdetect`'s language of `text`, or None when it finds none (no letters)."""
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None


# -- IFEval's readings, where instructions.py departs -------------------------------------------------------
def keywords_existence(text: str, args: Any) -> bool:
    """Every keyword appears, as text anywhere (also inside a longer word)."""
    return all(literal(keyword).search(text) for keyword in args.keywords)


def keyword_frequency(text: str, args: Any) -> bool:
    """The keyword's occurrences, as text anywhere, satisfy the relation."""
    return instructions.compare(len(literal(args.keyword).findall(text)), args.relation, args.frequency)


def nth_paragraph_first_word(text: str, args: Any) -> bool:
    """Paragraphs split at each "\\n\\n" exactly; the blank ones are not counted but keep their place, so the
    nth piece must be a paragraph; its first word is its first whitespace-separated token, less leading
    quotes, cut at the first of . , ? ! ' "."""
    paragraphs = text.split("\n\n")
    count = sum(1 for paragraph in paragraphs if paragraph.strip())
    if args.nth_paragraph > count or not paragraphs[args.nth_paragraph - 1].strip():
        return False
    word = paragraphs[args.nth_paragraph - 1].split()[0].lstrip("'").lstrip('"')
    first = re.split(r"""[.,?!'"]""", word, maxsplit=1)[0].lower()
    return count == args.num_paragraphs and first == args.first_word.lower()


def postscript(text: str, args: Any) -> bool:
    """The marker appears anywhere in a line (not only at its start), any case."""
    marker = args.postscript_marker.strip()
    body = {"P.P.S": r"p\.\s?p\.\s?s", "P.S.": r"p\.\s?s\."}.get(marker, re.escape(marker.lower()))
    return re.search(body, text.lower()) is not None


def response_language(text: str, args: Any) -> bool:
    """`langdetect` reads the language; a text it cannot read counts as followed (the reference's choice)."""
    language = detected_language(text)
    return language is None or language == args.language


def english_capital(text: str, args: Any) -> bool:
    """All capitals and read as English (a text langdetect cannot read counts as followed)."""
    return text.isupper() and detected_language(text) in (None, "en")


def english_lowercase(text: str, args: Any) -> bool:
    """All lower case and read as English (a text langdetect cannot read counts as followed)."""
    return text.islower() and detected_language(text) in (None, "en")


def capital_word_frequency(text: str, args: Any) -> bool:
    """Upper-case word tokens (`word_tokens`) satisfy the relation."""
    capitals = sum(1 for token in word_tokens(text) if token.isupper())
    return instructions.compare(capitals, args.capital_relation, args.capital_frequency)


REFERENCE_CHECKS: dict[str, Callable[[str, Any], bool]] = {
    "keywords:existence": keywords_existence,
    "keywords:frequency": keyword_frequency,
    "length_constraints:nth_paragraph_first_word": nth_paragraph_first_word,
    "detectable_content:postscript": postscript,
    "language:response_language": response_language,
    "change_case:english_capital": english_capital,
    "change_case:english_lowercase": english_lowercase,
    "change_case:capital_word_frequency": capital_word_frequency,
}
