"""equivalence_rule: rule-based answer equivalence. Reward 1/0, plus the rule that matched; or, with
`grading_rule` set to `exact`, `seq_match` or `weighted_seq_match`, NeMo Gym's server of the same name
(`text_rules.py`: the whole reply compared with the reference as normalised text, reward in [0, 1]).

The rules (in `rules.py`, next to this file: exact, numeric, fraction_decimal, percentage, units, boolean,
normalized_text, unordered_list / ordered_list) are tried in order against each reference answer of the
row; the first that finds the extracted answer equivalent is reported in `matched_rule`. The row's
`equivalence` options (enabled rules, tolerances, list order) override the server config's `equivalence`.

The answer is the last `\\boxed{...}` of the last assistant message, else its last `<answer>...</answer>`,
else what follows its last "answer is"/"answer:", else its last non-empty line (`<think>` blocks dropped).
"""

from __future__ import annotations

import asyncio
from enum import Enum
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.env.answers import first_answer, last_assistant_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import ServerConfig, Session

from . import rules, text_rules

Rule, RuleOptions = rules.Rule, rules.RuleOptions
GradingRule = Literal["rules", "exact", "seq_match", "weighted_seq_match"]


class RuleOverrides(BaseModel):
    """A row's `equivalence`: any of RuleOptions' fields; the ones given replace the server's defaults."""

    model_config = ConfigDict(extra="forbid")
    rules: list[Rule] | None = None  # type: ignore[valid-type]
    abs_tol: float | None = Field(None, ge=0)
    rel_tol: float | None = Field(None, ge=0)
    ordered_lists: bool | None = None
    percent_accepts_bare_number: bool | None = None
    max_list_items: int | None = Field(None, gt=1)


class EquivalenceRequest(VerifyRequest):
    """A `/verify` body: the row's task fields plus the rollout's `response`."""

    expected_answer: str | list[str] = Field(description="the reference answer, or several (any one matches)")
    equivalence: RuleOverrides | None = Field(None, description="rules and tolerances, over the server's defaults")

    @field_validator("expected_answer")
    @classmethod
    def _some_reference(cls, value: str | list[str]) -> str | list[str]:
        if not (value.strip() if isinstance(value, str) else value and all(v.strip() for v in value)):
            raise ValueError("give at least one non-empty reference answer")
        return value


class FailureReason(str, Enum):
    """Why the reward is 0 (`None` when it is 1)."""

    NO_ANSWER = "no_answer"  # no assistant text, or nothing to extract
    TOO_LONG = "too_long"  # the extracted answer is longer than max_answer_chars
    MISMATCH = "mismatch"  # no rule finds it equivalent to any reference


def extract_answer(text: str) -> str | None:
    """The final answer of an assistant message (module docstring: the order), or None."""
    return first_answer(strip_thinking(text), ("boxed", "answer_tag", "answer_phrase", "last_line"))


@lru_cache(maxsize=1)
def unit_registry() -> Any:
    """pint's default unit registry (built once: about a second)."""
    import pint

    return pint.UnitRegistry()


class EquivalenceRuleServer(ResourcesServer):
    """Single-turn answers judged equivalent to references by rules. Reward range: [0.0, 1.0]; binary by our
    rules (`grading_rule: rules`), any value in it by NeMo Gym's `seq_match` and `weighted_seq_match`."""

    verify_request_type = EquivalenceRequest

    class Config(ServerConfig):
        grading_rule: GradingRule = Field(
            "rules",
            description=(
                "rules: extract the final answer and compare it by our rules (reward 1/0); exact, seq_match, "
                "weighted_seq_match: NeMo Gym's equivalence_rule, the whole reply as normalised text (reward in [0, 1])"
            ),
        )
        equivalence: RuleOptions = Field(
            default_factory=RuleOptions,
            description="default rules and tolerances; a row's `equivalence` overrides them",
        )  # type: ignore[valid-type]
        max_answer_chars: int = Field(
            2000, gt=0, description="longest extracted answer compared; longer scores 0 (too_long)"
        )

    async def startup(self) -> None:
        await asyncio.to_thread(unit_registry)  # off the event loop, before the first verify

    async def verify(self, request: EquivalenceRequest, session: Session) -> VerifyResult:
        """By our rules: 1.0 when a rule finds the extracted answer equivalent to a reference, else 0.0 with a
        `failure_reason`. By one of NeMo Gym's: its score of the whole reply, in [0, 1]."""
        references = [request.expected_answer] if isinstance(request.expected_answer, str) else request.expected_answer
        if self.config.grading_rule != "rules":
            reply, text_rule = Trajectory.of(request.response).output_text, self.config.grading_rule
            # Off the event loop: difflib takes about a second on a megabyte of reply.
            score = await asyncio.to_thread(
                lambda: max(text_rules.grade(reply, reference, text_rule) for reference in references)
            )
            return VerifyResult(reward=score, equivalence_score=score, grading_rule=text_rule)
        given = request.equivalence.model_dump(exclude_none=True) if request.equivalence else {}
        options = self.config.equivalence.model_copy(update=given)
        answer = extract_answer(last_assistant_text(request.response))
        fields: dict[str, Any] = {"extracted_answer": answer, "matched_rule": None, "matched_reference": None}
        if answer is None:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.NO_ANSWER.value, **fields)
        if len(answer) > self.config.max_answer_chars:
            return VerifyResult(reward=0.0, failure_reason=FailureReason.TOO_LONG.value, **fields)
        for reference in references:
            if (rule := rules.equivalent(answer, reference, options, unit_registry())) is not None:
                return VerifyResult(
                    reward=1.0,
                    failure_reason=None,
                    **{**fields, "matched_rule": rule.value, "matched_reference": reference},
                )
        return VerifyResult(reward=0.0, failure_reason=FailureReason.MISMATCH.value, **fields)

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus `matched_rules` and `failure_reasons`: counts of each."""
        metrics = await super().aggregate_metrics(verify_responses)
        rows = [r for r in verify_responses if isinstance(r, dict)]
        for key, field in (("matched_rules", "matched_rule"), ("failure_reasons", "failure_reason")):
            values = [r[field] for r in rows if isinstance(r.get(field), str)]
            metrics[key] = {value: values.count(value) for value in sorted(set(values))}
        return metrics
