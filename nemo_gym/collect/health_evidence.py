"""The evidence a rollout record gives its health checks (`nemo_gym.collect.health_checks`): its capture record's
model calls flattened (`flat_calls`), the references of its turns and invocations resolved to those calls
(`Bindings`: NeMo Gym 0.7.0's rules: by `model_call_id`, else by model server and response id; a reference that
resolves to none or to several binds nothing), whether a call failed, and what the record leaves unobserved (its
gaps)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.env.capture import token_stats

__all__ = [
    "Bindings",
    "Evidence",
    "answer_has_content",
    "by_model",
    "failed",
    "has_content",
    "last_failed_call",
    "succeeded",
    "token_count",
    "usage_tokens",
]

_CALLS_INCOMPLETE = frozenset(
    {
        "model_calls_unavailable",
        "model_call_capture_incomplete",
        "model_call_capture_records_unreadable",
        "model_call_capture_unreadable",
    }
)
_TOOL_ITEMS = frozenset(
    {
        *("function_call", "tool_call", "tool_use", "mcp_call", "mcp_list_tools", "mcp_approval_request"),
        *("file_search_call", "web_search_call", "computer_call", "image_generation_call", "code_interpreter_call"),
        *("local_shell_call", "custom_tool_call"),
    }
)
_CONTENT_KEYS = (
    *("text", "content", "output_text", "answer", "refusal", "encrypted_content", "reasoning", "reasoning_content"),
    "summary",
)


def has_content(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, tuple)):
        return any(has_content(item) for item in value)
    if isinstance(value, dict):
        return any(has_content(value.get(key)) for key in _CONTENT_KEYS)
    return False


def has_tool_call(item: Any) -> bool:
    if isinstance(item, (list, tuple)):
        return any(has_tool_call(value) for value in item)
    return isinstance(item, dict) and (item.get("type") in _TOOL_ITEMS or bool(item.get("tool_calls")))


def ref_key(ref: Any) -> str | None:
    """`call:<id>`, else `response:<type>:<name>:<response id>`; None for a reference with neither."""
    if not isinstance(ref, dict):
        return None
    if ref.get("model_call_id"):
        return f"call:{ref['model_call_id']}"
    model = ref.get("model_ref")
    if isinstance(model, dict) and ref.get("response_id"):
        return f"response:{model.get('type')}:{model.get('name')}:{ref['response_id']}"
    return None


def signature(ref: dict[str, Any]) -> tuple[str, str, str, str]:
    model = ref.get("model_ref") if isinstance(ref.get("model_ref"), dict) else {}
    return (
        str(ref.get("model_call_id") or ""),
        str(model.get("type") or ""),
        str(model.get("name") or ""),
        str(ref.get("response_id") or ""),
    )


def flat_calls(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's model calls, flattened: position, ids, status, tokens in and out, request and answer."""
    calls = []
    for position, raw in enumerate(trajectory.get("model_calls") or []):
        metadata, tokens = raw.get("response_metadata") or {}, raw.get("token_stats") or {}
        calls.append(
            {
                "call_index": position,
                "started_at": raw.get("started_at"),
                "model_call_id": raw.get("model_call_id"),
                **{key: metadata.get(key) for key in ("response_id", "model_ref", "status_code", "response_status")},
                **{key: metadata.get(key) for key in ("finish_reason", "error_category")},
                "tokens_in": tokens.get("prompt_tokens"),
                "tokens_out": tokens.get("completion_tokens"),
                "request": raw.get("request"),
                "response": raw.get("response"),
            }
        )
    return calls


def failed(call: dict[str, Any]) -> bool:
    status, answer_status = call.get("status_code"), call.get("response_status")
    return (
        (isinstance(status, int) and status >= 400)
        or bool(call.get("error_category"))
        or answer_status in ("failed", "error", "cancelled")
    )


def succeeded(call: dict[str, Any]) -> bool:
    status = call.get("status_code")
    return not failed(call) and (status is None or (isinstance(status, int) and 200 <= status < 400))


@dataclass(frozen=True)
class Bindings:
    """References (deduplicated) resolved to the calls: those that resolved to exactly one call (`matched`, each once,
    in record order), those that resolved to none, and those that resolved to several (with how many)."""

    references: tuple[str, ...]
    matched: tuple[dict[str, Any], ...]
    missing: tuple[str, ...]
    duplicated: tuple[tuple[str, int], ...]

    @property
    def complete(self) -> bool:
        return bool(self.references) and not self.missing and not self.duplicated


def references(items: Any) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for item in items or []:
        for ref in (item.get("model_calls") or []) if isinstance(item, dict) else []:
            if isinstance(ref, dict) and (key := ref_key(ref)) is not None:
                found.append((key, ref))
    return found


def unique(refs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The references, each (model call id, model server, response id) once, first first."""
    seen: set[tuple[str, str, str, str]] = set()
    kept = []
    for key, ref in refs:
        if (key_of_ref := signature(ref)) not in seen:
            seen.add(key_of_ref)
            kept.append((key, ref))
    return kept


def resolve(ref: dict[str, Any], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if ref.get("model_call_id"):
        return [
            call
            for call in calls
            if call.get("model_call_id") == ref["model_call_id"]
            and (ref.get("model_ref") is None or ref["model_ref"] == call.get("model_ref"))
            and (ref.get("response_id") is None or ref["response_id"] == call.get("response_id"))
        ]
    key = signature({"model_ref": ref.get("model_ref"), "response_id": ref.get("response_id")})
    return [
        call
        for call in calls
        if isinstance(call.get("model_ref"), dict)
        and call.get("response_id")
        and signature({"model_ref": call["model_ref"], "response_id": call["response_id"]}) == key
    ]


def bind(refs: list[tuple[str, dict[str, Any]]], calls: list[dict[str, Any]]) -> Bindings:
    matched: dict[int, dict[str, Any]] = {}
    missing, duplicated = [], []
    for key, ref in refs:
        found = resolve(ref, calls)
        if not found:
            missing.append(key)
        elif len(found) > 1:
            duplicated.append((key, len(found)))
        else:
            matched.setdefault(found[0]["call_index"], found[0])
    ordered = tuple(matched[index] for index in sorted(matched))
    return Bindings(tuple(key for key, _ in refs), ordered, tuple(missing), tuple(duplicated))


def usage_tokens(record: dict[str, Any]) -> tuple[int | None, int | None]:
    """The rollout response's prompt and completion tokens (`token_stats` of its `usage`; None: not given)."""
    response = record.get("response")
    stats = token_stats(response.get("usage") if isinstance(response, dict) else None)
    return stats["prompt_tokens"], stats["completion_tokens"]


def token_count(call: dict[str, Any], key: str) -> int:
    value = call.get(key)
    return value if type(value) is int and value >= 0 else 0


def by_model(calls: Sequence[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    chains: dict[Any, list[dict[str, Any]]] = {}
    for call in calls:
        ref = call.get("model_ref")
        chains.setdefault((ref.get("type"), ref.get("name")) if isinstance(ref, dict) else None, []).append(call)
    return chains


def last_failed_call(chain: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The model's last call when it failed: every call failed, or the last by start time (unordered: None)."""
    failures = [call for call in chain if failed(call)]
    if not failures:
        return None
    ordered = sorted(chain, key=lambda call: (call.get("started_at") or 0.0, call.get("call_index") or 0))
    if len(failures) == len(chain):
        return ordered[-1]
    if any(call.get("started_at") is None for call in chain):
        return None
    return ordered[-1] if failed(ordered[-1]) else None


def answer_has_content(response: Any) -> bool:
    if not isinstance(response, dict):
        return False
    if has_content(response.get("output_text")) or has_content(response.get("content")):
        return True
    choices = [choice for choice in response.get("choices") or [] if isinstance(choice, dict)]
    chat = any(has_content(c.get("text")) or has_content((c.get("message") or {}).get("content")) for c in choices)
    return has_content(response.get("output")) or chat


def has_gap(trajectory: dict[str, Any], codes: frozenset[str] | set[str]) -> bool:
    return any(isinstance(gap, dict) and gap.get("code") in codes for gap in trajectory.get("gaps") or [])


@dataclass
class Evidence:
    """What one record shows: the record, its capture record (normalized; {} when absent or unreadable), the
    model calls flattened, the bindings of the turns' references and of every reference, and what was observed."""

    record: dict[str, Any]
    subject: dict[str, Any]
    trajectory: dict[str, Any] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)
    turn_bindings: Bindings = Bindings((), (), (), ())
    owned: Bindings = Bindings((), (), (), ())
    observed: bool = False  # a capture record that projected
    turns_observed: bool = False
    calls_observed: bool = False  # every model call captured
    turn_scope_complete: bool = False  # the turns reference every policy call

    @classmethod
    def of(cls, record: dict[str, Any], subject: dict[str, Any], trajectory: dict[str, Any] | None) -> Evidence:
        if trajectory is None or has_gap(trajectory, {"trajectory_projection_failed"}):
            return cls(record, subject)
        calls = flat_calls(trajectory)
        turn_refs = unique(references(trajectory.get("turns")))
        return cls(
            record,
            subject,
            trajectory,
            calls,
            bind(turn_refs, calls),
            bind(unique([*turn_refs, *references(trajectory.get("invocations"))]), calls),
            observed=True,
            turns_observed=not has_gap(trajectory, {"turns_unavailable"}),
            calls_observed=not has_gap(trajectory, _CALLS_INCOMPLETE),
            turn_scope_complete=not has_gap(trajectory, {"turn_model_call_scope_incomplete"}),
        )

    def steps(self) -> list[tuple[dict[str, Any], bool, bool, bool]]:
        """Per turn: its locator, whether it has a message (or reasoning), a tool call, a model call reference."""
        return [
            (
                {"turn": turn.get("turn_no", position)},
                has_content(turn.get("answer")) or has_content(turn.get("reasoning_content")),
                has_tool_call(turn.get("answer")),
                bool(references([turn])),
            )
            for position, turn in enumerate(self.trajectory.get("turns") or [])
        ]
