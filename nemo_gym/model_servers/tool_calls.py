"""Tool calls as text, in the Hermes format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`).

Used by `vllm_model` for models whose chat template has no tool support (the embedded SmolLM2's template
knows only `role` and string `content`). Before tokenizing, `render_tool_messages` turns a chat with tools
into plain-text messages, as Qwen2.5/Hermes templates do:

- the tool signatures go into the system prompt (a `<tools>` block; a system message is added if absent);
- an assistant message's `tool_calls` become `<tool_call>` blocks after its text;
- `role: tool` results become one `user` message of `<tool_response>` blocks (consecutive results merge).

When a call is required (`tool_choice` `required` or a named function), generation can be constrained to
the JSON schema of one call (`forced_call_schema`) and its text read back with `parse_forced_call`.

After generation, `parse_tool_calls(text)` finds the `<tool_call>` blocks again. A block whose JSON does
not parse (or has no `name`) is left in the text: the model's malformed output stays visible to the
verifier instead of being silently dropped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = [
    "tools_system_prompt",
    "render_tool_messages",
    "parse_tool_calls",
    "format_tool_call",
    "forced_call_schema",
    "parse_forced_call",
]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _tool_call_blocks(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, stripped content) of each `<tool_call>...</tool_call>` of `text`, the last one possibly left
    open to the end of the text. Literal searches, linear in the text: model output is untrusted (a lazy regex
    with `\\s*` on both sides of the content is quadratic on a long run of whitespace)."""
    position = 0
    while (start := text.find(_OPEN, position)) != -1:
        close = text.find(_CLOSE, start + len(_OPEN))
        end = len(text) if close == -1 else close + len(_CLOSE)
        yield start, end, text[start + len(_OPEN) : len(text) if close == -1 else close].strip()
        position = end


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The `# Tools` section listing chat tools (`{"type": "function", "function": {...}}`) for a system prompt."""
    signatures = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with"
        f" function signatures within <tools></tools> XML tags:\n<tools>\n{signatures}\n</tools>\n\nFor each function"
        " call, return a json object with function name and arguments within <tool_call></tool_call> XML"
        ' tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def format_tool_call(call: dict[str, Any]) -> str:
    """One chat tool call as a `<tool_call>` block (arguments as a JSON object when they parse)."""
    function = call.get("function") or {}
    arguments: Any = function.get("arguments") or "{}"
    try:
        arguments = json.loads(arguments)
    except (TypeError, ValueError):
        pass
    return (
        "<tool_call>\n"
        + json.dumps({"name": function.get("name", ""), "arguments": arguments}, ensure_ascii=False)
        + "\n</tool_call>"
    )


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def render_tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat messages (with tools, tool calls and tool results) → plain `{role, content: str}` messages.

    Extra keys of a message (e.g. training token fields) are kept.
    """
    rendered: list[dict[str, Any]] = []
    for message in messages:
        extra = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls", "tool_call_id", "name")}
        role = message.get("role")
        if role == "tool":
            block = f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"
            previous = rendered[-1] if rendered else None
            if previous is not None and previous.get("_tool_results"):
                previous["content"] += "\n" + block
            else:
                rendered.append({"role": "user", "content": block, "_tool_results": True})
            continue
        content = _text(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            blocks = [format_tool_call(call) for call in message["tool_calls"]]
            content = "\n".join(([content] if content else []) + blocks)
        rendered.append({**extra, "role": role, "content": content})
    for message in rendered:
        message.pop("_tool_results", None)
    if tools:
        prompt = tools_system_prompt(tools)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {
                **rendered[0],
                "content": f"{rendered[0]['content']}\n\n{prompt}" if rendered[0]["content"] else prompt,
            }
        else:
            rendered.insert(0, {"role": "system", "content": prompt})
    return rendered


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split generated text into (content, chat tool calls).

    Returns the text without its well-formed `<tool_call>` blocks (None when nothing else is left) and the
    calls as `{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}`. A last block
    cut off before `</tool_call>` (e.g. at the token limit) is parsed when its JSON is complete.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for start, end, content in _tool_call_blocks(text):
        call = _parse_call(content)
        if call is None:
            continue
        kept.append(text[position:start])
        position = end
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None), calls


def _parse_call(raw: str) -> dict[str, Any] | None:
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": payload["name"], "arguments": arguments},
    }


def forced_call_schema(tools: list[dict[str, Any]], tool_choice: Any) -> dict[str, Any] | None:
    """JSON schema of one call `{"name": ..., "arguments": {...}}` to constrain generation, or None.

    `tool_choice` `required` allows any of `tools`; `{"type": "function", "function": {"name": X}}` only X.
    """
    if tool_choice == "required":
        allowed = tools
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        allowed = [t for t in tools if (t.get("function") or {}).get("name") == name]
    else:
        return None
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in allowed
    ]
    if not variants:
        return None
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def parse_forced_call(text: str) -> dict[str, Any] | None:
    """The chat tool call in text generated under `forced_call_schema` (None when it does not parse)."""
    return _parse_call(text.strip())
