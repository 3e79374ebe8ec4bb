"""Rollouts rebuilt from their recorded model calls (training token capture, NeMo Gym 0.7.0's `token_id_capture`
consumer; the model server's side: `nemo_gym.serving.token_capture`).

An agent whose rollouts are captured registers the run's capture settings with the head server
(`AgentServer.registration_extras`). For its rollouts the collector (`TokenCaptureRebuild`):

1. removes the records of a rollout id before the rollout is sent (a rerun must not merge two attempts);
2. after the rollout, when its `response.output` carries no token ids, rebuilds that output from the records
   (`rebuild_rollout`): the calls are linked to their parents as the model server resolved them (each link checked:
   the parent's cumulative digest must match the start of the child's prompt), the *terminal* call is the one whose
   answer the verifier scored (its response id, and the text and tool calls of the response's last assistant turn:
   two witnesses that must agree), and the chain from the first call to it becomes the output: each call's output
   items, the item that carried its token ids with them again (prompt, generation, log-probs), so that each call's
   prompt extends the previous call's prompt and generation, as the trainer needs (`nemo_gym.train.batch`);
3. marks the rollout `mask_sample: true` (left out of reward statistics and GRPO groups) when it cannot be rebuilt
   whole: nothing recorded, a call recorded incomplete, a broken link on the terminal chain, or, with no terminal
   found, more than one chain; the reason and the build's counts are in `_ng_token_capture`;
4. stops the collection when more than `max_mask_fraction` of the rebuilt rollouts are masked (after
   `mask_fraction_min_samples`), rather than collect mostly untrainable data.

The reward and every other field of the rollout are kept. A rollout that already carries token ids (an agent that
keeps them) is left as it is. Calls off the terminal chain (a retry, an auxiliary call) are counted, not delivered.

The rules are 0.7.0's (`token_id_capture.consumer`, `builder.prefix_merging`, `terminal.resolve_terminal`), minus what
only its other writers need (delta prompts, external staging, custody rows); 0.7.0's consumer rebuilds our records
into the same output
(`tests/test_token_capture.py::test_0_7_0s_consumer_rebuilds_our_records_into_the_same_rollouts`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.common.errors import DataError, NemoGymError
from nemo_gym.common.jsonl import AGENT_REF_KEY
from nemo_gym.env.metrics import MASK_SAMPLE_KEY
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.rollout_prefix import capture_rollout_id
from nemo_gym.serving.token_capture import TokenCaptureStore, TokenIdCaptureSettings
from nemo_gym.serving.token_fingerprints import assistant_item_kind, compute_digest, items_fingerprint

__all__ = ["TOKEN_CAPTURE_KEY", "MaskedCaptureError", "TokenCaptureRebuild", "rebuild_rollout"]

TOKEN_CAPTURE_KEY = "_ng_token_capture"  # 0.7.0's key: the build's counts and, when masked, why


class MaskedCaptureError(NemoGymError):
    """More rebuilt rollouts were masked than `token_id_capture.max_mask_fraction` allows."""


@dataclass
class _Call:
    entry: dict[str, Any]
    parent: _Call | None = None
    children: list[_Call] = field(default_factory=list)
    broken: str | None = None  # why its recorded parent link does not hold (None: it holds, or it is a root)


def _link(entries: list[dict[str, Any]]) -> tuple[list[_Call], Counter[str]]:
    """The calls with generated tokens, linked to their recorded parents (each link checked by the parent's
    cumulative length and digest), in the order they were made; and why links failed, counted."""
    by_id: dict[str, _Call] = {}
    for entry in sorted(entries, key=lambda e: e.get("created_at", 0.0)):
        if entry.get("generation_token_ids"):
            by_id.setdefault(entry["model_call_id"], _Call(entry))
    failures: Counter[str] = Counter()
    for call in by_id.values():
        resolution = call.entry.get("parent_resolution")
        if resolution == "root":
            continue
        if resolution != "resolved":
            call.broken = "parent_unresolved" if resolution == "unresolved" else "missing_resolution"
        elif (parent := by_id.get(call.entry.get("parent_call_id") or "")) is None:
            call.broken = "parent_call_id_missing"
        else:
            prompt, length = call.entry["prompt_token_ids"], parent.entry.get("cum_len")
            length = length if isinstance(length, int) else len(_cumulative(parent.entry))
            digest = parent.entry.get("digest") or compute_digest(_cumulative(parent.entry))
            if length <= len(prompt) and compute_digest(prompt[:length]) == digest:
                call.parent = parent
                parent.children.append(call)
            else:
                call.broken = "parent_digest_mismatch"
        if call.broken:
            failures[call.broken] += 1
    return list(by_id.values()), failures


def _cumulative(entry: dict[str, Any]) -> list[int]:
    return list(entry["prompt_token_ids"]) + list(entry["generation_token_ids"])


def _trailing_turn(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The response's last assistant turn: its output items after the last item that is not the assistant's."""
    turn: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if assistant_item_kind(item):
            turn.append(item)
        else:
            turn = []
    return turn


def _terminal(calls: list[_Call], response: dict[str, Any]) -> tuple[_Call | None, str, str]:
    """The call whose answer the verifier scored, the witness that named it (`response_id`, `content`, or "" when
    none did) and what the witnesses said, as 0.7.0's `resolve_terminal` decides: each witness names one call or
    abstains; two that name different calls name none."""
    reasons, witnesses = [], []
    response_id = response.get("id")
    by_id = [call for call in calls if response_id and call.entry.get("response_id") == response_id]
    if len(by_id) == 1:
        witnesses.append(("response_id", by_id[0]))
    else:
        reasons.append("response_id_ambiguous" if by_id else "response_id_no_match")
    turn = _trailing_turn(response)
    fingerprint = items_fingerprint(turn) if turn else None
    by_content = [call for call in calls if fingerprint and call.entry.get("turn_fingerprint") == fingerprint]
    if len(by_content) == 1:
        witnesses.append(("content", by_content[0]))
    else:
        reasons.append("content_ambiguous" if by_content else "content_no_match")
    if not witnesses:
        return None, "", ",".join(reasons)
    if len({id(call) for _, call in witnesses}) > 1:
        named = ";".join(f"{method}={call.entry['model_call_id']}" for method, call in witnesses)
        return None, "", ",".join([*reasons, f"witness_disagreement[{named}]"])
    return witnesses[0][1], witnesses[0][0], ",".join(reasons)


def _path_to(call: _Call) -> list[_Call]:
    path = [call]
    while path[-1].parent is not None:
        path.append(path[-1].parent)  # type: ignore[arg-type]
    return path[::-1]


def _project(chain: list[_Call]) -> list[dict[str, Any]]:
    """The output items of a chain of calls: each call's recorded items, its token fields back on the item that
    carried them (0.7.0's `project_chain_to_output_items`)."""
    output: list[dict[str, Any]] = []
    for call in chain:
        entry = call.entry
        items = [dict(item) for item in entry.get("output_items") or []]
        tokens = {
            "prompt_token_ids": list(entry["prompt_token_ids"]),
            "generation_token_ids": list(entry["generation_token_ids"]),
            "generation_log_probs": list(entry["generation_log_probs"]),
        }
        index = entry.get("token_item_index")
        if not items:
            output.append({"type": "message", **tokens})
            continue
        carrier = index if isinstance(index, int) and 0 <= index < len(items) else len(items) - 1
        items[carrier].update(tokens)
        output.extend(items)
    return output


def rebuild_rollout(rollout: dict[str, Any], store: TokenCaptureStore) -> dict[str, Any] | None:
    """Rebuild `rollout`'s `response.output` from its records in `store`, in place (module docstring); returns the
    build's counts (also in `rollout["_ng_token_capture"]`), or None when the rollout carries token ids already (left
    as it is). A rollout that cannot be rebuilt whole gets `mask_sample: true` and the reason in the counts' `error`.

    Raises:
        DataError: the rollout's id is not one, or a record that is not JSON (named by file and line).
    """
    response = rollout.get("response") if isinstance(rollout.get("response"), dict) else {}
    if any(isinstance(item, dict) and item.get("generation_token_ids") for item in response.get("output") or []):
        return None
    rollout_id = capture_rollout_id(rollout)
    entries = store.entries(rollout_id)
    incomplete = store.incomplete_reasons(rollout_id)
    calls, link_failures = _link(entries)
    if not calls:
        return _masked(rollout, {"n_calls": len(entries)}, "nothing recorded", incomplete)
    terminal, method, reasons = _terminal(calls, response)
    leaves = [call for call in calls if not call.children]
    roots = [call for call in calls if call.parent is None]
    if terminal is not None:
        chain = _path_to(terminal)
        status = "broken" if any(call.broken for call in chain) else "delivered"
    else:
        chain = _path_to(leaves[0]) if len(leaves) == 1 else []
        status = "unattributed"
    captured = sum(len(call.entry["generation_token_ids"]) for call in calls)
    delivered = sum(len(call.entry["generation_token_ids"]) for call in chain)
    counts = {
        "n_calls": len(entries),
        "terminal_attribution": {
            "method": method or "none",
            "call_id": terminal.entry["model_call_id"] if terminal else None,
            "reason": reasons,
            "chain": status,
        },
        "chains": len(leaves),
        "roots": len(roots),
        "parent_link_failures": dict(link_failures),
        "unresolved_parent_calls": sum(link_failures.values()),
        "empty_generation_calls": sum(1 for e in entries if not e.get("generation_token_ids")),
        "generated_tokens_captured": captured,
        "generated_tokens_delivered": delivered,
        "delivered_fraction": round(delivered / captured, 4) if captured else 0.0,
    }
    if status == "broken":
        return _masked(rollout, counts, "a call on the terminal chain has no verified parent", incomplete)
    if status == "unattributed" and (len(leaves) != 1 or len(roots) != 1 or link_failures):
        return _masked(rollout, counts, "no terminal call named and the calls do not form one chain", incomplete)
    rollout["response"] = {**response, "output": _project(chain)}
    if incomplete:
        return _masked(rollout, counts, None, incomplete)
    rollout[TOKEN_CAPTURE_KEY] = counts
    return counts


def _masked(rollout: dict[str, Any], counts: dict[str, Any], error: str | None, incomplete: list[str]) -> dict:
    """`rollout` marked untrainable (`mask_sample`), with `counts`, the error and the calls recorded incomplete."""
    if incomplete:
        counts["capture_incomplete"] = True
        counts["incomplete_calls"] = incomplete
        error = error or f"a call was not recorded: {incomplete[0]}"
    counts["error"] = error
    rollout[MASK_SAMPLE_KEY] = True
    rollout[TOKEN_CAPTURE_KEY] = counts
    return counts


@dataclass
class TokenCaptureRebuild:
    """The collector's side of training token capture for one collection: which agents' rollouts are captured (by
    instance name: the run's settings they registered) and how many rebuilt rollouts were masked."""

    settings_by_agent: dict[str, TokenIdCaptureSettings]
    rebuilt: int = 0
    masked: Counter[str] = field(default_factory=Counter)

    @classmethod
    async def discover(cls, client: ServerClient) -> TokenCaptureRebuild | None:
        """The captured agents of the run behind `client` (its head server's registrations), None when none is (or
        the client has no head server: addresses given directly)."""
        if not client.head_url:
            return None
        settings = {
            entry["name"]: TokenIdCaptureSettings.model_validate(entry["token_id_capture"])
            for entry in await client.list_servers()
            if entry.get("token_id_capture")
        }
        return cls(settings) if settings else None

    def _settings(self, row: dict[str, Any]) -> TokenIdCaptureSettings | None:
        agent = (row.get(AGENT_REF_KEY) or {}).get("name")
        settings = self.settings_by_agent.get(agent) if isinstance(agent, str) else None
        return settings if settings is not None and settings.dir is not None else None

    async def before(self, row: dict[str, Any]) -> None:
        """Remove the records of `row`'s rollout id before it is sent, when its agent is captured."""
        if (settings := self._settings(row)) is not None:
            await asyncio.to_thread(TokenCaptureStore(settings.dir).delete, capture_rollout_id(row))  # type: ignore[arg-type]

    async def after(self, rollout: dict[str, Any]) -> None:
        """Rebuild a finished rollout of a captured agent (`rebuild_rollout`), unless the run only records.

        Raises:
            MaskedCaptureError: more than `max_mask_fraction` of the rebuilt rollouts are masked.
        """
        settings = self._settings(rollout)
        if settings is None or not settings.rebuild_response:
            return
        try:
            counts = await asyncio.to_thread(rebuild_rollout, rollout, TokenCaptureStore(settings.dir))  # type: ignore[arg-type]
        except DataError as exc:  # a record that cannot be read: this rollout is masked, the collection goes on
            counts = _masked(rollout, {}, str(exc), [])
        if counts is None:
            return
        self.rebuilt += 1
        if counts.get("error"):
            self.masked[counts["error"]] += 1
        limit, masked = settings.max_mask_fraction, sum(self.masked.values())
        if limit is not None and self.rebuilt >= settings.mask_fraction_min_samples and masked > limit * self.rebuilt:
            raise MaskedCaptureError(
                f"{masked}/{self.rebuilt} rebuilt rollouts ({masked / self.rebuilt:.1%}) are masked, over"
                f" token_id_capture.max_mask_fraction={limit}; reasons: {dict(self.masked)}. Stopped rather than"
                " collect rollouts without token ids"
            )
