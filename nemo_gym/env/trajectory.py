"""A typed, read-only view of a rollout's trajectory: what a verifier reads out of a Responses `Response`.

A rollout's `response.output` is a list of Responses API items (`message`, `reasoning`, `function_call`,
`function_call_output`, ...). Rather than walk it by hand, a verifier builds the view once:

    view = Trajectory.of(request.response)
    submit = view.last_call("submit_answer")     # the last call of that tool, or None
    if submit is not None and submit.arguments is not None:
        answer = submit.arguments.get("answer")   # the arguments, parsed; None when their JSON is bad
    text = strip_thinking(view.final_text)       # the last assistant message's text (nemo_gym.env.answers)

Model output is untrusted: items and parts of unexpected shape are skipped, arguments that are not a JSON
object are kept as their raw text with a parse error, and a tool output whose call is missing is kept apart
(`orphan_outputs`), so building the view never raises on a dict. The texts follow `nemo_gym.env.answers`: a
message's text is its `output_text` parts joined (`message_output_text`); the final text is `last_assistant_text`.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from nemo_gym.env.answers import last_assistant_text, message_output_text

__all__ = ["FunctionCall", "Message", "ToolOutput", "Trajectory", "count_model_turns", "with_message_types"]

_MODEL_ITEMS = ("function_call", "reasoning")  # besides assistant messages: items the model wrote


@dataclass(frozen=True)
class ToolOutput:
    """A `function_call_output` item: what a tool answered."""

    index: int  # position of the item in `response.output`
    call_id: str | None  # the `call_id` it answers; None when the item has none (or not a string)
    # its `output` as text: a string as is, anything else (content parts, an object) as JSON; '' when absent or null
    text: str


@dataclass(frozen=True)
class FunctionCall:
    """A `function_call` item: a tool call the model made, with its arguments parsed and its tool output.

    `arguments` is the parsed JSON object of `arguments_text`: `{}` when the item has no arguments or an empty
    string (a call of a tool without parameters), None when they are not a JSON object (bad JSON, a list, a
    number, or `arguments` not a string), with `arguments_error` saying why.
    """

    index: int  # position of the item in `response.output`
    name: str  # the tool's name; '' when the item has none (or not a string)
    call_id: str | None  # None when the item has none (or not a string)
    arguments_text: str  # the raw `arguments` string ('' when absent or not a string)
    arguments: dict[str, Any] | None  # the parsed object (a fresh dict per view); None when unparsable
    arguments_error: str | None  # why `arguments` is None; None when they parsed
    output: (
        ToolOutput | None
    )  # the tool output answering this call (same `call_id`, after it: `_pair_outputs`); None when none does


@dataclass(frozen=True)
class Message:
    """A `message` item."""

    index: int  # position of the item in `response.output`
    role: str  # `role`; 'assistant' when the item has none, '' when it is not a string
    text: str  # its `output_text` parts joined (`nemo_gym.env.answers.message_output_text`); '' when it has none


@dataclass(frozen=True)
class Trajectory:
    """The view of one `response` (module docstring). Every tuple is in `response.output` order."""

    function_calls: tuple[FunctionCall, ...]  # every function call, each with its tool output if any
    tool_outputs: tuple[ToolOutput, ...]  # every tool output, matched or not
    orphan_outputs: tuple[ToolOutput, ...]  # tool outputs that answer no function call before them
    messages: tuple[Message, ...]  # every message item, any role
    final_text: str  # the last assistant message with text (`nemo_gym.env.answers.last_assistant_text`); '' when none
    # the reasoning items' text, one item a line: each its `content` parts, or its `summary` parts when it has no
    # content text
    reasoning_text: str
    # runs of model items (assistant messages, reasoning, function calls) between tool outputs and other roles' messages
    model_turns: int

    @classmethod
    def of(cls, response: dict[str, Any]) -> Trajectory:
        """The view of a Responses `Response` dict; an `output` that is missing or not a list gives an empty view.

        Raises:
            TypeError: `response` is not a dict.
        """
        if not isinstance(response, dict):
            raise TypeError(f"a Responses Response must be a dict, got {type(response).__name__}")
        output = response.get("output")
        items = [
            (index, item)
            for index, item in enumerate(output if isinstance(output, list) else [])
            if isinstance(item, dict)
        ]
        outputs, matched = _pair_outputs(items)
        answered = {out.index for out in matched.values()}
        messages = [
            Message(index, _role(item), message_output_text(item) or "")
            for index, item in items
            if item.get("type") == "message"
        ]
        return cls(
            function_calls=tuple(
                _function_call(index, item, matched.get(index))
                for index, item in items
                if item.get("type") == "function_call"
            ),
            tool_outputs=tuple(outputs),
            orphan_outputs=tuple(out for out in outputs if out.index not in answered),
            messages=tuple(messages),
            final_text=last_assistant_text(response),
            reasoning_text="\n".join(
                text for _, item in items if item.get("type") == "reasoning" and (text := _reasoning_text(item))
            ),
            model_turns=count_model_turns(item for _, item in items),
        )

    @property
    def output_text(self) -> str:
        """The text of every message item, any role, joined with nothing between (as the openai package's
        `Response.output_text`)."""
        return "".join(message.text for message in self.messages)

    def calls_named(self, name: str) -> tuple[FunctionCall, ...]:
        """The calls of tool `name`, in order."""
        return tuple(call for call in self.function_calls if call.name == name)

    def last_call(self, name: str) -> FunctionCall | None:
        """The last call of tool `name`, or None when there is none."""
        calls = self.calls_named(name)
        return calls[-1] if calls else None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _role(item: dict[str, Any]) -> str:
    role = item.get("role", "assistant")
    return role if isinstance(role, str) else ""


def _tool_output(index: int, item: dict[str, Any]) -> ToolOutput:
    output = item.get("output")
    try:
        text = (
            output
            if isinstance(output, str)
            else ""
            if output is None
            else json.dumps(output, ensure_ascii=False, default=str)
        )
    except (ValueError, RecursionError):  # a circular or too deeply nested object
        text = ""
    return ToolOutput(index, _string(item.get("call_id")), text)


def _pair_outputs(items: list[tuple[int, dict[str, Any]]]) -> tuple[list[ToolOutput], dict[int, ToolOutput]]:
    """(every tool output, call index -> the tool output answering it) of `(index, item)` pairs in order: an
    output answers the earliest call before it with its `call_id` that no output answered yet (some servers
    number call ids per turn, so ids can repeat; outputs come in call order)."""
    outputs: list[ToolOutput] = []
    matched: dict[int, ToolOutput] = {}
    waiting: dict[str, deque[int]] = {}  # call_id -> indices of its calls not answered yet
    for index, item in items:
        call_id = _string(item.get("call_id"))
        if item.get("type") == "function_call" and call_id is not None:
            waiting.setdefault(call_id, deque()).append(index)
        elif item.get("type") == "function_call_output":
            outputs.append(out := _tool_output(index, item))
            if call_id is not None and waiting.get(call_id):
                matched[waiting[call_id].popleft()] = out
    return outputs, matched


def _parse_arguments(raw: Any) -> tuple[str, dict[str, Any] | None, str | None]:
    """(raw text, parsed object or None, error or None) of a function call's `arguments`."""
    if raw is None or raw == "":
        return "", {}, None
    if not isinstance(raw, str):
        return "", None, f"arguments must be a JSON string, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        return raw, None, f"arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return raw, None, f"arguments must be a JSON object, got {type(value).__name__}"
    return raw, value, None


def _function_call(index: int, item: dict[str, Any], output: ToolOutput | None) -> FunctionCall:
    text, arguments, error = _parse_arguments(item.get("arguments"))
    return FunctionCall(
        index, _string(item.get("name")) or "", _string(item.get("call_id")), text, arguments, error, output
    )


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's `content` parts' text joined, or its `summary` parts' when the content has none."""
    for key in ("content", "summary"):
        parts = item.get(key) if isinstance(item.get(key), list) else []
        text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
        if text:
            return text
    return ""


def with_message_types(items: Any) -> list[dict[str, Any]]:
    """The dict items of `items`, each message written without its `type` (a `role` and no `type`: an easy input
    message, as in a request's `input`) typed as a `message`; other items unchanged. For `count_model_turns` on
    items that are not all typed."""
    items = [item for item in items if isinstance(item, dict)]
    return [item if item.get("type") or "role" not in item else {**item, "type": "message"} for item in items]


def count_model_turns(items: Any) -> int:
    """The number of runs of model items (assistant messages, reasoning, function calls) in `items` (Responses
    output item dicts), i.e. the model calls that wrote them: a tool output or a message of another role ends a
    run; other item types neither start nor end one."""
    turns, in_turn = 0, False
    for item in items:
        kind = item.get("type")
        if kind in _MODEL_ITEMS or (kind == "message" and _role(item) == "assistant"):
            turns += not in_turn
            in_turn = True
        elif kind in ("function_call_output", "message"):
            in_turn = False
    return turns
