"""Training token capture (NeMo Gym 0.7.0's `token_id_capture`): a model server records each model call of a rollout
with its token ids and log-probs, so that a rollout whose agent drops them can still be trained on. An agent that
keeps its conversation as plain OpenAI messages (its own loop on the `openai` client, LangChain, a coding harness)
loses the `prompt_token_ids` / `generation_token_ids` / `generation_log_probs` our model servers put on each answer.

An agent that takes part calls its model server under `/ng-rollout/<rollout id>/training-token-capture/`
(`CAPTURE_SEGMENT`; e.g. `.../v1/chat/completions`). For such a call the model server
(`nemo_gym.model_servers.model_server.ModelServer`):

1. finds the call's parent: the earlier call of the same rollout whose answer is the request's last assistant turn,
   by its token ids when the turn carries them, else by its text and tool calls (`turn_fingerprint`) and only if the
   history before that turn is that call's request, unchanged (`conversation_digest`, 0.7.0's context check). The
   parent's token ids go back on that turn (`resolve_parent`), so the model server splices the prompt after the
   tokens the policy sampled instead of re-tokenizing their text: no drift between the calls of one rollout. A history
   the harness rewrote, compacted or cut gets nothing back (splicing would bring back what it removed): the call is
   rendered as sent and recorded `unresolved`.
2. answers as usual and appends the call's record to `<dir>/<rollout id>.tokens.jsonl` (`TokenCaptureStore`, NeMo Gym
   0.7.0's file store layout and its `TokenEntry` schema version 1: prompt and generation ids, log-probs, the answer's
   output items without the token fields, the parent and its resolution, the cumulative length and digest, the
   request's context length and digest). A call
   whose answer carries no token ids is recorded in `<rollout id>.tokens.incomplete` instead: the rollout cannot be
   rebuilt whole.

The collector rebuilds each rollout from its records (`nemo_gym.collect.token_capture`). `ng_run
+token_id_capture.enabled=true` turns capture on for a run (`TokenIdCaptureSettings`); every server process of the
run gets the settings in the `NEMO_GYM_TOKEN_ID_CAPTURE` environment variable (`settings_from_env`).

Where we depart from 0.7.0: one writer, the file store (0.7.0's custom sinks, lineage stores, delta records and
external staging are refused by name); the parent is named by the last assistant turn's fingerprint alone (0.7.0's
covers every assistant turn of the request; both then check the request's context).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import parse_line
from nemo_gym.serving.openai_convert import TOKEN_INFO_KEYS, chat_to_response, token_info
from nemo_gym.serving.rollout_prefix import ROLLOUT_ID_PATTERN
from nemo_gym.serving.token_fingerprints import (
    assistant_item_kind,
    compute_digest,
    items_fingerprint,
    message_fingerprint,
    prefix_digests,
    request_items,
)

__all__ = [
    "CAPTURE_SEGMENT",
    "TOKEN_ID_CAPTURE_ENV",
    "Lineage",
    "TokenCaptureStore",
    "TokenIdCaptureSettings",
    "capture_environment",
    "record_call",
    "resolve_parent",
    "settings_from_env",
]

CAPTURE_SEGMENT = "training-token-capture"  # `/ng-rollout/<id>/training-token-capture/<route>` (0.7.0's path)
TOKEN_ID_CAPTURE_ENV = "NEMO_GYM_TOKEN_ID_CAPTURE"
RECORD_SCHEMA_VERSION = 1  # 0.7.0's TOKEN_ENTRY_RECORD_SCHEMA_VERSION

# 0.7.0's keys of the block that this gym does not serve, with their inactive values and why
_NOT_SERVED = {
    "sink": (None, "a custom record transport; records go to the file store under token_id_capture.dir"),
    "sink_kwargs": ({}, "the arguments of a custom sink, which is not served"),
    "lineage_store": (None, "a custom parent resolver; the model server resolves parents from the file store"),
    "lineage_store_kwargs": ({}, "the arguments of a custom lineage store, which is not served"),
    "allow_unresolved_continuations": (False, "it only matters with a custom sink, which is not served"),
    "delta_records": (False, "records hold whole prompts (0.7.0's default)"),
    "external_staging": (False, "records are written by the model server itself, not staged by a trainer's worker"),
    "external_staging_backend": ("vllm_worker", "external staging is not served"),
    "control_auth_token_env": ("NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN", "external staging is not served"),
}


class TokenIdCaptureSettings(BaseModel):
    """`ng_run`'s `token_id_capture` block (NeMo Gym 0.7.0's keys and defaults)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="record the model calls of the agents that take part")
    all_agents: bool = Field(
        False, description="every agent takes part (default: those whose config sets `token_id_capture: true`)"
    )
    dir: Path | None = Field(
        None, description="absolute directory of the records (default: `token_id_capture/` in the run's folder)"
    )
    rebuild_response: bool = Field(
        True, description="the collector rebuilds a rollout without token ids from its records (false: record only)"
    )
    max_mask_fraction: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="stop the collection when more than this fraction of rebuilt rollouts is masked (None: never)",
    )
    mask_fraction_min_samples: int = Field(
        50, ge=1, description="rebuilt rollouts seen before `max_mask_fraction` applies"
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_served(cls, values: Any) -> Any:
        if isinstance(values, dict):
            for key, (inactive, why) in _NOT_SERVED.items():
                if key in values and values[key] != inactive:
                    raise ValueError(f"token_id_capture.{key} (NeMo Gym 0.7.0) is not served: {why}")
            values = {k: v for k, v in values.items() if k not in _NOT_SERVED}
        return values

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"must be an absolute path (the model servers and the collector share it), got {value}")
        return value

    def to_env(self) -> str:
        """The settings as the value of `TOKEN_ID_CAPTURE_ENV` (JSON)."""
        return self.model_dump_json()


def settings_from_env(environ: dict[str, str] | None = None) -> TokenIdCaptureSettings | None:
    """The run's capture settings from `TOKEN_ID_CAPTURE_ENV`, or None when the run does not capture."""
    raw = (os.environ if environ is None else environ).get(TOKEN_ID_CAPTURE_ENV)
    if not raw:
        return None
    settings = TokenIdCaptureSettings.model_validate_json(raw)
    return settings if settings.enabled and settings.dir is not None else None


def capture_environment(settings: TokenIdCaptureSettings, run_dir: Path, ray_address: str | None) -> dict[str, str]:
    """The environment that gives every server of a run its capture `settings` (`TOKEN_ID_CAPTURE_ENV`; the records'
    directory by default `token_id_capture/` in the run's folder `run_dir`); {} when the run does not capture.

    Raises:
        ConfigError: capture with `ray_address` (the model servers and the collector share the records' folder).
    """
    if not settings.enabled:
        return {}
    if ray_address:
        raise ConfigError(
            "+token_id_capture.enabled=true with +ray_address is not served: the model servers and"
            " ng_collect_rollouts share the records' folder, so run the servers on this machine"
        )
    return {
        TOKEN_ID_CAPTURE_ENV: settings.model_copy(update={"dir": settings.dir or run_dir / "token_id_capture"}).to_env()
    }


# -- the file store --------------------------------------------------------------------------------------------
@dataclass
class _ReadSoFar:
    """What a store has parsed of one rollout's records file: the file's identity (device, inode and its first
    bytes, so that a file removed and written again is read anew even if its inode is reused), the bytes and lines
    parsed, and the records."""

    identity: tuple[int, int, bytes]
    offset: int = 0
    lines: int = 0
    tokens: int = 0  # prompt and generation ids of the records
    records: list[dict[str, Any]] = field(default_factory=list)


class TokenCaptureStore:
    """The records of each rollout under one directory, NeMo Gym 0.7.0's file layout: `<id>.tokens.jsonl` (a record
    per model call, appended under an exclusive `flock` of `<id>.tokens.lock`, so replicas and workers can share
    it) and `<id>.tokens.incomplete` (a reason per call that could not be recorded).

    `entries` reads a file once: a later call parses only the lines appended since (the records files only grow,
    and the collector removes one before its rollout is sent again), so a rollout of n model calls costs its model
    server n file reads of one record each, not n² (0.7.0's model servers keep an index alike). What was read is
    kept for the rollouts read last, at most `max_cached_rollouts` of them and `max_cached_tokens` token ids in all
    (0.7.0's lineage cache bounds: 512 rollouts, 8M tokens); a rollout left out is read whole again when needed.

    Raises (each method):
        DataError: a rollout id that is not one (letters, digits, `.`, `_`, `-`; not first: no path in it).
    """

    IDENTITY_BYTES = 256  # a record's first bytes hold its model_call_id, a fresh uuid per call

    def __init__(self, root: Path | str, *, max_cached_rollouts: int = 512, max_cached_tokens: int = 8_000_000):
        self.root = Path(root)
        self.max_cached_rollouts, self.max_cached_tokens = max_cached_rollouts, max_cached_tokens
        self._read: OrderedDict[str, _ReadSoFar] = OrderedDict()  # rollout id -> what `entries` parsed, LRU order
        self._read_lock = threading.Lock()  # `entries` runs in worker threads

    def path_for(self, rollout_id: str) -> Path:
        return self.root / f"{_checked(rollout_id)}.tokens.jsonl"

    def incomplete_path_for(self, rollout_id: str) -> Path:
        return self.root / f"{_checked(rollout_id)}.tokens.incomplete"

    @contextmanager
    def _locked(self, rollout_id: str, *, shared: bool = False) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / f"{_checked(rollout_id)}.tokens.lock").open("a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def append(self, entry: dict[str, Any]) -> None:
        """Append one call's record (`entry["rollout_id"]` names the rollout)."""
        line = orjson.dumps(entry) + b"\n"
        with self._locked(entry["rollout_id"]), self.path_for(entry["rollout_id"]).open("ab") as out:
            out.write(line)

    def mark_incomplete(self, rollout_id: str, reason: str) -> None:
        """Record that a call of the rollout could not be recorded, and why (one line)."""
        with self._locked(rollout_id), self.incomplete_path_for(rollout_id).open("a") as out:
            out.write(" ".join(reason.split()) + "\n")

    def entries(self, rollout_id: str) -> list[dict[str, Any]]:
        """The rollout's records, in the order they were written ([] when none): those read before and the lines
        appended since.

        Raises:
            DataError: a line that is not a JSON object, or a record of a newer schema (named by file and line).
        """
        path = self.path_for(rollout_id)
        with self._read_lock:
            read = self._read.pop(rollout_id, None)
        if not path.exists():  # nothing recorded yet (no lock file made for it either)
            return []
        try:
            with self._locked(rollout_id, shared=True), path.open("rb") as handle:
                stat = os.fstat(handle.fileno())
                identity = (stat.st_dev, stat.st_ino, handle.read(self.IDENTITY_BYTES))
                if (
                    read is None
                    or stat.st_size < read.offset
                    or read.identity != (*identity[:2], identity[2][: len(read.identity[2])])
                ):
                    read = _ReadSoFar(identity)  # a first read, or a file removed and written again
                handle.seek(read.offset)
                appended = handle.read()
        except FileNotFoundError:  # removed meanwhile
            return []
        for line in appended.splitlines(keepends=True):
            read.lines += 1
            read.offset += len(line)
            if line.strip():
                record = _current_schema(parse_line(line, path, read.lines), path, read.lines)
                read.records.append(record)
                read.tokens += len(record.get("prompt_token_ids") or ()) + len(record.get("generation_token_ids") or ())
        read.identity = identity  # its first bytes as far as they are written now
        with self._read_lock:
            self._read[rollout_id] = read
            cached_tokens = sum(kept.tokens for kept in self._read.values())
            while len(self._read) > self.max_cached_rollouts or (cached_tokens > self.max_cached_tokens and self._read):
                cached_tokens -= self._read.popitem(last=False)[1].tokens
        return list(read.records)

    def incomplete_reasons(self, rollout_id: str) -> list[str]:
        path = self.incomplete_path_for(rollout_id)
        return [line for line in path.read_text().splitlines() if line] if path.exists() else []

    def delete(self, rollout_id: str) -> None:
        """Remove the rollout's records (before it is dispatched again: a rerun must not merge two attempts)."""
        with self._locked(rollout_id):
            self.path_for(rollout_id).unlink(missing_ok=True)
            self.incomplete_path_for(rollout_id).unlink(missing_ok=True)


def _current_schema(record: dict[str, Any], path: Path, line_no: int) -> dict[str, Any]:
    if int(record.get("schema_version", RECORD_SCHEMA_VERSION)) > RECORD_SCHEMA_VERSION:
        raise DataError(
            f"{path}:{line_no}: record schema_version {record['schema_version']}, this reader knows up to"
            f" {RECORD_SCHEMA_VERSION}"
        )
    return record


def _checked(rollout_id: str) -> str:
    if not (isinstance(rollout_id, str) and ROLLOUT_ID_PATTERN.match(rollout_id)):
        raise DataError(f"not a rollout id: {rollout_id!r} (letters, digits, '.', '_', '-'; not first)")
    return rollout_id


# -- the model server's side -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lineage:
    """A call's place in its rollout. `resolution` is `root` (the request has no assistant turn), `resolved`
    (`parent_call_id`, the call whose answer is the request's last assistant turn, made on the request before it) or
    `unresolved` (that turn is no recorded call's answer, or the history before it is not that call's request);
    `reason` says how it was decided (NeMo Gym 0.7.0's `parent_resolution` and `parent_resolution_reason`).
    `context_len` and `context_digest`: the call's own request (`request_items`, `conversation_digest`; "" when it
    cannot be read), which a later call must continue unchanged to resolve to this one (0.7.0's
    `continuation_context_len` and `continuation_context_digest`)."""

    resolution: Literal["root", "resolved", "unresolved"]
    parent_call_id: str | None = None
    reason: str = ""
    context_len: int = 0
    context_digest: str = ""


def _last_turn_of_items(items: list[Any]) -> tuple[int, str, dict[str, Any]] | None:
    """(index of the item that carries the turn's token fields, its fingerprint, its token fields) of the last
    assistant turn of Responses input items: a run of assistant messages, function calls and reasoning, closed by
    an item that carries token ids (as `openai_convert.input_items_to_messages` groups them); None without one."""
    last, turn = None, []  # the last closed or open turn's items, with their indices
    for index, item in enumerate(items):
        if assistant_item_kind(item) is None:
            turn = []
            continue
        turn.append((index, item))
        last = list(turn)
        if token_info(item).get("generation_token_ids"):
            turn = []
    carriers = [(i, item) for i, item in (last or []) if item.get("type") != "reasoning"]
    if not carriers:
        return None
    index, carrier = carriers[-1]
    return index, items_fingerprint([item for _, item in last or []]), token_info(carrier)


def _continues(entry: dict[str, Any], digests: list[str] | None) -> bool:
    """Whether a request whose prefixes have `digests` (`prefix_digests`; None: unreadable) starts with the request of
    `entry`'s call, unchanged (0.7.0's `RolloutLineage._continues`; a record without a context digest is continued by
    none)."""
    length, digest = entry.get("continuation_context_len", 0), entry.get("continuation_context_digest")
    return bool(digest) and digests is not None and length < len(digests) and digests[length] == digest


def _parent_of(
    fingerprint: str, tokens: dict[str, Any], entries: list[dict[str, Any]], digests: list[str] | None
) -> tuple[Lineage, dict[str, Any] | None]:
    """The parent of a request (`digests`: its prefixes') whose last assistant turn has `fingerprint` and token fields
    `tokens` ({} when the harness dropped them), and the token fields to put back on that turn (None: leave it). A turn
    that answers a call whose request the history before it does not continue (rewritten, compacted, a tool result
    cut) gets nothing back: the model server then renders the history as sent, and the call is `unresolved`."""
    if tokens.get("generation_token_ids"):
        sequence = list(tokens.get("prompt_token_ids") or []) + list(tokens["generation_token_ids"])
        for entry in reversed(entries):
            if entry["prompt_token_ids"] + entry["generation_token_ids"] == sequence:
                return Lineage("resolved", entry["model_call_id"], "token_ids"), None
        return Lineage("unresolved", reason="the turn's token ids are no recorded call's"), None
    answered = [entry for entry in entries if entry.get("turn_fingerprint") == fingerprint]
    if not answered:
        return Lineage("unresolved", reason="the turn's text and tool calls are no recorded call's answer"), None
    matches = [entry for entry in answered if _continues(entry, digests)]
    if not matches:
        return Lineage(
            "unresolved",
            reason=f"the turn answers {len(answered)} recorded call(s), but the history before it is not their request"
            " (rewritten, compacted or cut): rendered as sent",
        ), None
    parent = max(matches, key=lambda entry: entry.get("created_at", 0.0))  # a retry's latest answer
    reason = "fingerprint" if len(matches) == 1 else f"fingerprint, latest of {len(matches)} alike"
    restored = {key: list(parent[key]) for key in TOKEN_INFO_KEYS}
    return Lineage("resolved", parent["model_call_id"], reason), restored


def resolve_parent(body: dict[str, Any], entries: list[dict[str, Any]], *, chat: bool) -> tuple[dict, Lineage]:
    """The request `body` (Chat Completions when `chat`, else Responses) with its parent's token ids put back on its
    last assistant turn when the harness dropped them and the history before that turn is the parent's request, and
    the call's `Lineage`; `entries`: the rollout's records so far. The body is not changed in place."""
    items = request_items(body, chat=chat)
    try:
        digests: list[str] | None = prefix_digests(items)
    except DataError as exc:  # content no digest reads: this call continues none, and none will continue it
        digests, unreadable = None, Lineage("unresolved", reason=f"the request's history cannot be read ({exc})")
    lineage, body = _resolved(body, entries, digests, chat=chat)
    if digests is None and lineage.resolution == "unresolved":
        lineage = unreadable
    return body, replace(lineage, context_len=len(items), context_digest=digests[-1] if digests else "")


def _resolved(
    body: dict[str, Any], entries: list[dict[str, Any]], digests: list[str] | None, *, chat: bool
) -> tuple[Lineage, dict[str, Any]]:
    """`resolve_parent`'s parent and body, the digests of the request's prefixes computed."""
    if chat:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        index = next(
            (
                i
                for i in range(len(messages) - 1, -1, -1)
                if isinstance(messages[i], dict) and messages[i].get("role") == "assistant"
            ),
            None,
        )
        if index is None:
            return Lineage("root"), body
        lineage, restored = _parent_of(
            message_fingerprint(messages[index]), token_info(messages[index]), entries, digests
        )
        if restored is None:
            return lineage, body
        messages = [*messages[:index], {**messages[index], **restored}, *messages[index + 1 :]]
        return lineage, {**body, "messages": messages}
    items = body.get("input") if isinstance(body.get("input"), list) else []
    turn = _last_turn_of_items(items)
    if turn is None:
        return Lineage("root"), body
    index, fingerprint, tokens = turn
    lineage, restored = _parent_of(fingerprint, tokens, entries, digests)
    if restored is None:
        return lineage, body
    return lineage, {**body, "input": [*items[:index], {**items[index], **restored}, *items[index + 1 :]]}


def record_call(
    store: TokenCaptureStore, rollout_id: str, answer: dict[str, Any], lineage: Lineage, *, chat: bool
) -> dict[str, Any] | None:
    """Append the record of one answered call (a Chat Completions answer when `chat`, else a Responses one) and
    return it; an answer without exactly one item carrying token ids marks the rollout incomplete instead (None)."""
    items = chat_to_response(answer)["output"] if chat else list(answer.get("output") or [])
    carriers = [
        i for i, item in enumerate(items) if isinstance(item, dict) and item.get("generation_token_ids") is not None
    ]  # an empty generation is recorded too (the rebuild counts it, 0.7.0's empty_generation_calls)
    if len(carriers) != 1:
        store.mark_incomplete(
            rollout_id,
            f"answer {answer.get('id')}: {len(carriers)} output items carry token ids, one must (serve the policy"
            " with return_token_id_information: true)",
        )
        return None
    tokens = token_info(items[carriers[0]])
    prompt, generation = list(tokens.get("prompt_token_ids") or []), list(tokens["generation_token_ids"])
    log_probs = [float(x) for x in tokens.get("generation_log_probs") or []]
    if len(log_probs) != len(generation):
        store.mark_incomplete(
            rollout_id, f"answer {answer.get('id')}: {len(generation)} generation ids, {len(log_probs)} log-probs"
        )
        return None
    output_items = [{k: v for k, v in item.items() if k not in TOKEN_INFO_KEYS} for item in items]
    entry = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "rollout_id": rollout_id,
        "model_call_id": uuid.uuid4().hex,
        "model": str(answer.get("model") or ""),
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": log_probs,
        "output_items": output_items,
        "token_item_index": carriers[0],
        "response_id": answer.get("id"),
        "created_at": time.time(),
        "parent_call_id": lineage.parent_call_id,
        "parent_resolution": lineage.resolution,
        "parent_resolution_reason": lineage.reason,
        "continuation_context_len": lineage.context_len,
        "continuation_context_digest": lineage.context_digest,
        "cum_len": len(prompt) + len(generation),
        "digest": compute_digest(prompt + generation),
        "turn_fingerprint": items_fingerprint(output_items),
    }
    store.append(entry)
    return entry
