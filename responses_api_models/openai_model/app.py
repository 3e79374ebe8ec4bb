"""openai_model: the policy behind any OpenAI-compatible endpoint (OpenAI, a vLLM or SGLang server ...).

`/v1/responses` is forwarded to the endpoint's Responses API, or, with `use_responses_api: false`, converted
to Chat Completions and the answer converted back (`nemo_gym.serving.openai_convert`). `/v1/chat/completions` is
forwarded as is. Training token fields (`prompt_token_ids` ...) that an agent passes back are removed
before forwarding: a foreign endpoint would reject them. The API key is a secret: never logged, never
returned (pydantic `SecretStr`), and redacted from the endpoint's error answers. The endpoint's address passes
the SSRF guard (`nemo_gym.serving.net_guard`) at start and on every request, redirects included: link-local addresses
(cloud metadata) are always refused, loopback and private ones unless `allow_private_addresses` (default true:
a local vLLM at 127.0.0.1 is the usual case).

The requests go out through `nemo_gym.serving.client.ServerClient` (aiohttp; no run token; the environment's proxy
settings apply), with the `openai` client's retry rule: connection errors, timeouts, 408, 409, 429 and 5xx are
retried up to `max_retries` times with exponential backoff from 0.5 s (at most 8 s; a 429's `Retry-After` up to
60 s), as `openai._base_client.BaseClient._should_retry` decides (its `x-should-retry` answer header aside).
The `openai` client cost about 0.4 ms of CPU per call more (its request building and its httpx layer over
aiohttp): a third of this server's CPU per rollout at concurrency 256 (benchmarks/README.md).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException
from pydantic import Field, SecretStr

from nemo_gym.common.errors import ServerError, ServerHTTPError, is_transient
from nemo_gym.model_servers.model_server import ModelServer
from nemo_gym.serving import openai_convert
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.net_guard import BlockedAddressError, check_url_async, guard_middleware
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.serving.server import ServerConfig


class OpenAIModelConfig(ServerConfig):
    openai_base_url: str = Field(
        description="base URL of the endpoint, with its /v1 (e.g. https://api.openai.com/v1, http://127.0.0.1:8000/v1)"
    )
    openai_api_key: SecretStr = Field(SecretStr("EMPTY"), description="API key (a secret: never logged or returned)")
    openai_model: str = Field(description="model name sent to the endpoint; it also names the model in /v1/models")
    use_responses_api: bool = Field(
        True,
        description=(
            "true: forward /v1/responses; false: convert it to /v1/chat/completions (for endpoints without a Responses"
            " API)"
        ),
    )
    developer_as_system: bool = Field(True, description="with chat conversion: map `developer` messages to `system`")
    timeout_s: float = Field(600.0, gt=0, description="seconds one request may take")
    connect_timeout_s: float = Field(10.0, gt=0, description="seconds to open a connection")
    max_retries: int = Field(
        2, ge=0, description="retries on connection errors, timeouts, 408/409/429 and 5xx (the openai client's rule)"
    )
    allow_private_addresses: bool = Field(
        True,
        description="let the endpoint be on loopback or a private network (a local vLLM); false: public addresses only",
    )
    allowed_addresses: list[str] = Field(
        default_factory=list,
        description="host names or CIDR blocks always let through by the SSRF guard (e.g. a link-local endpoint)",
    )
    extra_body: dict[str, Any] | None = Field(
        None,
        description=(
            "fields added to every request sent to the endpoint (e.g. {reasoning: {effort: low}}), under the request's"
            " own: NeMo Gym's openai_model's `extra_body`; null: none"
        ),
    )
    default_max_output_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "output tokens sent with a call that sets no limit (Responses max_output_tokens, chat max_tokens); null:"
            " the endpoint's own default (OpenAI's, and vLLM's and SGLang's Responses and Chat APIs: the rest of the"
            " context window)"
        ),
    )


class OpenAIModel(ModelServer):
    """Forwards to an OpenAI-compatible endpoint (see the module docstring)."""

    Config = OpenAIModelConfig
    config: OpenAIModelConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.endpoint = ServerClient(
            send_run_token=False,
            timeouts=ClientTimeouts(connect_s=cfg.connect_timeout_s, read_s=cfg.timeout_s, max_retries=cfg.max_retries),
            middlewares=[guard_middleware(allow_private=cfg.allow_private_addresses, allowed=cfg.allowed_addresses)],
            retry_if=openai_should_retry,
            trust_env=True,
        )
        self._base_url = cfg.openai_base_url.rstrip("/")
        self._auth = {"authorization": f"Bearer {cfg.openai_api_key.get_secret_value()}"}

    async def startup(self) -> None:
        # Refused addresses stop the server at start with the reason (raises BlockedAddressError), rather than
        # as an opaque connection error on each call.
        await check_url_async(
            self.config.openai_base_url,
            allow_private=self.config.allow_private_addresses,
            allowed=self.config.allowed_addresses,
        )

    async def shutdown(self) -> None:
        await self.endpoint.aclose()

    async def models(self) -> list[str]:
        return [self.config.openai_model]

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        body = {**openai_convert.strip_token_info(body), "model": self.config.openai_model}
        if self.config.default_max_output_tokens and body.get("max_output_tokens") is None:
            body["max_output_tokens"] = self.config.default_max_output_tokens
        if self.config.use_responses_api:
            return await self._post("/responses", body)
        try:
            chat_body = openai_convert.responses_to_chat(body, developer_as_system=self.config.developer_as_system)
        except openai_convert.ConversionError as exc:
            raise HTTPException(400, str(exc)) from exc
        completion = await self._post("/chat/completions", chat_body)
        return openai_convert.chat_to_response(completion, request=body)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        body = {**openai_convert.strip_token_info(body), "model": self.config.openai_model}
        if (
            self.config.default_max_output_tokens
            and body.get("max_tokens") is None
            and body.get("max_completion_tokens") is None
        ):
            body["max_tokens"] = self.config.default_max_output_tokens
        return await self._post("/chat/completions", body)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a JSON body to the endpoint; the parsed JSON answer.

        Raises:
            HTTPException: the endpoint rejected the request (4xx, passed on with its status).
            ServerTimeoutError, ServerUnavailableError, ServerHTTPError: timeout, unreachable, 5xx after retries.
            ServerBadAnswerError: a success answer that is not JSON.
            ServerError: the endpoint redirected to an address the SSRF guard refuses.
        """
        if self.config.extra_body:
            body = {**self.config.extra_body, **body}
        try:
            return await self.endpoint.request_json(
                "POST", self._base_url + path, json=body, headers=self._auth, server=self.name
            )
        except ServerHTTPError as exc:
            text = _redact(exc.body, self.config.openai_api_key.get_secret_value())[:2000]
            if 400 <= exc.status_code < 500:
                raise HTTPException(exc.status_code, f"endpoint rejected {path}: {text}") from None
            raise ServerHTTPError(
                f"{path} answered {exc.status_code}: {text}",
                status_code=exc.status_code,
                body=text,
                server=self.name,
                path=path,
            ) from None
        except BlockedAddressError as exc:  # from a redirect: the start-up check passed the endpoint's own address
            raise ServerError(f"{path}: {exc}", server=self.name, path=path) from None


def openai_should_retry(error: ServerError) -> bool:
    """The `openai` client's retry rule (`BaseClient._should_retry`, without its `x-should-retry` header): 408,
    409, 429 and every 5xx answer are retried, other statuses not; connection errors and timeouts are."""
    if isinstance(error, ServerHTTPError):
        return error.status_code in (408, 409, 429) or error.status_code >= 500
    return is_transient(error)


def _redact(text: str, secret: str) -> str:
    """`text` without `secret` (plain or JSON-escaped): some endpoints echo the API key in their error body."""
    if len(secret) < 8:  # "EMPTY" and other placeholders are no secret, and too short to replace safely
        return text
    for form in {secret, json.dumps(secret)[1:-1], json.dumps(secret)[1:-1].replace("/", "\\/")}:
        text = text.replace(form, "****")
    return text
