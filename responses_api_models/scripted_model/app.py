"""scripted_model: a deterministic policy for tests and benchmarks, no weights.

Script, per call: if the request has function tools and fewer than `max_tool_rounds` rounds of tool outputs
are in its input, call every tool once (arguments from `tool_arguments`, else a value per required property); otherwise
answer with the first rule whose regex matches the last user message, else `default_reply`. `delay_s` adds a fixed
latency (seconds). Ids are a hash of the request, so equal requests give equal answers.

Per-request script (an expert that follows the task row): when the request's `metadata` holds `script_key`
(default `script`), its value is a JSON list of model turns, `{"tool_calls": [{"name", "arguments"}, ...]}` or
`{"text": ...}` or `{"error_status": <HTTP status>}` (that call fails so), and call k of the rollout (k = the model
turns already in the input) plays turn k (past the end: `default_reply`). The agent forwards
`responses_create_params` unchanged, so a row can carry its own expert (e.g.
`resources_servers/tool_calculator/tasks.py: expert_row`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel, Field

from nemo_gym.env.trajectory import count_model_turns, with_message_types
from nemo_gym.model_servers.model_server import ModelServer
from nemo_gym.serving.openai_convert import messages_to_input_items
from nemo_gym.serving.server import ServerConfig


class Rule(BaseModel):
    match: str = Field(description="regular expression searched in the last user message")
    reply: str = Field(description="assistant text to answer with")


class ScriptedModelConfig(ServerConfig):
    model_name: str = Field("scripted", description="name reported in answers and /v1/models")
    default_reply: str = Field("\\boxed{A}", description="answer when no rule matches")
    rules: list[Rule] = Field(default_factory=list, description="(regex, reply) pairs tried in order")
    tool_arguments: dict[str, dict[str, Any]] = Field(default_factory=dict, description="arguments per tool name")
    raw_tool_arguments: dict[str, str] = Field(
        default_factory=dict, description="arguments text per tool name, sent verbatim (e.g. invalid JSON)"
    )
    max_tool_rounds: int = Field(1, ge=0, description="model calls that call tools before answering with text")
    delay_s: float = Field(0.0, ge=0, description="latency added to every call, seconds")
    error_status: int | None = Field(
        None, description="answer every call with this HTTP error status (a failing endpoint)"
    )
    script_key: str = Field(
        "script", description="metadata key of a per-request script (a JSON list of turns; see the module docstring)"
    )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def _default_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool.get("parameters") or {}
    values = {"string": "San Francisco", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    return {
        name: values.get(spec.get("type"), None)
        for name, spec in (params.get("properties") or {}).items()
        if name in params.get("required", [])
    }


class ScriptedModel(ModelServer):
    Config = ScriptedModelConfig
    config: ScriptedModelConfig

    async def models(self) -> list[str]:
        return [self.config.model_name]

    def reply_text(self, messages: list[dict[str, Any]]) -> str:
        users = [m for m in messages if m.get("role") == "user"]
        last = _text_of(users[-1].get("content")) if users else ""
        for rule in self.config.rules:
            if re.search(rule.match, last):
                return rule.reply
        return self.config.default_reply

    def _arguments(self, tool: dict[str, Any]) -> str:
        if tool["name"] in self.config.raw_tool_arguments:
            return self.config.raw_tool_arguments[tool["name"]]
        return json.dumps(self.config.tool_arguments.get(tool["name"], _default_arguments(tool)))

    async def _delay_or_fail(self) -> None:
        await asyncio.sleep(self.config.delay_s)
        if self.config.error_status:
            raise HTTPException(self.config.error_status, "scripted failure (error_status is set)")

    def scripted_turn(self, body: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any] | None:
        """This call's turn of the request's script (None: the request has no script).

        Raises:
            HTTPException: 400 when the script is not a JSON list of turns.
        """
        raw = (body.get("metadata") or {}).get(self.config.script_key)
        if raw is None:
            return None
        try:
            script = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(script, list) or not all(isinstance(turn, dict) for turn in script):
                raise ValueError("not a list of objects")
        except ValueError as exc:
            raise HTTPException(400, f"metadata.{self.config.script_key} must be a JSON list of turns: {exc}") from exc
        turn = count_model_turns(with_message_types(items))  # the model calls already made in this rollout
        return script[turn] if turn < len(script) else {"text": self.config.default_reply}

    def tool_calls(
        self, body: dict[str, Any], items: list[dict[str, Any]], scripted: dict[str, Any] | None
    ) -> list[tuple[str, str]]:
        """The `(name, arguments JSON)` of each tool call this turn makes: the script's turn's `tool_calls`; without a
        script, one call of every function tool of the request while fewer than `max_tool_rounds` rounds of calls
        were answered; none when the turn answers with text."""
        if scripted is not None:
            return [(c["name"], json.dumps(c.get("arguments") or {})) for c in scripted.get("tool_calls") or []]
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        rounds = sum(1 for i in items if i.get("type") == "function_call_output") // max(1, len(tools))
        return [(t["name"], self._arguments(t)) for t in tools] if rounds < self.config.max_tool_rounds else []

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        await self._delay_or_fail()
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        scripted = self.scripted_turn(body, items)
        if scripted is not None and isinstance(scripted.get("error_status"), int):
            raise HTTPException(scripted["error_status"], "scripted failure (the script's turn)")
        calls = self.tool_calls(body, items, scripted)
        if calls:
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{digest}_{n}",
                    "call_id": f"call_{digest}_{n}",
                    "name": name,
                    "arguments": arguments,
                    "status": "completed",
                }
                for n, (name, arguments) in enumerate(calls)
            ]
        else:
            text = (
                str(scripted["text"])
                if scripted is not None and "text" in scripted
                else self.reply_text([i for i in items if i.get("type", "message") == "message"])
            )
            output = [
                {
                    "type": "message",
                    "id": f"msg_{digest}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        return {
            "id": f"resp_{digest}",
            "object": "response",
            "created_at": time.time(),
            "model": self.config.model_name,
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "error": None,
            "incomplete_details": None,
            "usage": {
                "input_tokens": 1,
                "output_tokens": 1,
                "total_tokens": 2,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """The same script over Chat Completions: tool calls as the Responses route makes them (the chat tools and
        messages read as Responses tools and items), else the reply text."""
        await self._delay_or_fail()
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        messages = body.get("messages") or []
        items = messages_to_input_items(messages)
        tools = [{"type": "function", **t["function"]} for t in body.get("tools") or [] if t.get("type") == "function"]
        calls = self.tool_calls({**body, "tools": tools}, items, self.scripted_turn(body, items))
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else self.reply_text(messages)}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{digest}_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
                for n, (name, arguments) in enumerate(calls)
            ]
        return {
            "id": f"chatcmpl-{digest}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop", "message": message}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
