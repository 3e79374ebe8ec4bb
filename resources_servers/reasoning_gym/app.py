"""reasoning_gym: procedurally generated reasoning tasks (arithmetic, algebra, word games, logic, ...) from the
PyPI library `reasoning-gym`, scored by the library's own checker for each task's generator.

The rows come from `prepare.py` (next to this file): each carries the generator name (`dataset`) and the
full reasoning_gym entry (`entry`: question, answer, metadata), which is all the checker needs. `/verify`
takes the last assistant message, extracts the final answer from it (`\\boxed{...}`, else
`<answer>...</answer>`, else "the answer is X", else the last number for numeric tasks, else the last
non-empty line) and scores it with
`reasoning_gym.get_score_answer_fn(dataset)(answer, entry)`.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import lru_cache
from typing import Any, Callable

import reasoning_gym
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reasoning_gym.factory import DATASETS

from nemo_gym.answers import last_answer_tag, last_assistant_text, last_boxed, last_line, strip_thinking
from nemo_gym.config import did_you_mean
from nemo_gym.server import ResourcesServer, ServerConfig, Session, VerifyRequest, VerifyResult

# The rest of the line, trimmed by `stated_answers`: a lazy group before `\s*\.?\s*$` backtracked cubically
# on a run of spaces (a minute for a few kilobytes of them).
ANSWER_IS = re.compile(r"answer is\s*:?\s*([^\n]+)", flags=re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class Extraction(str, Enum):
    """Where the final answer was found in the assistant's text."""

    BOXED = "boxed"
    ANSWER_TAG = "answer_tag"
    ANSWER_IS = "answer_is"
    LAST_NUMBER = "last_number"
    LAST_LINE = "last_line"
    NONE = "none"


class ReasoningGymTask(BaseModel):
    """The task fields of a row that `/verify` reads (written by `prepare.py`)."""

    model_config = ConfigDict(extra="ignore")
    dataset: str = Field(description="reasoning_gym generator name, e.g. basic_arithmetic")
    entry: dict[str, Any] = Field(description="the reasoning_gym entry: question, answer, metadata")


def stated_answers(text: str) -> list[str]:
    """What follows each "answer is" (and an optional colon) to the end of its line, less its trailing
    whitespace and one final period; linear in the text."""
    return [rest.rstrip().removesuffix(".").rstrip() or rest[:1] for rest in ANSWER_IS.findall(text)]


def extract_final_answer(text: str, *, numeric: bool = False) -> tuple[str | None, Extraction]:
    """The final answer in an assistant message, and where it was found.

    Order: the last `\\boxed{...}`, then the last `<answer>...</answer>`, then the last "the answer is X",
    then, for a task whose reference answer is a number (`numeric`), the last number in the text (the usual
    GSM8K-style fallback: "1 + 5 = 6" answers 6), else the last non-empty line.
    `<think>...</think>` blocks are dropped first.
    """
    text = strip_thinking(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, Extraction.BOXED
    tagged = last_answer_tag(text)
    if tagged is not None:
        return tagged, Extraction.ANSWER_TAG
    stated = stated_answers(text)
    if stated:
        in_statement = NUMBER.findall(stated[-1]) if numeric else []
        return (in_statement[-1] if in_statement else stated[-1].strip()), Extraction.ANSWER_IS
    numbers = NUMBER.findall(text) if numeric else []
    if numbers:
        return numbers[-1], Extraction.LAST_NUMBER
    line = last_line(text)
    return (line, Extraction.LAST_LINE) if line is not None else (None, Extraction.NONE)


@lru_cache(maxsize=None)
def score_fn(dataset: str) -> Callable[[str | None, dict[str, Any]], float]:
    """The library's checker for a generator (cached: building it instantiates a default dataset).

    Raises:
        HTTPException: 422 for a name reasoning_gym does not know, with a close name if any.
    """
    if dataset not in DATASETS:
        raise HTTPException(422, f"unknown reasoning_gym dataset {dataset!r}{did_you_mean(dataset, DATASETS)}")
    return reasoning_gym.get_score_answer_fn(dataset)


class ReasoningGymServer(ResourcesServer):
    """Single-turn reasoning tasks from `reasoning-gym`; no tools. Reward in [0, 1] (the library's score;
    some generators give partial credit, e.g. spell_backward per matching letter)."""

    class Config(ServerConfig):
        binary_reward: bool = Field(False, description="reward 1.0 only for a full score, 0.0 for any partial credit")

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        """Score the last assistant message against the row's `entry`. Reward in [0, 1].

        Raises:
            HTTPException: 422 for a row without `dataset`/`entry`, an unknown dataset, or an entry its checker rejects.
        """
        try:
            task = ReasoningGymTask.model_validate(request.model_extra or {})
        except ValidationError as exc:
            raise HTTPException(422, exc.errors(include_url=False, include_input=False)) from None
        if not isinstance(task.entry.get("answer"), str):
            raise HTTPException(422, "entry must hold the reference 'answer' as a string")
        scorer = score_fn(task.dataset)
        numeric = NUMBER.fullmatch(task.entry["answer"].strip()) is not None
        extracted, where = extract_final_answer(last_assistant_text(request.response), numeric=numeric)
        try:
            score = float(scorer(extracted, task.entry)) if extracted is not None else 0.0
        except Exception as exc:  # the library's checker rejects the entry: a data problem, never a silent 0
            raise HTTPException(422, f"the {task.dataset} checker failed on this entry: {type(exc).__name__}: {exc}") from None
        reward = float(score >= 1.0) if self.config.binary_reward else min(max(score, 0.0), 1.0)
        return VerifyResult(reward=reward, extracted_answer=extracted, extraction=where.value, dataset=task.dataset, score=score)
