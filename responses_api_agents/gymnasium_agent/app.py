"""gymnasium_agent: drives a Gymnasium-style resources server (`POST /reset`, `POST /step`) with the policy.

One `/run` is one episode:

    seed_session(row) → reset(row's reset fields) → observation
    loop: the observation goes to the model as a user message → the text of its reply is the action →
          step(action) → {observation, reward, terminated, truncated, info}
    until terminated, truncated, `max_turns` model calls, or the model runs out of output tokens
    → verify(row + response)   # the environment returns the episode's total reward

The reset fields are the row's fields named by the environment's `reset` tool schema (`GET /tools`), e.g.
`target_word` for wordle, `seed` for blackjack. `response.output` holds the whole trajectory: the observations
as user messages and the model's output items unchanged (training token ids included), in order.

Posted as rollout `<id>` (`ng_collect_rollouts +observability_enabled=true`), `/run` also answers the rollout's
`ng_trajectory` capture record (`nemo_gym.env.capture`): a turn per answered model call, every model call, the
conversation (the initial input, then the trajectory), `completed` when the environment terminated the episode and
`incomplete` otherwise. An environment step is no function call, so the record has no tool calls.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from nemo_gym.common.errors import ServerError
from nemo_gym.env.agent_server import AgentServer
from nemo_gym.env.capture import TrajectoryCapture
from nemo_gym.env.episode import EndedEpisode, ModelCalls, StopReason, failed_run_answer, initial_input, run_answer
from nemo_gym.env.gymnasium import message_text
from nemo_gym.serving.server import ServerConfig, ServerRef, forward_optional_route


class GymnasiumAgentConfig(ServerConfig):
    resources_server: ServerRef = Field(description="the environment: {type: resources_servers, name: <instance>}")
    model_server: ServerRef = Field(description="the policy: {type: responses_api_models, name: <instance>}")
    max_turns: int = Field(10, ge=1, description="most model calls (= steps) in one episode")
    model_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for one model call")
    env_timeout_s: float = Field(60.0, gt=0, description="seconds to wait for one reset or step")


def observation_message(text: Any) -> dict[str, Any]:
    """An observation as a Responses input message of the user."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": str(text)}]}


def reply_text(output: list[dict[str, Any]]) -> str:
    """The text of the assistant messages of one model answer, joined (the action)."""
    return "".join(
        message_text(item)
        for item in output
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant"
    )


class AggregateMetricsRequest(BaseModel):
    """The `/aggregate_metrics` body: the verify answers of `/run` (each with its `stop_reason`)."""

    verify_responses: list[dict[str, Any]] = Field(description="verify answers, each with `reward` and `stop_reason`")


class GymnasiumAgent(AgentServer):
    Config = GymnasiumAgentConfig
    config: GymnasiumAgentConfig

    captures_trajectory = True

    async def run(self, row: dict[str, Any], *, rollout_id: str | None = None) -> dict[str, Any] | JSONResponse:
        """The verify answer of one episode, with its `stop_reason` (and its `ng_trajectory` when `rollout_id` is
        given); when a call failed the episode, its typed failure answer (`failed_run_answer`: with the trajectory
        when /verify failed, with the record when captured)."""
        session_id = uuid.uuid4().hex
        cookies = httpx.Cookies()
        env = self.config.resources_server.name
        capture = None
        if rollout_id is not None:
            capture = TrajectoryCapture.of_row(self.config.model_server.name, row, rollout_id)
        await self.client.post(env, "/seed_session", row, session_id=session_id, cookies=cookies)
        try:
            try:
                ended = EndedEpisode(row, *await self.episode(row, session_id, cookies, capture))
            except ServerError as exc:  # with the record of the calls made so far when captured
                return failed_run_answer(exc, capture)
            try:
                verified = await self.client.post(
                    env, "/verify", {**row, "response": ended.response}, session_id=session_id, cookies=cookies
                )
            except ServerError as exc:  # the trajectory it failed on goes with the failure, to debug the verifier
                return failed_run_answer(exc, capture, ended)
        finally:
            try:
                await self.client.post(env, "/close_session", {}, session_id=session_id, cookies=cookies, timeout_s=10)
            except Exception:  # closing is best effort
                pass
        return run_answer(verified, ended, capture)

    async def responses(self, body: dict[str, Any], *, session_id: str | None = None) -> dict[str, Any]:
        raise HTTPException(422, "gymnasium_agent needs a dataset row (its reset fields): POST /run")

    async def reset_fields(self) -> list[str]:
        """Names of the arguments of the environment's `reset` tool."""
        tools = await self.client.get(self.config.resources_server.name, "/tools", timeout_s=self.config.env_timeout_s)
        reset = next((t for t in tools if t.get("name") == "reset"), None)
        if reset is None:
            raise HTTPException(
                422, f"{self.config.resources_server.name} has no reset tool: not a Gymnasium-style environment"
            )
        return list((reset.get("parameters") or {}).get("properties") or {})

    async def env_call(
        self, path: str, body: dict[str, Any], session_id: str, cookies: httpx.Cookies
    ) -> dict[str, Any]:
        return await self.client.post(
            self.config.resources_server.name,
            path,
            body,
            session_id=session_id,
            cookies=cookies,
            timeout_s=self.config.env_timeout_s,
        )

    async def episode(
        self, row: dict[str, Any], session_id: str, cookies: httpx.Cookies, capture: TrajectoryCapture | None = None
    ) -> tuple[dict[str, Any], StopReason]:
        """Run the episode, each model call recorded in `capture` when given; returns the final `Response` (output =
        whole trajectory) and how it ended."""
        params = row["responses_create_params"]
        initial = initial_input(params)
        fields = await self.reset_fields()
        first = await self.env_call("/reset", {name: row[name] for name in fields if name in row}, session_id, cookies)
        trajectory: list[dict[str, Any]] = [observation_message(first.get("observation", ""))]
        model = ModelCalls(self.client, self.config.model_server.name, session_id, self.config.model_timeout_s, capture)
        stop_reason = StopReason.max_steps
        for _ in range(self.config.max_turns):
            output, stop = await model.step(params, [*initial, *trajectory])
            trajectory.extend(output)
            if stop:  # max_tokens: no step taken; context_overflow
                stop_reason = stop
                break
            result = await self.env_call("/step", {"action": reply_text(output)}, session_id, cookies)
            trajectory.append(observation_message(result.get("observation", "")))
            if result.get("terminated"):
                stop_reason = StopReason.completed
                break
            if result.get("truncated"):
                break
        return model.final_response(trajectory), stop_reason

    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)

        @app.get("/row_schema")
        async def row_schema() -> Any:
            return await forward_optional_route(self.client, self.config.resources_server.name, "/row_schema")

        @app.post("/aggregate_metrics")
        async def aggregate_metrics(body: AggregateMetricsRequest) -> Any:
            """The environment's metrics over the verify answers, plus the count of each `stop_reason`."""
            metrics = await self.client.post(self.config.resources_server.name, "/aggregate_metrics", body.model_dump())
            reasons = Counter(r.get("stop_reason") for r in body.verify_responses if r.get("stop_reason"))
            return {**(metrics or {}), "stop_reasons": dict(reasons)}
