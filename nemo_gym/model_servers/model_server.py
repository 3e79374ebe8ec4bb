"""The base of a model server: `ModelServer`, a policy model behind the OpenAI API: `POST /v1/responses`,
`POST /v1/chat/completions`, `GET /v1/models`. Subclasses implement `responses(body)` and `chat_completions(body)`
(non-streaming); `stream: true` is served by the framework as server-sent events built from the whole answer
(`nemo_gym.serving.openai_stream`). A call under `/ng-rollout/<id>/training-token-capture/` is recorded with its token
ids for rollout `<id>` (NeMo Gym 0.7.0's training token capture, `nemo_gym.serving.token_capture`) when the run
captures (`ng_run +token_id_capture.enabled=true`), and refused (409) when it does not."""

from __future__ import annotations

import asyncio
from functools import cached_property
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.serving.api_schema import json_body, model_schema
from nemo_gym.serving.openai_stream import chat_sse, responses_sse
from nemo_gym.serving.server import BaseServer, request_body, validated
from nemo_gym.serving.token_capture import TokenCaptureStore, record_call, resolve_parent, settings_from_env

__all__ = ["ModelServer"]


# The fields of a model server's bodies the framework checks (strictly, so a declared type means that type); every
# other field passes through untouched. Their JSON schemas are what /openapi.json declares.
class ResponsesCreate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="ResponsesCreate")
    input: str | list[dict[str, Any]] = Field(None, description="a user message, or the input items")  # type: ignore[assignment]
    stream: bool | None = None


class ChatCreate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, title="ChatCompletionCreate")
    messages: list[dict[str, Any]] = Field(None, description="the chat messages")  # type: ignore[assignment]
    stream: bool | None = None


class ModelServer(BaseServer):
    """A policy model behind the OpenAI API (module docstring)."""

    server_type = "responses_api_models"

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def models(self) -> list[str]:
        """Model names served."""
        return []

    def add_routes(self, app: FastAPI) -> None:
        for path, route, model in (
            ("/v1/responses", self._responses_route, ResponsesCreate),
            ("/v1/chat/completions", self._chat_route, ChatCreate),
        ):
            app.add_api_route(
                path,
                route,
                methods=["POST"],
                openapi_extra=json_body(model_schema(model, self.openapi_components), required=True, streams=True),
            )
        app.add_api_route("/v1/models", self._models_route, methods=["GET"])

    async def _responses_route(self, request: Request) -> Any:
        body = await request_body(request)
        validated(ResponsesCreate, body)  # checked; the body itself goes on, every field kept
        stream = bool(body.pop("stream", False))
        answer = await self._answer(request, body, chat=False)
        return responses_sse(answer) if stream else answer

    async def _chat_route(self, request: Request) -> Any:
        body = await request_body(request)
        validated(ChatCreate, body)
        stream = bool(body.pop("stream", False))
        body.pop("stream_options", None)
        answer = await self._answer(request, body, chat=True)
        return chat_sse(answer) if stream else answer

    @cached_property
    def token_capture_store(self) -> TokenCaptureStore | None:
        """Where this run's training token capture records go (None: the run does not capture; read from the
        environment once, as `ng_run` sets it for the server's process). One store for the process, so that a
        rollout's records file is read once and then only its new lines (`TokenCaptureStore.entries`)."""
        settings = settings_from_env()
        return TokenCaptureStore(settings.dir) if settings is not None and settings.dir is not None else None

    async def _answer(self, request: Request, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        """The answer to `body`; a call under the training token capture prefix gets its parent's token ids back on
        its last assistant turn and is recorded (`nemo_gym.serving.token_capture`)."""
        state = request.scope.get("state", {})
        if not state.get("token_capture"):
            return await (self.chat_completions(body) if chat else self.responses(body))
        store, rollout_id = self.token_capture_store, state["rollout_id"]
        if store is None:
            raise HTTPException(
                409,
                "this run does not capture token ids: start ng_run with +token_id_capture.enabled=true to call"
                " /ng-rollout/<id>/training-token-capture/...",
            )
        entries = await asyncio.to_thread(store.entries, rollout_id)
        body, lineage = resolve_parent(body, entries, chat=chat)
        answer = await (self.chat_completions(body) if chat else self.responses(body))
        await asyncio.to_thread(record_call, store, rollout_id, answer, lineage, chat=chat)
        return answer

    async def _models_route(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "owned_by": "nemo_gym"} for m in await self.models()],
        }
