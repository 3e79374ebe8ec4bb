"""openai_client_agent: the tool loop as a harness outside the gym writes it, on the `openai` package's
`AsyncOpenAI` Chat Completions client, the conversation kept as plain chat messages (role, content, tool_calls).

Each `/run` is one rollout: seed the resources server's session, then call the policy model's
`/v1/chat/completions` through the client, execute each tool call against the resources server (same session), append
the tool's answer as a `tool` message, until the model answers without a tool call (`completed`), hits `max_steps`,
or stops on its output limit (`max_tokens`); then `/verify` the conversation as a Responses object (`output`: the
assistant turns and tool outputs; `id`: the last completion's). Bad tool arguments and tool errors go back to the
model as text; a failed model call or `/verify` fails the rollout, typed, never a reward of 0.

Like most harnesses, it keeps only the OpenAI fields of each answer, so the token ids the model server returns are not
in its rollouts. It is trained on with training token capture (NeMo Gym 0.7.0's `token_id_capture`): with `ng_run
+token_id_capture.enabled=true` and `token_id_capture: true` in this agent's config, the client's base URL is the
model server's capture prefix for the rollout (`/ng-rollout/<id>/training-token-capture/v1`), the model server
records each call with its token ids (`nemo_gym.serving.token_capture`) and the collector rebuilds the rollout's
output from them (`nemo_gym.collect.token_capture`). Any loop on an OpenAI client can be made trainable this way:
give it that base URL.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai

from nemo_gym.common.errors import ServerError, ServerHTTPError, ServerTimeoutError, ServerUnavailableError
from nemo_gym.env.agent_server import AgentServer, ToolLoopConfig
from nemo_gym.env.episode import EndedEpisode, StopReason, failed_run_answer, run_answer
from nemo_gym.env.tool_routes import ToolRoutes, call_function_tool
from nemo_gym.serving.openai_convert import ConversionError, messages_to_input_items, responses_to_chat

# Chat Completions create fields the client takes as arguments; the others of a converted body go in `extra_body`
_CLIENT_FIELDS = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "tools", "tool_choice", "seed", "stop"}


class OpenAIClientAgent(AgentServer):
    Config = ToolLoopConfig
    config: ToolLoopConfig

    async def run(self, row: dict[str, Any]) -> Any:
        """The verify answer of one rollout of `row`, or its typed failure answer (`failed_run_answer`)."""
        session_id, cookies = uuid.uuid4().hex, httpx.Cookies()
        resources = self.config.resources_server.name
        await self.client.post(resources, "/seed_session", row, session_id=session_id, cookies=cookies)
        tools = ToolRoutes(self.client, resources, session_id, cookies)
        verified = None
        try:
            try:
                response, stop_reason = await self.loop(row, tools)
            except ServerError as exc:
                return failed_run_answer(exc, None)
            ended = EndedEpisode(row, response, stop_reason)
            try:
                verified = await self.client.post(
                    resources,
                    "/verify?close_session=true",
                    {**row, "response": response},
                    session_id=session_id,
                    cookies=cookies,
                )
            except ServerError as exc:
                return failed_run_answer(exc, None, ended)
        finally:
            if verified is None:  # the session is still open
                try:
                    await self.client.post(
                        resources, "/close_session", {}, session_id=session_id, cookies=cookies, timeout_s=10
                    )
                except Exception:  # best effort
                    pass
        return run_answer(verified, ended, None)

    async def openai_client(self, row: dict[str, Any]) -> openai.AsyncOpenAI:
        """An `AsyncOpenAI` client of the policy model, for `row`'s rollout: its base URL under the training token
        capture prefix when this agent's rollouts are captured (`model_path`), the run token in its headers."""
        name = self.config.model_server.name
        base_url = (await self.client.server_url(name)).rstrip("/")
        return openai.AsyncOpenAI(
            base_url=base_url + self.model_path(row, "/v1"),
            api_key="unused",  # the run token goes in the headers; the model servers take no API key
            default_headers=await self.client.call_headers(name),
            timeout=self.config.model_timeout_s,
            max_retries=0,
        )

    async def loop(self, row: dict[str, Any], tools: ToolRoutes) -> tuple[dict[str, Any], StopReason]:
        """Run the episode; returns the Responses object to verify and how the episode ended.

        Raises:
            ServerError: a model call failed (its HTTP status, a timeout, no connection), or the row's
                `responses_create_params` has no Chat Completions equivalent (400).
        """
        try:
            body = responses_to_chat(row["responses_create_params"])
        except ConversionError as exc:
            raise ServerHTTPError(f"responses_create_params: {exc}", status_code=400, body=str(exc)) from None
        messages: list[dict[str, Any]] = body.pop("messages")
        first = len(messages)
        arguments = {key: body.pop(key) for key in list(body) if key in _CLIENT_FIELDS}
        model = body.pop("model", None) or "policy"
        tool_names = {t["function"]["name"] for t in arguments.get("tools") or []}
        client = await self.openai_client(row)
        last_id, stop_reason = None, StopReason.max_steps
        async with client:
            for _ in range(self.config.max_steps):
                completion = await self._create(client, model=model, messages=messages, extra_body=body, **arguments)
                last_id, choice = completion.id, completion.choices[0]
                # what a harness keeps of an answer: the OpenAI fields, not the model server's token ids
                message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
                calls = choice.message.tool_calls or []
                if calls:
                    message["tool_calls"] = [call.model_dump(include={"id", "type", "function"}) for call in calls]
                messages.append(message)
                if choice.finish_reason == "length":
                    stop_reason = StopReason.max_tokens
                    break
                if not calls:
                    stop_reason = StopReason.completed
                    break
                for call in calls:
                    text, problem = await call_function_tool(
                        tools, call.function.name, call.function.arguments, tool_names, self.config.tool_timeout_s
                    )
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
                    stop_reason = problem or StopReason.max_steps
        output = messages_to_input_items(messages[first:])
        return {"id": last_id, "object": "response", "model": model, "status": "completed", "output": output}, (
            stop_reason
        )

    async def _create(self, client: openai.AsyncOpenAI, **request: Any) -> Any:
        """`client.chat.completions.create(**request)`, its errors as the gym's typed server errors."""
        server = self.config.model_server.name
        try:
            return await client.chat.completions.create(**request)
        except openai.APIStatusError as exc:
            raise ServerHTTPError(
                f"{server}: HTTP {exc.status_code}: {exc.message}",
                status_code=exc.status_code,
                body=exc.response.text,
                server=server,
                path="/v1/chat/completions",
            ) from None
        except openai.APITimeoutError:
            raise ServerTimeoutError(
                f"{server}: no answer in {self.config.model_timeout_s} s", server=server, path="/v1/chat/completions"
            ) from None
        except openai.APIConnectionError as exc:
            raise ServerUnavailableError(f"{server}: {exc}", server=server, path="/v1/chat/completions") from None
