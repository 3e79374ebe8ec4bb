"""The schema of a rollout's `ng_trajectory` capture record (NeMo Gym 0.7.0's `rollout_observability.TrajectoryRecord`,
`schema_version` "1.0") as pydantic models: what `nemo_gym.env.capture.TrajectoryCapture` writes and what the rollout
health checks (`nemo_gym.collect.health`) read. A record these models refuse is unreadable evidence, as in 0.7.0.

Every model refuses fields it does not declare (0.7.0's `extra="forbid"`), counts and durations are never negative.
One difference: 0.7.0 types an invocation's `conversation` items as its Responses input item union; here each item is
a JSON object (the agent wrote them from its model server's answers).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AgentInvocation",
    "ModelCallRef",
    "ModelServerRef",
    "ObservationGap",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryToolCall",
    "TrajectoryTurn",
]


class _Observation(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelServerRef(BaseModel):
    """A model server instance: `{type: responses_api_models, name: <instance>}`."""

    type: Literal["responses_api_models"]
    name: str


class ModelCallRef(_Observation):
    """How a turn or an invocation names a model call: its `model_call_id`, or its model server and response id."""

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _has_a_join_key(self) -> ModelCallRef:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError("model_call_id or both model_ref and response_id are required")
        return self


class TokenStats(_Observation):
    prompt_tokens: int | None = Field(None, ge=0)
    completion_tokens: int | None = Field(None, ge=0)
    reasoning_tokens: int | None = Field(None, ge=0)
    total_tokens: int | None = Field(None, ge=0)
    cached_tokens: int | None = Field(None, ge=0)


class ResponseMetadata(_Observation):
    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: float | None = Field(None, ge=0)


class TrajectoryModelCall(_Observation):
    """One model call: its request and answer, wall-clock bounds (Unix seconds), duration (ms), metadata, tokens."""

    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(None, ge=0)
    request: Any = None
    response: Any = None
    response_metadata: ResponseMetadata = Field(default_factory=ResponseMetadata)
    token_stats: TokenStats = Field(default_factory=TokenStats)


class TrajectoryTurn(_Observation):
    """One agent turn: the input it answered, its answer and reasoning, the tool calls made so far."""

    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: Any = None
    answer: Any = None
    reasoning_content: Any = None
    resolved: bool | None = None
    step_count: int = Field(ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class AgentInvocation(_Observation):
    """One agent (or subagent) conversation."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: Literal["completed", "failed", "incomplete", "unknown"] = "unknown"
    duration_ms: float | None = Field(None, ge=0)
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[dict[str, Any]] = Field(default_factory=list)


class TrajectoryToolCall(_Observation):
    """One tool call: its timings, how it ended and the output the model saw."""

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    sandbox_id: str | None = None
    tool_name: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(None, ge=0)
    timing_source: Literal["executor", "artifact", "harness"] | None = None
    status: Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"] = "unknown"
    error_type: str | None = None
    output: Any = None

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> TrajectoryToolCall:
        if self.started_at is not None and self.completed_at is not None and self.completed_at < self.started_at:
            raise ValueError("completed_at must not precede started_at")
        return self


class ObservationGap(_Observation):
    """Evidence the producer could not observe (`code`, e.g. `resolution_unavailable`)."""

    code: str
    invocation_id: str | None = None
    detail: str | None = None


class TrajectoryRecord(_Observation):
    """A rollout's capture record (module docstring). Invocation ids and model call ids are unique, each turn names
    the record's task and rollout, and a turn number is unique in its invocation."""

    schema_version: Literal["1.0"] = "1.0"
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _identities(self) -> TrajectoryRecord:
        invocation_ids = [invocation.invocation_id for invocation in self.invocations]
        if len(invocation_ids) != len(set(invocation_ids)):
            raise ValueError("invocation_id must be unique within a trajectory")
        call_ids = [call.model_call_id for call in self.model_calls if call.model_call_id]
        if len(call_ids) != len(set(call_ids)):
            raise ValueError("model_call_id must be unique within a trajectory")
        if any(turn.task_id != self.task_id or turn.rollout_id != self.rollout_id for turn in self.turns):
            raise ValueError("turn identity must match the trajectory")
        turn_keys = [(turn.invocation_id, turn.turn_no) for turn in self.turns]
        if len(turn_keys) != len(set(turn_keys)):
            raise ValueError("turn number must be unique within an invocation")
        return self
