"""mcqa: multiple-choice questions; the reward says whether the answer letter the policy gave is the gold one.

Matches NeMo Gym's `mcqa` server (0.7.0). The answer is read from the text of the trajectory's assistant
messages (all `output_text` parts, joined) by the row's `grading_mode`, which the server config's
`grading_mode` overrides when set:

- `strict_single_letter_boxed` (default): the LAST `\\boxed{...}` (braces counted) holding a lone letter
  (non-letters around it allowed: `\\boxed{ [C] }`), or a letter then `:` `)` `.` `-` and option text
  (`\\boxed{E: ...}`); `\\text{...}` wrappers are removed first.
- `lenient_boxed`: strict first, then option text inside the last box (exactly one option's normalized text
  contained in it).
- `lenient_answer_colon`: the first `Answer: ...`: a lone allowed letter, or an option's exact text.
- `lenient_answer_colon_md` (server config only, as in NeMo Gym): the last `Answer:` payload (markdown
  `**Answer:**` allowed, NFKC- and script-normalized letters, lists like "A or B" rejected), also after the
  row's `template_metadata.answer_prefix`; with a prefix, falls back to strict boxed.

A row's `template_metadata.output_regex` (a regex or a list of them, case-insensitive, last match wins)
is tried before the grading mode. Letters must be keys of `options` (whose text is not null), except a lone
letter captured by `output_regex`, which is trusted. Verifier fields: `expected_answer` (gold letter,
upper-cased), `extracted_answer` (the letter read, or null).

Config `legacy_boxed_parsing: true` reads boxes as NeMo Gym did before 0.7.0 (the FIRST box holding only a
lone letter; option text in the first box); the stored `example_rollouts.jsonl` were scored that way.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Literal

from pydantic import Field

from nemo_gym.env.answers import last_boxed, normalize_text
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import ServerConfig, Session

RowGradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]
GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md"]
Options = list[dict[str, str | None]]


class MCQARequest(VerifyRequest):
    """A `/verify` body: the row's task fields (`uuid`, `metadata` and others are kept in the answer but not
    read) plus the rollout's `response`."""

    options: Options | None = Field(None, description='[{"A": "text"}, ...]; its keys are the allowed letters')
    expected_answer: str | None = Field(None, description="gold letter")
    grading_mode: RowGradingMode = "strict_single_letter_boxed"
    template_metadata: dict[str, Any] | None = Field(
        None, description="may hold output_regex (str | list[str]), answer_prefix"
    )


class MCQAResult(VerifyResult):
    expected_answer: str = Field(description="gold letter, stripped and upper-cased ('' when the row has none)")
    extracted_answer: str | None = Field(description="letter read from the answer, None when none could be")


# -- reading boxes -------------------------------------------------------------------------------
LONE_LETTER = re.compile(r"^[^A-Za-z]*([A-Z])[^A-Za-z]*$")
LABELLED_LETTER = re.compile(r"^\s*([A-Z])\s*[:).\-]")
LEGACY_BOXED_LETTER = re.compile(r"\\boxed\{\s*[^A-Za-z]*([A-Z])[^A-Za-z]*\s*\}")
LEGACY_BOX_CONTENT = re.compile(r"\\boxed\{\s*(.*?)\s*\}", re.S)
TEXT_WRAPPER = re.compile(r"\\text\{\s*(.*?)\s*\}", re.S)


def last_box_content(text: str) -> str | None:
    """Inside of the last `\\boxed{...}`, nested braces counted, unstripped; None without one or when it is unclosed."""
    return last_boxed(text, skip_unclosed=False, strip=False)


def strip_text_wrappers(s: str) -> str:
    """`\\text{\\text{E}}` → `E`: remove `\\text{...}` wrappers around the whole string."""
    while (m := TEXT_WRAPPER.fullmatch(s)) is not None:
        s = m.group(1)
    return s


def normalize_for_match(s: str) -> str:
    """Lower-case, whitespace collapsed."""
    return normalize_text(s, strip_punctuation=False, strip_articles=False)


def boxed_letter(text: str, allowed: set[str], legacy: bool = False) -> str | None:
    """The answer letter in the last box (0.7.0), or in the first box holding only a letter (legacy)."""
    if legacy:
        m = LEGACY_BOXED_LETTER.search(text)
        letter = m.group(1) if m else None
    else:
        inner = last_box_content(text)
        if inner is None:
            return None
        inner = strip_text_wrappers(inner.strip())
        m = LONE_LETTER.match(inner) or LABELLED_LETTER.match(inner)
        letter = m.group(1) if m else None
    return letter if letter in allowed else None


def boxed_option_text(text: str, options: Options | None, allowed: set[str], legacy: bool = False) -> str | None:
    """The letter of the one option whose normalized text the box contains; None if none or several do."""
    if legacy:
        m = LEGACY_BOX_CONTENT.search(text)
        inner = m.group(1) if m else None
    else:
        inner = last_box_content(text)
        inner = inner.strip() if inner is not None else None
    if inner is None:
        return None
    candidates = [normalize_for_match(c) for c in (inner, strip_text_wrappers(inner))]
    matched = {
        letter
        for letter, option in option_texts(options, allowed)
        if (norm := normalize_for_match(option)) and any(norm in c for c in candidates)
    }
    return matched.pop() if len(matched) == 1 else None


def option_texts(options: Options | None, allowed: set[str]) -> list[tuple[str, str]]:
    """(upper-case letter, text) of each option with an allowed letter and a text."""
    pairs = [(k, v) for entry in options or [] for k, v in entry.items()]
    return [(k.upper(), v) for k, v in pairs if v is not None and len(k) == 1 and k.upper() in allowed]


def allowed_letters(options: Options | None) -> set[str]:
    """Upper-cased single-letter keys of `options` whose text is not null."""
    return {
        k.upper() for entry in options or [] for k, v in entry.items() if len(k) == 1 and k.isalpha() and v is not None
    }


# -- reading "Answer: ..." -----------------------------------------------------------------------
ANSWER_COLON = re.compile(r"(?i)answer\s*:\s*(.+)")
ANSWER_PAYLOAD_MD = re.compile(r"(?im)[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)")
CHOICE_LETTER = re.compile(r"(?<![A-Za-z])([A-Za-z])(?![A-Za-z])")
LEADING_LETTER = re.compile(r"^([a-zA-Z])(?![a-zA-Z0-9])")
LAST_STANDALONE_LETTER = re.compile(r"\b[A-Z]\b(?!.*\b[A-Z]\b)", re.S)
LIST_SEPARATOR = re.compile(r"(?:\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+)", re.I)
# Answer letters of Arabic and Bengali prompts (and full-width ones) → Latin, as NeMo Gym maps them.
_SCRIPT_LETTER_GROUPS = (("أঅＡ", "A"), ("بবＢ", "B"), ("جডＣ", "C"), ("دঢＤ", "D"))
SCRIPT_LETTERS = str.maketrans({c: " " + latin for chars, latin in _SCRIPT_LETTER_GROUPS for c in chars})


def normalize_letters(text: str) -> str:
    """NFKC, non-Latin answer letters mapped to A-D, stripped."""
    return unicodedata.normalize("NFKC", text).translate(SCRIPT_LETTERS).strip()


def answer_colon_letter(text: str, options: Options | None, allowed: set[str]) -> str | None:
    """`lenient_answer_colon`: the first `Answer: X` (a lone allowed letter) or `Answer: <option text>`."""
    m = ANSWER_COLON.search(text)
    if m is None:
        return None
    candidate = strip_text_wrappers(m.group(1)).strip()
    if len(candidate) == 1 and candidate.isalpha() and candidate.upper() in allowed:
        return candidate.upper()
    wanted = normalize_for_match(candidate)
    return next(
        (letter for letter, option in option_texts(options, allowed) if normalize_for_match(option) == wanted), None
    )


def is_choice_list(text: str, allowed: set[str]) -> bool:
    """Whether two different allowed letters stand next to each other as a list ("A or B", "A, C")."""
    found = [(m.group(1).upper(), m.span(1)) for m in CHOICE_LETTER.finditer(text) if m.group(1).upper() in allowed]
    return any(
        a != b and LIST_SEPARATOR.fullmatch(text[span_a[1] : span_b[0]]) is not None
        for (a, span_a), (b, span_b) in zip(found, found[1:], strict=False)
    )


def payload_letter(payload: str, allowed: set[str]) -> str | None:
    """One allowed letter from an answer payload: a lone letter, a leading one, else the last standalone one."""
    candidate = normalize_letters(payload).strip().strip("*_` \t\n\r.,;:")
    if is_choice_list(candidate, allowed):
        return None
    if len(candidate) == 1:
        letter: str | None = candidate
    elif (m := LEADING_LETTER.match(candidate)) is not None:  # "B because ..."
        letter = m.group(1)
    else:
        m = LAST_STANDALONE_LETTER.search(candidate)
        letter = m.group(0) if m else None
    return letter.upper() if letter and letter.upper() in allowed else None


def answer_payloads(text: str, answer_prefix: str | None) -> list[str]:
    """Texts after each `Answer:` (and after `answer_prefix`, to the end of its line), in order of position."""
    text = unicodedata.normalize("NFKC", text)
    found = [(m.start(), m.group(1)) for m in ANSWER_PAYLOAD_MD.finditer(text)]
    if answer_prefix:
        prefix = re.compile(re.escape(unicodedata.normalize("NFKC", answer_prefix)) + r"\s*", re.I)
        for m in prefix.finditer(text):
            end = text.find("\n", m.end())
            found.append((m.start(), text[m.end() : end if end >= 0 else len(text)]))
    return [payload for _, payload in sorted(found, key=lambda item: item[0])]


def answer_colon_md_letter(text: str, allowed: set[str], answer_prefix: str | None) -> str | None:
    """`lenient_answer_colon_md`: the last payload that yields a letter; with a prefix, strict boxed after."""
    for payload in reversed(answer_payloads(text, answer_prefix)):
        if (letter := payload_letter(payload, allowed)) is not None:
            return letter
    return boxed_letter(text, allowed) if answer_prefix else None


# -- template_metadata.output_regex ---------------------------------------------------------------
def regex_letter(text: str, patterns: str | list[str], options: Options | None, allowed: set[str]) -> str | None:
    """The first pattern whose LAST match (case-insensitive) gives a letter: a lone letter is trusted as is;
    other text must equal an option's text. Invalid patterns give None."""
    for pattern in [patterns] if isinstance(patterns, str) else patterns if isinstance(patterns, list) else []:
        try:
            matches = re.findall(pattern, text, re.I)
        except (re.error, TypeError):
            continue
        if not matches:
            continue
        last = matches[-1]
        # A pattern with several groups yields tuples (NeMo Gym answers 500 there): read its first group.
        captured = normalize_letters((last[0] if isinstance(last, tuple) else last).strip()).upper()
        if len(captured) == 1 and captured.isalpha():
            return captured
        wanted = normalize_for_match(captured)
        letter = next(
            (k for k, option in option_texts(options, allowed) if normalize_for_match(option) == wanted), None
        )
        if letter is not None:
            return letter
    return None


def extract_answer(text: str, task: MCQARequest, mode: GradingMode, legacy: bool = False) -> str | None:
    """The answer letter in `text` for `task` under grading `mode`, or None."""
    allowed = allowed_letters(task.options)
    metadata = task.template_metadata or {}
    if "output_regex" in metadata:
        if (letter := regex_letter(text, metadata["output_regex"], task.options, allowed)) is not None:
            return letter
    if mode == "strict_single_letter_boxed":
        return boxed_letter(text, allowed, legacy)
    if mode == "lenient_boxed":
        return boxed_letter(text, allowed, legacy) or boxed_option_text(text, task.options, allowed, legacy)
    if mode == "lenient_answer_colon":
        return answer_colon_letter(text, task.options, allowed)
    prefix = metadata.get("answer_prefix")
    return answer_colon_md_letter(text, allowed, prefix if isinstance(prefix, str) else None)


class MCQAServer(ResourcesServer):
    """Multiple-choice question answering. Reward range: [0.0, 1.0], binary (extracted letter == gold)."""

    verify_request_type = MCQARequest

    class Config(ServerConfig):
        grading_mode: GradingMode | None = Field(None, description="overrides every row's grading_mode when set")
        legacy_boxed_parsing: bool = Field(
            False, description="read \\boxed{} as NeMo Gym did before 0.7.0 (the first box holding a lone letter)"
        )

    async def verify(self, request: MCQARequest, session: Session) -> MCQAResult:
        """1.0 when the letter read from the text of all the trajectory's messages is the gold one, else 0.0."""
        gold = (request.expected_answer or "").strip().upper()
        text = Trajectory.of(request.response).output_text.strip()
        mode = self.config.grading_mode or request.grading_mode
        letter = extract_answer(text, request, mode, self.config.legacy_boxed_parsing) if text else None
        return MCQAResult(reward=float(bool(gold) and letter == gold), expected_answer=gold, extracted_answer=letter)

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus `no_answer_rate`: the fraction of rollouts with no extracted letter."""
        metrics = await super().aggregate_metrics(verify_responses)
        rows = [r for r in verify_responses if isinstance(r, dict) and "reward" in r]
        if rows:
            metrics["no_answer_rate"] = sum(r.get("extracted_answer") is None for r in rows) / len(rows)
        return metrics
