"""The base of a model server: `ModelServer`, a policy model behind the OpenAI API: `POST /v1/responses`,
`POST /v1/chat/completions`, `GET /v1/models`. Subclasses implement `responses(body)` and `chat_completions(body)`
(non-streaming); `stream: true` is served by the framework as server-sent events built from the whole answer
(`nemo_gym.serving.openai_stream`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.serving.api_schema import json_body, model_schema
from nemo_gym.serving.openai_stream import chat_sse, responses_sse
from nemo_gym.serving.server import BaseServer, request_body, validated

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
        answer = await self.responses(body)
        return responses_sse(answer) if stream else answer

    async def _chat_route(self, request: Request) -> Any:
        body = await request_body(request)
        validated(ChatCreate, body)
        stream = bool(body.pop("stream", False))
        body.pop("stream_options", None)
        answer = await self.chat_completions(body)
        return chat_sse(answer) if stream else answer

    async def _models_route(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "owned_by": "nemo_gym"} for m in await self.models()],
        }
