"""math_verify: math questions with one final answer, checked for mathematical equivalence with the PyPI
library `math-verify` (Hugging Face; symbolic, numeric and LaTeX comparison with sympy).

`/verify` reads the text of the last assistant message (`<think>...</think>` removed), extracts the final
answer, in this order:

1. `boxed`: the content of the last `\\boxed{...}` (nested braces matched);
2. `answer_phrase`: the text after the last "answer is", "answer:" or "answer =", to the end of its line or
   sentence, or to a "because"/"since"/"so"/... that follows it;
3. `last_number`: the last number in the text (`-12`, `3.5`, `1,234`, `3/4`);

then parses it and the row's `expected_answer` with math-verify (`parse("$...$")`: LaTeX, then plain
expressions) and compares them with `math_verify.verify(gold, answer)` (gold first: it is not symmetric).

Parsing and comparing run in a forked child process killed after `timeout_s`: sympy can hang on model
output such as `9^{9^{9^9}}` (a C-level integer power that no signal interrupts), and math-verify's own
timeouts use `signal.alarm`, which only works in the main thread.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
from enum import Enum
from typing import Any

from fastapi import HTTPException
from pydantic import Field

from nemo_gym.common.errors import ServerError
from nemo_gym.env.answers import last_assistant_text, last_boxed, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session

ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(.+)", flags=re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?")
# `(?<!\s)`: a connective's whitespace is matched from the start of its run only; tried from every space of
# a long run (a model's megabyte of spaces), `\s+` rescanned the rest of the run each time (quadratic).
PHRASE_END = re.compile(r"[.;!?](?:\s|$)|(?<!\s)\s+(?:because|since|as|which|so)\b", flags=re.IGNORECASE)
DECORATION = " \t*_`$.;,"  # markdown bold, inline-math dollars and a closing full stop around an answer


class Extraction(str, Enum):
    """Where the final answer was found in the assistant's text."""

    BOXED = "boxed"
    ANSWER_PHRASE = "answer_phrase"
    LAST_NUMBER = "last_number"
    NONE = "none"


class FailureReason(str, Enum):
    """Why the reward is 0 (`None` when it is 1)."""

    NO_ANSWER = "no_answer"  # no assistant text, or nothing to extract from it
    TOO_LONG = "too_long"  # the extracted answer is longer than max_answer_chars
    UNPARSABLE = "unparsable"  # math-verify could not parse the extracted answer
    MISMATCH = "mismatch"  # parsed, but not equivalent to the expected answer
    TIMEOUT = "timeout"  # parsing or comparing took longer than timeout_s
    GRADER_ERROR = "grader_error"  # the grading process died on this answer


class MathVerifyRequest(VerifyRequest):
    """A `/verify` body: the row's task fields plus the rollout's `response`."""

    expected_answer: str = Field(
        min_length=1, description="the reference final answer: LaTeX (`\\frac{1}{2}`) or plain (`0.5`)"
    )


def extract_final_answer(text: str) -> tuple[str | None, Extraction]:
    """The final answer in an assistant message and where it was found (module docstring: the order)."""
    text = strip_thinking(text)
    boxed = last_boxed(text)
    if boxed:
        return boxed, Extraction.BOXED
    phrases = [PHRASE_END.split(m.group(1), maxsplit=1)[0].strip(DECORATION) for m in ANSWER_PHRASE.finditer(text)]
    if phrases and phrases[-1]:
        return phrases[-1], Extraction.ANSWER_PHRASE
    numbers = NUMBER.findall(text)
    if numbers:
        return numbers[-1], Extraction.LAST_NUMBER
    return None, Extraction.NONE


def as_math(answer: str) -> str:
    """`answer` between `$` delimiters, the form math-verify's LaTeX extraction reads best."""
    return f"${answer.strip().strip('$')}$"


def grade(expected_answer: str, answer: str) -> dict[str, Any]:
    """Parse both answers with math-verify and compare them (runs in the grading child process).

    Returns `{"gold": [str], "parsed": [str], "equivalent": bool}`: the math expressions parsed from each,
    as text (empty when math-verify found none: it then keeps only the raw string, which it still compares
    as a string). Timeouts are the parent's job (see `grade_in_child`), so math-verify's are off.
    """
    from math_verify import parse, verify

    gold = parse(as_math(expected_answer), parsing_timeout=None)
    parsed = parse(as_math(answer), parsing_timeout=None) if answer else []
    equivalent = bool(gold and parsed and verify(gold, parsed, timeout_seconds=None))
    return {"gold": expressions(gold), "parsed": expressions(parsed), "equivalent": equivalent}


def expressions(parsed: list[Any]) -> list[str]:
    """The sympy expressions of a math-verify parse result, as text (its raw-string entries left out)."""
    return [str(p) for p in parsed if not isinstance(p, str)]


def _child(conn: Any, expected_answer: str, answer: str) -> None:
    try:
        conn.send(grade(expected_answer, answer))
    except BaseException as exc:  # report any error of the library on this answer to the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"[:500]})
    finally:
        conn.close()


def grade_in_child(expected_answer: str, answer: str, timeout_s: float) -> dict[str, Any] | None:
    """`grade` in a forked process, killed after `timeout_s` seconds; None when it timed out.

    Blocking: call it from a worker thread. A child that dies or raises gives `{"error": ...}`.

    Raises:
        ServerError: the grading process could not be started (an infrastructure failure, not the answer's).
    """
    receive, send = multiprocessing.Pipe(duplex=False)
    try:
        # fork: the child inherits the imported libraries (no re-import per answer) and needs no importable
        # module name (servers are loaded from a file path).
        process = multiprocessing.get_context("fork").Process(
            target=_child, args=(send, expected_answer, answer), daemon=True
        )
        process.start()
    except OSError as exc:
        raise ServerError(f"math_verify: cannot start the grading process: {exc}") from exc
    finally:
        send.close()
    try:
        if not receive.poll(timeout_s):
            return None
        return receive.recv()
    except EOFError:
        return {"error": "the grading process exited without an answer"}
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
        process.join()


class MathVerifyServer(ResourcesServer):
    """Single-turn math answers checked by math-verify; no tools. Reward range: [0.0, 1.0], binary."""

    verify_request_type = MathVerifyRequest

    class Config(ServerConfig):
        timeout_s: float = Field(
            5.0, gt=0, description="seconds allowed to parse and compare one answer; longer scores 0 (timeout)"
        )
        max_answer_chars: int = Field(
            1000, gt=0, description="longest extracted answer graded; longer scores 0 (too_long)"
        )

    async def startup(self) -> None:
        # Import and warm the parser up once here (seconds): every forked grading child inherits both.
        await asyncio.to_thread(grade, "\\frac{x^2}{2}", "x^2/2")

    async def verify(self, request: MathVerifyRequest, session: Session) -> VerifyResult:
        """1.0 when the extracted answer is equivalent to `expected_answer`, else 0.0 with a `failure_reason`.

        Raises:
            HTTPException: 422 when math-verify cannot parse the row's `expected_answer` (a data error).
            ServerError: the grading process could not be started.
        """
        answer, where = extract_final_answer(last_assistant_text(request.response))
        fields: dict[str, Any] = {"extracted_answer": answer, "extraction": where.value}
        too_long = answer is not None and len(answer) > self.config.max_answer_chars
        # Graded even without an answer: a row whose expected_answer math-verify cannot parse is a 422.
        graded = await asyncio.to_thread(
            grade_in_child, request.expected_answer, "" if too_long else answer or "", self.config.timeout_s
        )
        if graded is not None and not graded.get("error") and not graded["gold"]:
            raise HTTPException(
                422, f"expected_answer {request.expected_answer!r}: math-verify finds no math expression in it"
            )
        if answer is None:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.NO_ANSWER.value, **fields)
        if too_long:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.TOO_LONG.value, **fields)
        if graded is None:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.TIMEOUT.value, **fields)
        if "error" in graded:
            return VerifyResult(
                reward=0.0, failure_reason=FailureReason.GRADER_ERROR.value, grader_error=graded["error"], **fields
            )
        fields["parsed_answer"] = graded["parsed"][0] if graded["parsed"] else None
        if graded["equivalent"]:
            return VerifyResult(reward=1.0, failure_reason=None, **fields)
        reason = FailureReason.MISMATCH if graded["parsed"] else FailureReason.UNPARSABLE
        return VerifyResult(reward=0.0, failure_reason=reason.value, **fields)

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus `failure_reasons`: the count of each failure reason."""
        metrics = await super().aggregate_metrics(verify_responses)
        reasons = [r.get("failure_reason") for r in verify_responses if isinstance(r, dict) and r.get("failure_reason")]
        metrics["failure_reasons"] = {reason: reasons.count(reason) for reason in sorted(set(reasons))}
        return metrics
