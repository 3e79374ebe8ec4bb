"""string_match: general answer matching against one or more reference answers.

The row says how to match (`match: {mode: ..., ...}`), over the server config's defaults (`match`):

- `exact`: the extracted answer equals a reference (surrounding whitespace ignored);
- `normalized` (default): equal after normalization, SQuAD-style: Unicode NFKC, lower case, punctuation
  removed, the articles a/an/the removed, whitespace collapsed (each step can be turned off);
- `regex`: a reference is a pattern that the whole answer must match (`regex` package, with a timeout:
  patterns from the data meet untrusted model output);
- `numeric`: the last number in the answer is within `abs_tol` or `rel_tol` of a reference
  (`math.isclose`); thousands separators allowed.

The answer is extracted from the last assistant message (`extract`): `auto` (default) takes the last
`\\boxed{...}`, else the last `<answer>...</answer>`, else what follows the last "answer is"/"answer:",
else the last non-empty line; `full` takes the whole text; `boxed`, `answer_tag`, `last_line` take only that.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any, Literal

import regex
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.env.answers import AnswerForm, first_answer, last_assistant_text, normalize_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session

Mode = Literal["exact", "normalized", "regex", "numeric"]
ExtractFrom = Literal["auto", "full", "boxed", "answer_tag", "last_line"]
NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


class MatchOptions(BaseModel):
    """How an answer is matched against the references (server defaults; a row overrides some)."""

    model_config = ConfigDict(extra="forbid")
    mode: Mode = Field("normalized", description="exact | normalized | regex | numeric")
    extract: ExtractFrom = Field("auto", description="which part of the assistant's text is the answer")
    case_sensitive: bool = Field(False, description="normalized and regex modes: keep the case")
    strip_punctuation: bool = Field(True, description="normalized mode: remove ASCII punctuation")
    strip_articles: bool = Field(True, description="normalized mode: remove the articles a, an, the")
    abs_tol: float = Field(0.0, ge=0, description="numeric mode: absolute tolerance")
    rel_tol: float = Field(1e-9, ge=0, description="numeric mode: relative tolerance")


class MatchOverrides(BaseModel):
    """A row's `match`: any of MatchOptions' fields; the ones given replace the server's defaults."""

    model_config = ConfigDict(extra="forbid")
    mode: Mode | None = None
    extract: ExtractFrom | None = None
    case_sensitive: bool | None = None
    strip_punctuation: bool | None = None
    strip_articles: bool | None = None
    abs_tol: float | None = Field(None, ge=0)
    rel_tol: float | None = Field(None, ge=0)


class StringMatchRequest(VerifyRequest):
    """A `/verify` body: the row's task fields plus the rollout's `response`."""

    expected_answer: str | list[str] = Field(description="the reference answer, or several (any one matches)")
    match: MatchOverrides | None = Field(None, description="how to match, over the server's defaults")

    @field_validator("expected_answer")
    @classmethod
    def _some_reference(cls, value: str | list[str]) -> str | list[str]:
        if value == [] or value == "":
            raise ValueError("give at least one non-empty reference answer")
        return value


class FailureReason(str, Enum):
    """Why the reward is 0 (`None` when it is 1)."""

    NO_ANSWER = "no_answer"  # no assistant text, or nothing to extract
    TOO_LONG = "too_long"  # the extracted answer is longer than max_answer_chars
    NOT_A_NUMBER = "not_a_number"  # numeric mode: no number in the answer
    TIMEOUT = "timeout"  # regex mode: matching took longer than regex_timeout_s
    MISMATCH = "mismatch"  # no reference matches


def extract_answer(text: str, extract: ExtractFrom) -> str | None:
    """The answer in an assistant message (`<think>` blocks dropped), or None (module docstring: the forms)."""
    forms: tuple[AnswerForm, ...] = (
        ("boxed", "answer_tag", "answer_phrase", "last_line") if extract == "auto" else (extract,)
    )
    return first_answer(strip_thinking(text), forms, phrase_decoration=" *_`.")


def normalize(text: str, options: MatchOptions) -> str:
    """SQuAD-style normalization under `options` (NFKC, case, punctuation, articles, whitespace)."""
    return normalize_text(
        text,
        nfkc=True,
        lower=not options.case_sensitive,
        strip_punctuation=options.strip_punctuation,
        strip_articles=options.strip_articles,
    )


def parse_number(text: str) -> float | None:
    """The last number in `text` (`-1,234.5`, `.5`, `1e-3`), thousands separators removed; None without one."""
    numbers = NUMBER.findall(text)
    return float(numbers[-1].replace(",", "")) if numbers else None


class StringMatchServer(ResourcesServer):
    """Single-turn answers matched to references (exact, normalized, regex or numeric). Reward [0.0, 1.0], binary."""

    verify_request_type = StringMatchRequest

    class Config(ServerConfig):
        match: MatchOptions = Field(
            default_factory=MatchOptions, description="default match options; a row's `match` overrides them"
        )
        max_answer_chars: int = Field(
            10_000, gt=0, description="longest extracted answer matched; longer scores 0 (too_long)"
        )
        regex_timeout_s: float = Field(
            1.0, gt=0, description="seconds allowed to match one regex; longer scores 0 (timeout)"
        )

    def options(self, overrides: MatchOverrides | None) -> MatchOptions:
        """The server's match options with the row's overrides applied."""
        given = overrides.model_dump(exclude_none=True) if overrides else {}
        return self.config.match.model_copy(update=given)

    def matches(self, answer: str, reference: str, options: MatchOptions) -> bool:
        """Whether `answer` matches `reference` under `options.mode`.

        Raises:
            HTTPException: 422 for a reference that is not a valid regex (regex mode) or not a number (numeric).
            TimeoutError: the regex took longer than `regex_timeout_s`.
        """
        if options.mode == "exact":
            return answer.strip() == reference.strip()
        if options.mode == "normalized":
            return normalize(answer, options) == normalize(reference, options)
        if options.mode == "regex":
            try:
                pattern = regex.compile(reference, 0 if options.case_sensitive else regex.IGNORECASE)
            except regex.error as exc:
                raise HTTPException(422, f"expected_answer {reference!r} is not a valid regex: {exc}") from None
            return pattern.fullmatch(answer.strip(), timeout=self.config.regex_timeout_s) is not None
        expected = parse_number(reference)
        if expected is None or NUMBER.fullmatch(reference.strip()) is None:
            raise HTTPException(422, f"expected_answer {reference!r} is not a number (numeric mode)")
        value = parse_number(answer)
        return value is not None and math.isclose(value, expected, rel_tol=options.rel_tol, abs_tol=options.abs_tol)

    async def verify(self, request: StringMatchRequest, session: Session) -> VerifyResult:
        """1.0 when the extracted answer matches any reference, else 0.0 with a `failure_reason`.

        Raises:
            HTTPException: 422 for a reference that the row's mode cannot use (bad regex, not a number).
        """
        options = self.options(request.match)
        references = [request.expected_answer] if isinstance(request.expected_answer, str) else request.expected_answer
        answer = extract_answer(last_assistant_text(request.response), options.extract)
        fields: dict[str, Any] = {"extracted_answer": answer, "match_mode": options.mode, "matched_reference": None}
        reason = None
        if answer is None:
            reason = FailureReason.NO_ANSWER
        elif len(answer) > self.config.max_answer_chars:
            reason = FailureReason.TOO_LONG
        elif options.mode == "numeric" and parse_number(answer) is None:
            reason = FailureReason.NOT_A_NUMBER
        if reason is not None:
            for reference in references:  # a bad reference is a 422 whatever the answer
                self.matches("0", reference, options)
            return VerifyResult(reward=0.0, failure_reason=reason.value, **fields)
        try:
            fields["matched_reference"] = next((r for r in references if self.matches(answer, r, options)), None)
        except TimeoutError:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.TIMEOUT.value, **fields)
        if fields["matched_reference"] is None:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.MISMATCH.value, **fields)
        return VerifyResult(reward=1.0, failure_reason=None, **fields)

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus `failure_reasons`: the count of each failure reason."""
        metrics = await super().aggregate_metrics(verify_responses)
        reasons = [r.get("failure_reason") for r in verify_responses if isinstance(r, dict) and r.get("failure_reason")]
        metrics["failure_reasons"] = {reason: reasons.count(reason) for reason in sorted(set(reasons))}
        return metrics
