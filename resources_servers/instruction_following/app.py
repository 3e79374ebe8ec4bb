"""instruction_following: IFEval-style verifiable instructions ("answer with at least 100 words", "no commas",
"wrap the answer in JSON", ...); the reward is the fraction of a row's instructions the answer follows.

Rows are IFEval's (`key`, `prompt`, `instruction_id_list`, `kwargs`) or NeMo Gym's (`id` for `key`, optional
`grading_mode`) plus `responses_create_params`. The checkers live in `instructions.py` (a registry keyed by
IFEval's instruction ids) and `iftrain.py` (the 29 more ids NeMo Gym's rows use); `ifeval_reference.py` holds
IFEval's own readings where ours depart, used with `semantics: nemo_gym`. `generate_data.py` writes the
bundled tasks. `/verify` reads the last assistant message and checks each instruction strictly (the text
as written) and loosely (IFEval's loose reading: also without the first and/or last line, and without `*`);
the server's `mode` picks which one is the reward.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, Literal

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.env.answers import last_assistant_text
from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig, Session

from . import ifeval_reference as reference
from . import iftrain, instructions

Semantics = Literal["ours", "nemo_gym"]
# The ids a row may use, by semantics: IFEval's (ours, or IFEval's own readings where ours depart) and NeMo Gym's 29
# more.
REGISTRIES: dict[str, dict[str, Any]] = {
    "ours": {**instructions.INSTRUCTIONS, **iftrain.IFTRAIN},
    "nemo_gym": {
        **{
            i: dataclasses.replace(x, check=reference.REFERENCE_CHECKS.get(i, x.check))
            for i, x in instructions.INSTRUCTIONS.items()
        },
        **iftrain.IFTRAIN,
    },
}


class FailureReason(str, Enum):
    """Why an answer scored 0 without being checked."""

    NO_TEXT = "no_assistant_text"
    TOO_LONG = "response_too_long"


class InstructionTask(BaseModel):
    """The task fields of a row: parallel lists of IFEval instruction ids and their keyword arguments. Declared
    here once; the `/seed_session` and `/verify` bodies are this plus their own fields."""

    model_config = ConfigDict(extra="allow")
    instruction_id_list: list[str] = Field(min_length=1, description="instruction ids, e.g. punctuation:no_comma")
    kwargs: list[dict[str, Any] | None] = Field(
        description="keyword arguments of each instruction ({} or null when none)"
    )
    grading_mode: Literal["binary", "fraction"] | None = Field(
        None,
        description="NeMo Gym's per-row reward: binary (all followed) or fraction; null: the server's all_or_nothing",
    )

    @model_validator(mode="after")
    def _instructions_are_known(self) -> InstructionTask:
        self.bound()  # raises ValueError (a 422) for an unknown id or bad kwargs (the same under both semantics)
        return self

    def bound(self, semantics: Semantics = "ours") -> list[Any]:
        """The row's `instructions.BoundInstruction`s, in order, checked under `semantics`."""
        return instructions.bind_instructions(self.instruction_id_list, self.kwargs, REGISTRIES[semantics])


class InstructionSeed(InstructionTask, SeedRequest):
    """`/seed_session` body: the row, its instructions checked at rollout start (422 for an unknown id or bad
    kwargs), so a malformed row fails before the model is called."""

    model_config = ConfigDict(extra="allow")


class InstructionFollowingRequest(InstructionTask, VerifyRequest):
    """`/verify` body: the row's task fields plus `responses_create_params` and `response`."""

    model_config = ConfigDict(extra="allow")


class InstructionFollowingResult(VerifyResult):
    follow_instruction_list: list[bool] = Field(description="per instruction, followed under the server's mode")
    follow_all_instructions: bool
    strict_fraction: float = Field(description="fraction of instructions followed by the text as written")
    loose_fraction: float = Field(description="fraction followed under IFEval's loose reading")
    mode: Literal["strict", "loose"]
    semantics: Semantics
    grading_mode: Literal["binary", "fraction"] = Field(
        description="how the reward was computed: all followed (binary) or the fraction"
    )
    failure_reason: FailureReason | None = Field(None, description="set when the answer was not checked (reward 0)")


def components(bound: list[Any], followed: list[bool]) -> dict[str, float]:
    """1.0/0.0 per instruction id (a repeated id gets `#2`, `#3`, ...)."""
    result: dict[str, float] = {}
    for b, ok in zip(bound, followed):
        key, n = b.instruction_id, 2
        while key in result:
            key, n = f"{b.instruction_id}#{n}", n + 1
        result[key] = float(ok)
    return result


class InstructionFollowingServer(ResourcesServer):
    """Verifiable instruction following; no tools. Reward range: [0.0, 1.0], the fraction of the row's
    instructions followed, or 1.0/0.0 for all of them (`all_or_nothing`, a row's `grading_mode: binary`)."""

    seed_request_type = InstructionSeed  # no seed_session of our own: checking the row is all seeding does
    verify_request_type = InstructionFollowingRequest

    class Config(ServerConfig):
        mode: Literal["strict", "loose"] = Field(
            "strict", description="which reading gives the reward: strict or loose (IFEval's)"
        )
        semantics: Semantics = Field(
            "ours",
            description=(
                "ours: IFEval's instructions as instructions.py reads them; nemo_gym: IFEval's own readings, as NeMo"
                " Gym checks them"
            ),
        )
        all_or_nothing: bool | None = Field(
            None,
            description=(
                "for rows without grading_mode: reward 1.0 only when every instruction is followed, else 0.0; "
                "null: false under semantics ours, true under nemo_gym (NeMo Gym's default)"
            ),
        )
        max_response_chars: int = Field(
            20_000, gt=0, description="longer answers score 0 unchecked (failure_reason response_too_long)"
        )

    async def verify(self, request: InstructionFollowingRequest, session: Session) -> InstructionFollowingResult:
        """Check each instruction against the last assistant message. Reward in [0, 1]."""
        bound = request.bound(self.config.semantics)
        text = last_assistant_text(request.response)
        failure = (
            FailureReason.NO_TEXT
            if not text.strip()
            else FailureReason.TOO_LONG
            if len(text) > self.config.max_response_chars
            else None
        )
        if failure is None:
            strict, loose = await run_in_threadpool(
                instructions.follow_lists, bound, text
            )  # up to ~2 s at max_response_chars
        else:
            strict = loose = [False] * len(bound)
        followed = loose if self.config.mode == "loose" else strict
        fraction = sum(followed) / len(followed)
        grading = request.grading_mode or self.default_grading_mode()
        return InstructionFollowingResult(
            reward=float(all(followed)) if grading == "binary" else fraction,
            reward_components=components(bound, followed),
            follow_instruction_list=followed,
            follow_all_instructions=all(followed),
            strict_fraction=sum(strict) / len(strict),
            loose_fraction=sum(loose) / len(loose),
            mode=self.config.mode,
            semantics=self.config.semantics,
            grading_mode=grading,
            failure_reason=failure,
        )

    def default_grading_mode(self) -> Literal["binary", "fraction"]:
        """The reward of a row without `grading_mode`: `all_or_nothing`, or when null the semantics' default."""
        all_or_nothing = (
            self.config.all_or_nothing
            if self.config.all_or_nothing is not None
            else self.config.semantics == "nemo_gym"
        )
        return "binary" if all_or_nothing else "fraction"

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus IFEval's four accuracies (prompt- and instruction-level, strict and loose)
        and the follow rate of each instruction id under the server's mode."""
        metrics = await super().aggregate_metrics(verify_responses)
        rows = [
            r for r in verify_responses if isinstance(r, dict) and isinstance(r.get("follow_instruction_list"), list)
        ]
        if not rows:
            return metrics
        sizes = [len(r["follow_instruction_list"]) for r in rows]
        for reading in ("strict", "loose"):
            fractions = [float(r.get(f"{reading}_fraction", 0.0)) for r in rows]
            metrics[f"prompt_level_{reading}_accuracy"] = sum(f == 1.0 for f in fractions) / len(rows)
            metrics[f"instruction_level_{reading}_accuracy"] = sum(
                round(f * n) for f, n in zip(fractions, sizes)
            ) / max(sum(sizes), 1)
        per_id: dict[str, list[float]] = {}
        for row in rows:
            for key, value in (row.get("reward_components") or {}).items():
                per_id.setdefault(key.split("#")[0], []).append(float(value))
        metrics["instruction_follow_rate"] = {key: sum(v) / len(v) for key, v in sorted(per_id.items())}
        return metrics
