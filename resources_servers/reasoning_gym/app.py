"""reasoning_gym: procedurally generated reasoning tasks (arithmetic, algebra, word games, logic, ...) from the
PyPI library `reasoning-gym`, scored by the library's own checker for each task's generator.

Two row shapes are read (README, Data): ours, written by `prepare.py`, with the generator name (`dataset`)
and the full reasoning_gym entry (`entry`: question, answer, metadata); and NeMo Gym's, with the entry's
fields at the top level (`question`, `answer`, `metadata`) and the generator name in
`metadata.source_dataset`. An entry's `answer` may be null: some generators (propositional_logic,
graph_color, ...) have many right answers and their checker reads the metadata instead.

`/verify` takes the last assistant message, extracts the final answer from it (`\\boxed{...}`, else
`<answer>...</answer>`, else "the answer is X", else the last number for numeric tasks, else the last
non-empty line) and scores it with `reasoning_gym.get_score_answer_fn(dataset)(answer, entry)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum
from functools import cache
from typing import Any

import reasoning_gym
from fastapi import HTTPException
from pydantic import Field, model_validator
from reasoning_gym.factory import DATASETS

from nemo_gym.config import did_you_mean
from nemo_gym.env.answers import last_answer_tag, last_assistant_text, last_boxed, last_line, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session

# The rest of the line, trimmed by `without_final_period`: a lazy group before `\s*\.?\s*$` backtracked cubically
# on a run of spaces (a minute for a few kilobytes of them).
ANSWER_IS = re.compile(r"answer is\s*:?\s*([^\n]+)", flags=re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
BOXED = "\\boxed{"
BOX_TOKEN = re.compile(r'\\.|["{}]', flags=re.DOTALL)  # an escaped character, a quote or a brace


class Extraction(str, Enum):
    """Where the final answer was found in the assistant's text."""

    BOXED = "boxed"
    ANSWER_TAG = "answer_tag"
    ANSWER_IS = "answer_is"
    LAST_NUMBER = "last_number"
    LAST_LINE = "last_line"
    NONE = "none"


class ReasoningGymRequest(VerifyRequest):
    """A `/verify` body: a row of either shape (module docstring) plus the rollout's `response`. Ours, when it
    has `entry` or no `metadata`: `dataset` and `entry`; else NeMo Gym's: `question`, `answer`, `metadata`
    (with `source_dataset`). A row of neither shape is a 422 naming the missing or mistyped field."""

    dataset: str | None = Field(None, description="ours: the reasoning_gym generator name, e.g. basic_arithmetic")
    entry: dict[str, Any] | None = Field(
        None, description="ours: the reasoning_gym entry: question, answer (str | null), metadata"
    )
    question: str | None = Field(None, description="NeMo Gym's: the entry's question")
    answer: str | None = Field(
        None, description="NeMo Gym's (required there): the reference answer; null where the checker reads the metadata"
    )
    metadata: dict[str, Any] | None = Field(None, description="NeMo Gym's: the entry's metadata, with source_dataset")

    @property
    def ours(self) -> bool:
        """Whether the row has our shape: an `entry`, or no `metadata`."""
        return "entry" in self.model_fields_set or "metadata" not in self.model_fields_set

    @model_validator(mode="after")
    def _one_shape(self) -> ReasoningGymRequest:
        if self.ours:
            required = {"dataset": self.dataset, "entry": self.entry}
        else:
            required = {
                "question": self.question,
                "metadata": self.metadata,
                **({} if "answer" in self.model_fields_set else {"answer": None}),
            }
        if missing := [name for name, value in required.items() if value is None]:
            shape = "our row shape (with entry)" if self.ours else "NeMo Gym's row shape (with metadata)"
            raise ValueError(f"{', '.join(missing)}: required in {shape} (only NeMo Gym's answer may be null)")
        if self.ours and not isinstance(self.entry.get("answer", 0), (str, type(None))):  # type: ignore[union-attr]
            raise ValueError("entry.answer: the reference answer must be a string or null")
        if not self.ours and not isinstance(self.metadata.get("source_dataset"), str):  # type: ignore[union-attr]
            raise ValueError("metadata.source_dataset: the reasoning_gym generator name (a string) is missing")
        return self

    def task(self) -> tuple[str, dict[str, Any]]:
        """(generator name, reasoning_gym entry) of the row: a composite row's entry is scored by its own
        generator's checker (`entry.metadata.source_dataset`); ARC grids as tuples (`with_grid_tuples`)."""
        if self.ours:
            dataset, entry = self.dataset or "", self.entry or {}
            metadata = entry.get("metadata")
            if dataset == "composite" and isinstance(metadata, dict):
                dataset = metadata.get("source_dataset", dataset)
        else:
            metadata = self.metadata or {}
            dataset, entry = (
                metadata["source_dataset"],
                {
                    "question": self.question,
                    "answer": self.answer,
                    "metadata": metadata,
                },
            )
        return dataset, with_grid_tuples(dataset, entry)


def with_grid_tuples(dataset: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with an ARC output grid (`metadata.output`) as the tuple of tuples it was generated as.

    The arc_agi and rearc checkers compare the parsed answer board, a tuple of tuples, with `metadata.output`
    using `==`; a JSONL row holds that grid as lists, which never equal tuples, so the right answer scored
    0.05 ("a board, but wrong") from a stored row, in NeMo Gym too. No other generator's score changes
    when its entry goes through JSON (a test checks every one).
    """
    metadata = entry.get("metadata")
    if (
        dataset not in ("arc_agi", "rearc")
        or not isinstance(metadata, dict)
        or not isinstance(metadata.get("output"), list)
    ):
        return entry
    grid = tuple(tuple(row) if isinstance(row, list) else row for row in metadata["output"])
    return {**entry, "metadata": {**metadata, "output": grid}}


def last_boxed_quoted(text: str) -> str | None:
    """Like `last_boxed`, but braces inside double-quoted strings do not count (JSON answers such as codeio's
    `{"s": "}[}"}`); a backslash escapes the next character. None when no box closes that way."""
    start, limit = text.rfind(BOXED), len(text)
    while start != -1:
        depth, begin, quoted = 1, start + len(BOXED), False
        for token in BOX_TOKEN.finditer(text, begin, limit):
            mark = token.group()
            if mark == '"':
                quoted = not quoted
            elif not quoted and mark in "{}":
                depth += 1 if mark == "{" else -1
                if depth == 0:
                    return text[begin : token.start()].strip()
        start, limit = text.rfind(BOXED, 0, start), start
    return None


def without_final_period(stated: str) -> str:
    """A stated answer (the rest of its line) less its trailing whitespace and one final period."""
    return stated.rstrip().removesuffix(".").rstrip() or stated[:1]


def answer_candidates(text: str, *, numeric: bool = False) -> tuple[list[str], Extraction]:
    """The final answer in an assistant message, as one or two readings of it, and where it was found.

    Order: the last `\\boxed{...}` (read with quoted braces skipped when that closes it), then the last
    `<answer>...</answer>`, then the last "the answer is X", then, for a task whose reference answer is a
    number (`numeric`), the last number in the text (the usual GSM8K-style fallback: "1 + 5 = 6" answers 6),
    else the last non-empty line. `<think>...</think>` blocks are dropped first. A stated answer ending with a
    period has two readings, without and with it: the period may end the sentence or the answer
    (sentence_reordering's answers end with one); the caller scores both.
    """
    text = strip_thinking(text)
    boxed = (last_boxed_quoted(text) if '"' in text else None) or last_boxed(text)
    if boxed is not None:
        return [boxed], Extraction.BOXED
    tagged = last_answer_tag(text)
    if tagged is not None:
        return [tagged], Extraction.ANSWER_TAG
    stated = ANSWER_IS.findall(text)
    if stated:
        in_statement = NUMBER.findall(stated[-1]) if numeric else []
        if in_statement:
            return [in_statement[-1]], Extraction.ANSWER_IS
        bare, whole = without_final_period(stated[-1]).strip(), stated[-1].strip()
        return ([bare, whole] if whole != bare else [bare]), Extraction.ANSWER_IS
    numbers = NUMBER.findall(text) if numeric else []
    if numbers:
        return [numbers[-1]], Extraction.LAST_NUMBER
    line = last_line(text)
    return ([line], Extraction.LAST_LINE) if line is not None else ([], Extraction.NONE)


def extract_final_answer(text: str, *, numeric: bool = False) -> tuple[str | None, Extraction]:
    """The first reading of `answer_candidates` (None when there is none), and where it was found."""
    candidates, where = answer_candidates(text, numeric=numeric)
    return (candidates[0] if candidates else None), where


@cache
def score_fn(dataset: str) -> Callable[[str | None, dict[str, Any]], float]:
    """The library's checker for a generator (cached: building it instantiates a default dataset).

    Raises:
        HTTPException: 422 for a name reasoning_gym does not know, with a close name if any.
    """
    if dataset not in DATASETS:
        raise HTTPException(422, f"unknown reasoning_gym dataset {dataset!r}{did_you_mean(dataset, DATASETS)}")
    try:
        return reasoning_gym.get_score_answer_fn(dataset)
    except Exception as exc:  # noqa: BLE001 - e.g. composite, which has no default config to build
        raise HTTPException(
            422, f"reasoning_gym cannot build the {dataset} checker on its own: {type(exc).__name__}: {exc}"
        ) from None


def try_score(
    scorer: Callable[[str | None, dict[str, Any]], float], answer: str | None, entry: dict[str, Any]
) -> float | str:
    """`scorer(answer, entry)` as a float, or `"Type: message"` of the exception it raised (some checkers
    raise on an answer they cannot parse: prime_factorization on "xyz", boxnet on "1")."""
    try:
        return float(scorer(answer, entry))
    except Exception as exc:  # noqa: BLE001 - any checker failure is reported, never raised
        return f"{type(exc).__name__}: {exc}"


class ReasoningGymServer(ResourcesServer):
    """Single-turn reasoning tasks from `reasoning-gym`; no tools. Reward in [0, 1] (the library's score;
    some generators give partial credit, e.g. spell_backward per matching letter)."""

    verify_request_type = ReasoningGymRequest

    class Config(ServerConfig):
        binary_reward: bool = Field(False, description="reward 1.0 only for a full score, 0.0 for any partial credit")

    async def verify(self, request: ReasoningGymRequest, session: Session) -> VerifyResult:
        """Score the last assistant message against the row's entry. Reward in [0, 1].

        Raises:
            HTTPException: 422 for a row of neither shape, an unknown dataset, or an entry whose own reference
                answer its checker rejects (a data problem, never a silent 0).
        """
        dataset, entry = request.task()
        scorer = score_fn(dataset)
        numeric = isinstance(entry["answer"], str) and NUMBER.fullmatch(entry["answer"].strip()) is not None
        candidates, where = answer_candidates(last_assistant_text(request.response), numeric=numeric)
        results = [(try_score(scorer, candidate, entry), candidate) for candidate in candidates]
        scored = [(score, candidate) for score, candidate in results if isinstance(score, float)]
        fields: dict[str, Any] = {}
        if results and not scored:  # the checker raised on every reading: the model's answer, or the entry?
            if entry["answer"] is not None and isinstance(data_error := try_score(scorer, entry["answer"], entry), str):
                raise HTTPException(422, f"the {dataset} checker fails on this entry's own answer: {data_error}")
            fields["checker_error"] = results[0][0]  # the model's answer is unparsable to it: reward 0
        # The best reading (the first on a tie); no answer at all scores 0 unchecked.
        score, extracted = (
            max(scored, key=lambda pair: pair[0]) if scored else (0.0, candidates[0] if candidates else None)
        )
        reward = float(score >= 1.0) if self.config.binary_reward else min(max(score, 0.0), 1.0)
        return VerifyResult(
            reward=reward, extracted_answer=extracted, extraction=where.value, dataset=dataset, score=score, **fields
        )
