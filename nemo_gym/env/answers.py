"""Reading a final answer out of a model's reply, and normalising it for comparison.

The pieces single-turn verifiers share (string_match, equivalence_rule, math_verify, reasoning_gym, mcqa,
instruction_following, code_exec): the text of the last assistant message of a Responses `Response`,
`<think>` blocks dropped, the last `\\boxed{...}`, the last `<answer>...</answer>`, the text after the last
"answer is"/"answer:", the last non-empty line, and SQuAD-style text normalisation. Each function returns
None (never raises) when the form it looks for is absent, so a verifier can try them in its own order:

    text = strip_thinking(last_assistant_text(request.response))
    answer = first_answer(text, ("boxed", "answer_tag", "answer_phrase", "last_line"))

Every function runs in time linear in the text: model output is untrusted, and a degenerate reply (a
megabyte of `\\boxed{`, `<think>` or `<answer>` repeated, never closed) must not stall a verifier. Blocks are
found by literal searches that stop at the first opening tag left unclosed (no later one can close
either), not by lazy `.*?` regexes, which try again from every opening tag.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

__all__ = [
    "AnswerForm",
    "message_output_text",
    "last_assistant_text",
    "strip_thinking",
    "last_boxed",
    "last_answer_tag",
    "last_answer_phrase",
    "last_line",
    "first_answer",
    "normalize_text",
]

AnswerForm = Literal["boxed", "answer_tag", "answer_phrase", "last_line", "full"]
BOXED = "\\boxed{"
BRACE = re.compile(r"[{}]")
THINK_OPEN, THINK_CLOSE = re.compile("<think>"), re.compile("</think>")  # literal patterns: searched in linear time
ANSWER_OPEN, ANSWER_CLOSE = re.compile("<answer>", flags=re.IGNORECASE), re.compile("</answer>", flags=re.IGNORECASE)
ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+)", flags=re.IGNORECASE)
ARTICLES = re.compile(r"\b(?:a|an|the)\b", flags=re.IGNORECASE)
PUNCTUATION = str.maketrans("", "", string.punctuation)
PHRASE_DECORATION = " *_`"  # markdown bold/italics/code around a stated answer


def message_output_text(item: Any) -> str | None:
    """The text of a Responses `message` item (any role): its `output_text` parts joined, '' when it has
    none; None when `item` is not a dict of `type: message`. Parts of unexpected shape are skipped (model
    output is untrusted), so this never raises."""
    if not isinstance(item, dict) or item.get("type") != "message":
        return None
    parts = item.get("content") if isinstance(item.get("content"), list) else []
    return "".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
    )


def last_assistant_text(response: dict[str, Any]) -> str:
    """The text of the last assistant message with text in a Responses `Response` dict (`message_output_text`; a
    message without a `role` counts as the assistant's); '' when there is none. Items and parts of unexpected
    shape are skipped (model output is untrusted), so this never raises on a dict."""
    output = response.get("output")
    for item in reversed(output if isinstance(output, list) else []):
        text = message_output_text(item)
        if text is not None and item.get("role", "assistant") == "assistant" and text.strip():
            return text
    return ""


def _blocks(text: str, opening: re.Pattern[str], closing: re.Pattern[str]) -> Iterator[tuple[int, int, int, int]]:
    """(start, content start, content end, end) of each closed block `opening ... closing` of `text`, left to
    right, as `re.finditer(opening + "(.*?)" + closing, DOTALL)` finds them, in linear time."""
    pos = 0
    while (head := opening.search(text, pos)) and (tail := closing.search(text, head.end())):
        yield head.start(), head.end(), tail.start(), tail.end()
        pos = tail.end()


def strip_thinking(text: str) -> str:
    """`text` without its closed `<think>...</think>` blocks."""
    kept, pos = [], 0
    for start, _, _, end in _blocks(text, THINK_OPEN, THINK_CLOSE):
        kept.append(text[pos:start])
        pos = end
    return "".join(kept) + text[pos:]


def last_boxed(text: str, *, skip_unclosed: bool = True, strip: bool = True) -> str | None:
    """The content of the last closed `\\boxed{...}` (nested braces matched), or None.

    `skip_unclosed`: when the last box is never closed, try the one before it (else None). `strip`: strip
    the content's outer whitespace.
    """
    # A box left open stays open to the end of the text, and so does every box that opens before it and is
    # still open where it opens: each box is scanned only up to where the next one starts (linear in all).
    start, limit = text.rfind(BOXED), len(text)
    while start != -1:
        depth, begin = 1, start + len(BOXED)
        for brace in BRACE.finditer(text, begin, limit):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                content = text[begin : brace.start()]
                return content.strip() if strip else content
        start, limit = (text.rfind(BOXED, 0, start), start) if skip_unclosed else (-1, start)
    return None


def last_answer_tag(text: str) -> str | None:
    """The stripped content of the last `<answer>...</answer>` (any case), or None."""
    last = None
    for _, begin, end, _ in _blocks(text, ANSWER_OPEN, ANSWER_CLOSE):
        last = text[begin:end]
    return last.strip() if last is not None else None


def last_answer_phrase(text: str, *, decoration: str = PHRASE_DECORATION) -> str | None:
    """What follows the last "answer is" / "answer:" to the end of its line, with `decoration` characters
    stripped from both ends; None without such a phrase or when nothing is left."""
    phrases = ANSWER_PHRASE.findall(text)
    return (phrases[-1].strip(decoration) or None) if phrases else None


def last_line(text: str) -> str | None:
    """The last non-empty line, stripped, or None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def first_answer(text: str, forms: Sequence[AnswerForm], *, phrase_decoration: str = PHRASE_DECORATION) -> str | None:
    """The answer found by the first of `forms` that finds one in `text` (used as given: drop `<think>`
    blocks first with `strip_thinking`), or None. `full` is the whole stripped text."""
    finders: dict[str, Callable[[str], str | None]] = {
        "boxed": last_boxed,
        "answer_tag": last_answer_tag,
        "answer_phrase": lambda t: last_answer_phrase(t, decoration=phrase_decoration),
        "last_line": last_line,
        "full": lambda t: t.strip() or None,
    }
    return next((answer for form in forms if (answer := finders[form](text)) is not None), None)


def normalize_text(
    text: str, *, nfkc: bool = False, lower: bool = True, strip_punctuation: bool = True, strip_articles: bool = True
) -> str:
    """SQuAD-style normalisation, each step optional: Unicode NFKC, lower case, ASCII punctuation removed,
    the articles a/an/the removed; whitespace is always collapsed to single spaces."""
    if nfkc:
        text = unicodedata.normalize("NFKC", text)
    if lower:
        text = text.lower()
    if strip_punctuation:
        text = text.translate(PUNCTUATION)
    if strip_articles:
        text = ARTICLES.sub(" ", text)
    return " ".join(text.split())
