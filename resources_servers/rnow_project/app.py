"""rnow_project: a ReinforceNow project folder (`rewards.py`, optional `tools.py`) as a resources server.

The project's `@tool` functions are the tools (each rollout may call only its entry's `tools` subset, all
when the entry names none; outputs cut to `max_tool_response_chars`); `/verify` runs the entry's `@reward`
functions on the conversation (rnow's chat messages) and returns their total (nemo_gym.rnow.scoring: the
sum, 0 when a precondition reward is 0) with each reward in `reward_components`. A reward that raises or
times out fails the rollout (502 `reward_error` / `reward_timeout`), it never scores 0.
Task rows come from `ng_run +rnow_project=DIR` (nemo_gym.rnow.project).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.rnow.decorators import DEFAULT_REWARD_TIMEOUT_S, RewardArgs, ToolArgs, ToolSpec, tool_parameters
from nemo_gym.rnow.loading import load_functions
from nemo_gym.rnow.sandboxed import SandboxedRewards
from nemo_gym.rnow.scoring import score
from nemo_gym.serving.openai_convert import ConversionError, input_items, input_items_to_messages
from nemo_gym.serving.server import ServerConfig, Session

DEFAULT_TOOL_TIMEOUT_S = 60.0


class RnowProjectConfig(ServerConfig):
    project_dir: str = Field(
        "examples/rnow_project",
        description="the rnow project folder (rewards.py, tools.py); relative paths from the repository root",
    )
    max_tool_response_chars: int | None = Field(
        None, ge=1, description="tool outputs longer than this many characters are cut (null: no limit)"
    )
    reward_timeout_s: float = Field(
        DEFAULT_REWARD_TIMEOUT_S,
        gt=0,
        description="seconds a reward may take unless its @reward(timeout=...) says otherwise",
    )


class RnowEntry(BaseModel):
    """The entry fields both bodies read, declared once."""

    metadata: dict[str, Any] = Field(default_factory=dict, description="args.metadata of the rewards and tools")
    tools: list[str] | None = Field(None, description="the tools this entry may call (null: all)")


class RnowSeed(RnowEntry, SeedRequest):
    """`/seed_session` body: the row, whose `tools` and `metadata` the session keeps for the tool calls."""


class RnowTask(RnowEntry, VerifyRequest):
    """`/verify` body: the row plus the rollout's `response`."""

    rewards: list[str] = Field(min_length=1, description="names of the project's @reward functions to score with")
    variables: dict[str, Any] = Field(default_factory=dict, description="args.variables of the rewards")
    docker: str | None = Field(None, description="rnow's sandbox image (required by sandbox rewards; not used here)")


def truncate(text: str, max_chars: int | None) -> str:
    """`text` cut to `max_chars` characters with a note of how much was cut (unchanged when it fits)."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... [truncated {len(text) - max_chars} characters]"


class RnowProjectServer(ResourcesServer):
    """The project's tools and rewards. Reward range: [0, number of the entry's rewards] (each in [0, 1])."""

    Config = RnowProjectConfig
    config: RnowProjectConfig
    seed_request_type = RnowSeed
    verify_request_type = RnowTask
    reward_range: ClassVar[tuple[float, float]] = (0.0, float("inf"))

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        project = Path(self.config.project_dir)
        self.project_dir = project if project.is_absolute() else REPO_ROOT / project
        self.functions = load_functions(self.project_dir)  # at build time: the tool routes depend on it
        needs_sandbox = any(spec.sandbox for spec in self.functions.rewards.values())
        self.sandbox = SandboxedRewards(self.project_dir) if needs_sandbox else None

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [spec.schema for spec in self.functions.tools.values()]

    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)
        for name, spec in self.functions.tools.items():
            self.add_tool_route(app, name, self._route_function(spec))

    def _route_function(self, spec: ToolSpec) -> Callable:
        """An async function with the tool's schema parameters plus the rollout's session, for the route."""
        params, hints = tool_parameters(spec.fn)

        async def call(_rnow_session: Session, **arguments: Any) -> str:
            return await self.call_tool(spec, arguments, _rnow_session)

        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
        call.__signature__ = inspect.Signature(
            [*keyword, inspect.Parameter("_rnow_session", inspect.Parameter.KEYWORD_ONLY, annotation=Session)]
        )  # type: ignore[attr-defined]
        call.__annotations__ = {**{p.name: hints[p.name] for p in params}, "_rnow_session": Session}
        return call

    async def seed_session(self, row: RnowSeed, session: Session) -> dict[str, Any]:
        """Keep the entry's `tools` subset and `metadata` for its tool calls."""
        session["tools"] = row.tools
        session["metadata"] = row.metadata
        return {}

    async def call_tool(self, spec: ToolSpec, arguments: dict[str, Any], session: Session) -> str:
        """The tool's output as text (JSON unless it returned a string), cut to max_tool_response_chars; a
        tool that raises or times out gives an `Error: ...` text to the model, as rnow does."""
        allowed = session.get("tools")
        if allowed is not None and spec.name not in allowed:
            return (
                f"Error: tool {spec.name!r} is not available for this task; available: {', '.join(allowed) or 'none'}"
            )
        if spec.takes_args:
            arguments = {**arguments, "args": ToolArgs(metadata=session.get("metadata") or {})}
        timeout_s = spec.timeout_s or DEFAULT_TOOL_TIMEOUT_S
        call = spec.fn(**arguments) if inspect.iscoroutinefunction(spec.fn) else asyncio.to_thread(spec.fn, **arguments)
        try:
            result = await asyncio.wait_for(call, timeout_s)
        except TimeoutError:
            return f"Error: tool {spec.name} took longer than {timeout_s:g} s"
        except Exception as exc:  # the model sees the error and may retry, as with rnow
            return f"Error: tool {spec.name} raised {type(exc).__name__}: {exc}"
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return truncate(text, self.config.max_tool_response_chars)

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        """The total of the entry's rewards over the conversation (see the module docstring); 0.0 with
        `failure_reason: malformed_output` (and `output_error`) when `response.output` is not a list of
        items of chat shape: bad model output, the rewards not run.

        Raises:
            HTTPException: 422 for unknown reward names or a prompt (`responses_create_params.input`) that
                does not convert to chat messages.
        """
        task: RnowTask = request  # type: ignore[assignment]
        unknown = [name for name in task.rewards if name not in self.functions.rewards]
        if unknown:
            raise HTTPException(
                422, f"unknown rewards {unknown}; rewards.py defines: {', '.join(sorted(self.functions.rewards))}"
            )
        try:
            prompt = input_items(task.responses_create_params)
            input_items_to_messages(prompt)
        except ConversionError as exc:
            raise HTTPException(422, f"responses_create_params.input: {exc}") from None
        output = task.response.get("output") or []
        try:
            if not isinstance(output, list):
                raise ConversionError(f"response.output must be a list of items, got {type(output).__name__}")
            messages = input_items_to_messages([*prompt, *output])
        except ConversionError as exc:
            return VerifyResult(reward=0.0, failure_reason="malformed_output", output_error=str(exc))
        args = RewardArgs(metadata=task.metadata, variables=task.variables)
        specs = [self.functions.rewards[name] for name in task.rewards]
        outcome = await score(
            specs, args, messages, default_timeout_s=self.config.reward_timeout_s, sandbox=self.sandbox
        )
        return VerifyResult(reward=outcome.total, reward_components=outcome.components)
