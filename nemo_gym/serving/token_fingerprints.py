"""What identifies the calls of a training token capture (NeMo Gym 0.7.0's `token_id_capture`; the capture itself:
`nemo_gym.serving.token_capture`): pure functions over token ids and request items, shared by the model server that
records the calls and the collector that rebuilds rollouts from them.

- `compute_digest`: a token sequence's digest (0.7.0's record digest), which links a call to its parent;
- `turn_fingerprint` (`items_fingerprint`, `message_fingerprint`): an assistant turn as a harness echoes it back (its
  text and tool calls), which names the call that answered it;
- `request_items` and `conversation_digest`: the conversation a request carries and its digest (0.7.0's
  `conversation_digest`, every turn, tool results included), which tells whether a later request continues a call's
  request unchanged or rewrote it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import orjson

from nemo_gym.common.errors import DataError
from nemo_gym.serving.openai_convert import content_text

__all__ = [
    "assistant_item_kind",
    "compute_digest",
    "conversation_digest",
    "items_fingerprint",
    "message_fingerprint",
    "prefix_digests",
    "request_items",
    "turn_fingerprint",
]

_DIGEST_DOMAIN = b"nemo-gym-tokens"


def compute_digest(token_ids: list[int]) -> str:
    """sha256 of a token sequence, NeMo Gym 0.7.0's record digest (`records.compute_digest`, digest version 1):
    the domain `nemo-gym-tokens`, then a version byte, the length and each id as big-endian unsigned 64-bit integers;
    the domain alone for an empty sequence.

    Raises:
        ValueError: a negative token id.
    """
    if not token_ids:
        return hashlib.sha256(_DIGEST_DOMAIN).hexdigest()
    if min(token_ids) < 0:
        raise ValueError(f"token ids must be non-negative, got {min(token_ids)}")
    packed = struct.pack(">BQ", 1, len(token_ids)) + struct.pack(f">{len(token_ids)}Q", *token_ids)
    return hashlib.sha256(_DIGEST_DOMAIN + packed).hexdigest()


def _canonical_arguments(raw: Any) -> Any:
    """Tool-call arguments as a value (a JSON string parsed), so that key order and spacing do not count."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw.strip()
    return raw


def turn_fingerprint(text: str, calls: list[tuple[str, Any]]) -> str:
    """sha256 of an assistant turn as a harness echoes it back: its text (outer whitespace aside) and its tool calls
    `(name, arguments)` in order, arguments compared as JSON values. Reasoning is left out (harnesses drop it)."""
    canonical = {"text": text.strip(), "calls": [[name, _canonical_arguments(args)] for name, args in calls]}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def assistant_item_kind(item: Any) -> str | None:
    """`message`, `function_call` or `reasoning` for an item of an assistant turn (a message whose role is the
    assistant's, or absent as on output items), else None."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        return kind if item.get("role", "assistant") == "assistant" else None
    return kind if kind in ("function_call", "reasoning") else None


def items_fingerprint(items: list[dict[str, Any]]) -> str:
    """`turn_fingerprint` of Responses items (assistant messages and function calls)."""
    text, calls = "", []
    for item in items:
        kind = assistant_item_kind(item)
        if kind == "message":
            text += content_text(item.get("content"))
        elif kind == "function_call":
            calls.append((str(item.get("name")), item.get("arguments")))
    return turn_fingerprint(text, calls)


def message_fingerprint(message: dict[str, Any]) -> str:
    """`turn_fingerprint` of a chat assistant message."""
    calls = [
        (str((call.get("function") or {}).get("name")), (call.get("function") or {}).get("arguments"))
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    ]
    return turn_fingerprint(content_text(message.get("content")), calls)


# -- a request's context ---------------------------------------------------------------------------------------------
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
ENVELOPE_ROLE = "_ng_request_envelope"  # 0.7.0's pseudo-turn of a request's fields that are not turns


def request_items(body: dict[str, Any], *, chat: bool) -> list[dict[str, Any]]:
    """The conversation a request carries, as NeMo Gym 0.7.0's model servers read it for lineage (`_request_messages`):
    a pseudo-turn of the prompt-shaping fields that are not turns (`instructions`, `tools`, when either is set), then
    the chat's `messages` (`chat`) or the Responses `input` items. A Responses `input` string is one user message
    here (0.7.0 takes no turn from it), so that a later request must keep it too."""
    instructions, tools = body.get("instructions"), body.get("tools")
    items: list[dict[str, Any]] = []
    if instructions or tools:
        envelope = json.dumps({"instructions": instructions, "tools": tools}, sort_keys=True, default=str)
        items.append({"role": ENVELOPE_ROLE, "content": envelope})
    turns = body.get("messages" if chat else "input")
    if isinstance(turns, str):
        turns = [{"role": "user", "content": turns}]
    return items + [turn for turn in turns if isinstance(turn, dict)] if isinstance(turns, list) else items


def conversation_digest(items: list[dict[str, Any]]) -> str:
    """sha256 of every turn of a conversation, NeMo Gym 0.7.0's `fingerprint.conversation_digest` (a later request
    continues a call only if its first items have the digest of that call's request: a history rewritten, compacted or
    with a tool result cut does not): per item its role or type, its content parts (text parts of any dialect as
    `text`, others as sorted-key JSON), its tool calls (id, name, arguments as sorted-key JSON) and its tool results
    (call id, output), each field tagged and length-delimited under the domain `nemo-gym-lineage-context`.

    Raises:
        DataError: content that is neither text nor a list of parts, or a part without a type.
    """
    return prefix_digests(items)[-1]


def prefix_digests(items: list[dict[str, Any]]) -> list[str]:
    """`conversation_digest` of each prefix of `items`, in one pass: [n + 1], the k-th that of `items[:k]` (the
    first: no item; the last: all of them).

    Raises:
        DataError: as `conversation_digest`.
    """
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    digests = [hasher.hexdigest()]
    for item in items:
        _field(hasher, 0, str(item.get("role") or item.get("type") or ""))
        for kind, payload in _content_parts(item.get("content")):
            _field(hasher, 1, kind)
            _field(hasher, 2, payload)
        for call_id, name, arguments in _tool_calls(item):
            _field(hasher, 3, call_id)
            _field(hasher, 4, name)
            _field(hasher, 5, arguments)
        for call_id, output in _tool_results(item):
            _field(hasher, 6, call_id)
            _field(hasher, 7, output)
        digests.append(hasher.hexdigest())  # hexdigest leaves the hasher as it was: the next item goes on from here
    return digests


def _field(hasher: Any, tag: int, value: str) -> None:
    encoded = value.encode()
    hasher.update(bytes([tag]) + len(encoded).to_bytes(8, "big") + encoded)


def _sorted_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise DataError(f"request content that is no JSON value: {exc}") from None


def _arguments_text(raw: Any) -> str:
    """Tool-call arguments compared as JSON values (0.7.0's `canonicalize_tool_arguments`): a JSON string parsed and
    written with sorted keys, other text stripped."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw.strip()
    return _sorted_json(raw)


def _content_parts(content: Any) -> list[tuple[str, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise DataError(f"message content must be text or a list of parts, got {type(content).__name__}")
    parts = []
    for block in content:
        if isinstance(block, str):
            parts += [("text", block)] if block else []
            continue
        if not isinstance(block, dict):
            raise DataError(f"a content part must be an object, got {type(block).__name__}")
        kind = str(block.get("type") or "")
        if kind in ("tool_use", "tool_result"):  # counted as tool calls and results
            continue
        if isinstance(block.get("text"), str) and kind in ("", "text", "input_text", "output_text"):
            parts += [("text", block["text"])] if block["text"] else []
        elif not kind:
            raise DataError("a content part has no type")
        else:
            parts.append((kind, _sorted_json(block)))
    return parts


def _tool_calls(item: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(call id, name, arguments) of a Responses function call, of Anthropic `tool_use` parts and of chat tool calls."""
    calls = []
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        name = f"{item['namespace']}__{name}" if item.get("namespace") else name
        calls.append((str(item.get("call_id") or item.get("id") or ""), name, _arguments_text(item.get("arguments"))))
    for block in item.get("content") if isinstance(item.get("content"), list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            calls.append((str(block.get("id") or ""), str(block.get("name", "")), _arguments_text(block.get("input"))))
    for call in item.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        calls.append(
            (
                str((call or {}).get("id") or ""),
                str(function.get("name", "")),
                _arguments_text(function.get("arguments")),
            )
        )
    return calls


def _tool_results(item: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id, output) of a Responses function call output, a chat tool message and Anthropic `tool_result` parts."""
    text = lambda value: value if isinstance(value, str) else _sorted_json(value)  # noqa: E731
    results = []
    if item.get("type") == "function_call_output":
        results.append((str(item.get("call_id") or item.get("id") or ""), text(item.get("output"))))
    elif item.get("role") == "tool":
        results.append((str(item.get("tool_call_id") or ""), text(item.get("content"))))
    for block in item.get("content") if isinstance(item.get("content"), list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            results.append((str(block.get("tool_use_id") or block.get("id") or ""), text(block.get("content"))))
    return results
