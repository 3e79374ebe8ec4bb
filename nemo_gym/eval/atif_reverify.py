"""ATIF trajectories as `ng_reverify`'s input (NeMo Gym 0.7.0's `gym eval reverify --input-format atif`): trajectories
written by another agent harness (or by `ng_export_atif`) scored by our resources servers.

A manifest JSONL joins each trajectory to a task: `{trajectory_path, _ng_task_index, _ng_rollout_index,
expected_sha256?}` per line (`ng_export_atif` writes it), the path relative to the manifest's folder. Each trajectory
(checked by the `atif` package's models) becomes a Responses API `response`, as 0.7.0's `atif_trajectory_to_response`
builds it: per agent step, its `reasoning_content` as a reasoning item, its message as an assistant message (an empty
one when the step has neither text nor tool calls), its tool calls as function calls (arguments as sorted compact
JSON) and its observation results as their function call outputs; item ids are `atif_` + a digest of the trajectory's
identity and the item's place; the usage comes from `final_metrics`. The response takes the request fields of the
task's `responses_create_params` (temperature, tools, ...), and the verify body is the task row with it: the task row
(the materialized input), not the trajectory, is authoritative for the prompt.

Refused, each naming the file and why, before any call (as 0.7.0): a file whose sha256 is not the manifest's, a task
or rollout index the trajectory's `extra.nemo_gym.source` contradicts, a rollout, file, content or trajectory id used
twice, a continued or subagent trajectory, non-text content, an agent step with both text and tool calls or of
several model calls, a user or system step after the agent's output, a tool call without its output or repeated, an
output that answers no call of its step.

Departures from 0.7.0: a step marked `is_copied_context` (context from the request, which the task row holds) is
left out, where 0.7.0 refuses the file; token ids and log-probs in a step's metrics (ours carry them) are accepted and
not used, where 0.7.0 refuses them; arguments that `ng_export_atif` kept as text (`extra.nemo_gym.arguments_text`,
not a JSON object) are sent as that text; the usage is `final_metrics`' totals as given (0.7.0 also checks them
against the steps' metrics and reads Relay's token extras; no verifier reads them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from atif import Step, Trajectory
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl

__all__ = ["ATIF_PROVENANCE_KEY", "AtifManifestEntry", "atif_rows", "load_atif_manifest", "trajectory_to_response"]

ATIF_PROVENANCE_KEY = "_ng_atif_provenance"  # 0.7.0's key: where a reverified row's response came from
# the request fields a response carries back, taken from the task's responses_create_params (0.7.0's list)
REQUEST_FIELDS = frozenset(
    "background instructions max_output_tokens max_tool_calls metadata parallel_tool_calls previous_response_id prompt"
    " reasoning service_tier temperature text tool_choice tools top_logprobs top_p truncation user".split()
)


class AtifManifestEntry(BaseModel):
    """One line of an ATIF manifest: a trajectory file and the task (rollout) it answers."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    trajectory_path: Path
    task_index: int = Field(alias=TASK_INDEX_KEY, ge=0, strict=True)
    rollout_index: int = Field(alias=ROLLOUT_INDEX_KEY, ge=0, strict=True)
    expected_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


def load_atif_manifest(path: Path) -> list[tuple[int, AtifManifestEntry]]:
    """The (line, entry) pairs of a manifest.

    Raises:
        DataError: a line that is not an entry (`file:line: why`), or no entries.
    """
    entries = []
    for line, row in iter_jsonl(path):
        try:
            entries.append((line, AtifManifestEntry.model_validate(row)))
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]
            raise DataError(f"{path}:{line}: {'.'.join(map(str, problem['loc']))}: {problem['msg']}") from None
    if not entries:
        raise DataError(f"{path}: no trajectories")
    return entries


def _projection_error(trajectory: Trajectory, problem: str) -> DataError:
    return DataError(f"trajectory {trajectory.trajectory_id or '(no id)'}: {problem}")


def _text_parts(content: Any, where: str) -> list[str]:
    """The text of a message or an output: a string (none when empty), or text parts (an empty list is refused)."""
    if isinstance(content, str):
        return [content] if content else []
    if not content:
        raise DataError(f"{where} is an empty list of content parts")
    if any(part.type != "text" or part.text is None for part in content):
        raise DataError(f"{where} has content that is not text")
    return [part.text for part in content]


def _check(trajectory: Trajectory, steps: list[Step]) -> None:
    """0.7.0's refusals (module docstring), on the steps that are not copied context."""
    if trajectory.continued_trajectory_ref is not None or trajectory.subagent_trajectories:
        raise _projection_error(trajectory, "a continued or subagent trajectory is not supported")
    seen_agent = False
    for step in steps:
        where = f"step {step.step_id}"
        results = step.observation.results if step.observation is not None else []
        if any(result.subagent_trajectory_ref for result in results):
            raise _projection_error(trajectory, f"{where} references a subagent trajectory")
        if step.source != "agent":
            if seen_agent or results:
                raise _projection_error(trajectory, f"{where} ({step.source}) comes after the agent's output")
            if isinstance(step.message, list) and any(part.type != "text" for part in step.message):
                raise _projection_error(trajectory, f"{where} has content that is not text")
            continue
        seen_agent = True
        if step.tool_calls and _text_parts(step.message, f"{where} message"):
            raise _projection_error(trajectory, f"{where} has message text and tool calls (their order is lost)")
        if step.llm_call_count is not None and step.llm_call_count > 1:
            raise _projection_error(trajectory, f"{where} aggregates {step.llm_call_count} model calls")


def _content_sha256(trajectory: Trajectory) -> str:
    """The digest of what a trajectory says, without producer metadata (0.7.0's `_trajectory_content_sha256`)."""
    canonical = trajectory.model_dump(mode="json")
    canonical["trajectory_id"] = None
    canonical["agent"].pop("extra", None)
    root_extra = canonical.get("extra")
    if isinstance(root_extra, dict):
        source = (
            (root_extra.get("nemo_gym") or {}).get("source") if isinstance(root_extra.get("nemo_gym"), dict) else None
        )
        canonical["extra"] = {"nemo_gym": {"source": source}} if isinstance(source, dict) else None
    if isinstance(canonical.get("final_metrics"), dict):
        canonical["final_metrics"].pop("extra", None)
    for step in canonical["steps"]:
        step.pop("extra", None)
        for call in step.get("tool_calls") or []:
            call.pop("extra", None)
        for result in (step.get("observation") or {}).get("results") or []:
            extra = result.get("extra")
            result["extra"] = (
                {"tool_result": extra["tool_result"]} if isinstance(extra, dict) and "tool_result" in extra else None
            )
        if isinstance(metrics := step.get("metrics"), dict):
            extra = metrics.get("extra") if isinstance(metrics.get("extra"), dict) else {}
            kept = {"total_tokens": extra["total_tokens"]} if extra.get("total_tokens") is not None else {}
            reasoning = extra.get("reasoning_tokens")
            for details in ("output_tokens_details", "completion_tokens_details"):
                if reasoning is None and isinstance(extra.get(details), dict):
                    reasoning = extra[details].get("reasoning_tokens")
            metrics["extra"] = {**kept, **({"reasoning_tokens": reasoning} if reasoning is not None else {})} or None
    encoded = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(encoded.encode()).hexdigest()


def _item_id(seed: str, *parts: str) -> str:
    return "atif_" + hashlib.sha256("\0".join((seed, *parts)).encode()).hexdigest()[:20]


def _output(result: Any, where: str) -> str | list[dict[str, str]]:
    """A tool's output: its text content, or Relay's `extra.tool_result` (JSON that is not text)."""
    relay = isinstance(result.extra, Mapping) and "tool_result" in result.extra
    if result.content is not None:
        if relay:
            raise DataError(f"{where} has both content and extra.tool_result")
        parts = _text_parts(result.content, where)
        return result.content if isinstance(result.content, str) else [{"type": "input_text", "text": t} for t in parts]
    if relay:
        value = result.extra["tool_result"]
        return (
            value
            if isinstance(value, str)
            else json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        )
    raise DataError(f"{where} has neither content nor extra.tool_result")


def _arguments(call: Any) -> str:
    kept = (call.extra or {}).get("nemo_gym") if isinstance(call.extra, Mapping) else None
    if isinstance(kept, Mapping) and isinstance(kept.get("arguments_text"), str):
        return kept["arguments_text"]  # ng_export_atif's record of arguments that were no JSON object
    return json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _model(trajectory: Trajectory, steps: list[Step]) -> str:
    names = [step.model_name or trajectory.agent.model_name for step in steps]
    known = {name for name in names if name is not None}
    if len(known) > 1 or (known and None in names):
        raise _projection_error(trajectory, "its agent steps name several models (or some name none)")
    return known.pop() if known else "unknown"


def _created_at(trajectory: Trajectory, steps: list[Step]) -> float:
    stamped = next((step for step in reversed(steps) if step.timestamp is not None), None)
    if stamped is None:
        return 0.0
    moment = datetime.fromisoformat(stamped.timestamp.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise _projection_error(trajectory, f"step {stamped.step_id}'s timestamp has no time zone")
    return moment.timestamp()


def _usage(metrics: Any) -> dict[str, Any] | None:
    if metrics is None or metrics.total_prompt_tokens is None or metrics.total_completion_tokens is None:
        return None
    return {
        "input_tokens": metrics.total_prompt_tokens,
        "input_tokens_details": {"cached_tokens": metrics.total_cached_tokens},
        "output_tokens": metrics.total_completion_tokens,
        "output_tokens_details": {"reasoning_tokens": None},
        "total_tokens": metrics.total_prompt_tokens + metrics.total_completion_tokens,
    }


def _step_items(trajectory: Trajectory, seed: str, step: Step, calls_seen: set[str]) -> list[dict[str, Any]]:
    """The response items of one agent step (its reasoning, message, calls and their outputs); adds its call ids to
    `calls_seen`. Raises DataError (a call without id, name or output, a repeated id, an output of no call)."""
    output: list[dict[str, Any]] = []
    where, number = f"step {step.step_id}", str(step.step_id)
    if step.reasoning_content is not None:
        summary = [{"type": "summary_text", "text": step.reasoning_content}]
        output.append({"id": _item_id(seed, "reasoning", number), "type": "reasoning", "summary": summary})
    calls = step.tool_calls or []
    texts = _text_parts(step.message, f"{where} message")
    if texts or not calls:
        content = [{"type": "output_text", "text": text, "annotations": []} for text in texts or [""]]
        message = {"type": "message", "role": "assistant", "status": "completed", "content": content}
        output.append({"id": _item_id(seed, "message", number), **message})
    ids = set()
    for call in calls:
        if not call.tool_call_id.strip() or not call.function_name.strip():
            raise _projection_error(trajectory, f"{where} has a tool call without an id or a function name")
        if call.tool_call_id in ids or call.tool_call_id in calls_seen:
            raise _projection_error(trajectory, f"{where} repeats tool call id {call.tool_call_id!r}")
        ids.add(call.tool_call_id)
        output.append({
            "id": _item_id(seed, "function-call", call.tool_call_id), "type": "function_call",
            "call_id": call.tool_call_id, "name": call.function_name, "arguments": _arguments(call),
            "status": "completed",
        })  # fmt: skip
    calls_seen |= ids
    answered = set()
    for index, result in enumerate(step.observation.results if step.observation is not None else []):
        if result.source_call_id not in ids or result.source_call_id in answered:
            raise _projection_error(trajectory, f"{where} output {index} answers no open call of its step")
        answered.add(result.source_call_id)
        output.append({
            "id": _item_id(seed, "function-output", result.source_call_id, str(index)),
            "type": "function_call_output", "call_id": result.source_call_id,
            "output": _output(result, f"{where} output {index}"), "status": "completed",
        })  # fmt: skip
    if ids - answered:
        raise _projection_error(trajectory, f"{where} has no output for tool call(s) {sorted(ids - answered)}")
    return output


def trajectory_to_response(trajectory: Trajectory, request: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API `response` of a trajectory (module docstring), with the request fields of `request` (a
    task's `responses_create_params`).

    Raises:
        DataError: what 0.7.0 refuses (module docstring), naming the trajectory and the step.
    """
    steps = [step for step in trajectory.steps if not step.is_copied_context]
    _check(trajectory, steps)
    agent_steps = [step for step in steps if step.source == "agent"]
    if not agent_steps:
        raise _projection_error(trajectory, "no agent step to score")
    seed = (
        trajectory.trajectory_id
        if (trajectory.trajectory_id or "").strip()
        else f"content:{_content_sha256(trajectory)}"
    )
    output: list[dict[str, Any]] = []
    calls_seen: set[str] = set()
    for step in agent_steps:
        output += _step_items(trajectory, seed, step, calls_seen)
    response = {
        "id": _item_id(seed, "response"), "object": "response", "created_at": _created_at(trajectory, agent_steps),
        "model": _model(trajectory, agent_steps), "status": "completed", "output": output,
        "parallel_tool_calls": any(len(step.tool_calls or []) > 1 for step in agent_steps), "tool_choice": "auto",
        "tools": [], "usage": _usage(trajectory.final_metrics),
    }  # fmt: skip
    return {**response, **{key: value for key, value in request.items() if key in REQUEST_FIELDS}}


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _load(path: Path, expected_sha256: str | None) -> tuple[Trajectory, str]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror})") from None
    digest = hashlib.sha256(raw).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise DataError(f"{path}: its sha256 is {digest}, the manifest says {expected_sha256}")
    try:
        return Trajectory.model_validate(json.loads(raw, parse_constant=_no_constant)), digest
    except (ValueError, ValidationError) as exc:
        detail = exc.errors(include_url=False)[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise DataError(f"{path}: not an ATIF trajectory: {detail}") from None


def _declared_source(trajectory: Trajectory, key: tuple[int, int], where: str) -> None:
    """The task and rollout index a Gym export wrote in `extra.nemo_gym.source` agree with the manifest's."""
    nemo_gym = trajectory.extra.get("nemo_gym") if isinstance(trajectory.extra, Mapping) else None
    source = nemo_gym.get("source") if isinstance(nemo_gym, Mapping) else None
    for field, expected in zip(("task_index", "rollout_index"), key, strict=True):
        if isinstance(source, Mapping) and field in source and source[field] != expected:
            raise DataError(f"{where}: the trajectory's {field} is {source[field]!r}, the manifest's {expected}")


def atif_rows(
    manifest: Path, tasks: Mapping[tuple[Any, Any], dict[str, Any]], limit: int | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """(manifest line, row) for each trajectory of `manifest` (the first `limit`): its task row from `tasks` (by
    task and rollout index) with the trajectory's `response` and `_ng_atif_provenance` (trajectory and session id,
    the file's sha256, its schema version), ready for `reverify`.

    Raises:
        DataError: a bad manifest line, trajectory or join (module docstring), `manifest:line: why`, before any call.
    """
    rows, seen_files, seen_hashes, seen_ids, seen_keys = [], set(), set(), set(), set()
    for line, entry in load_atif_manifest(manifest)[:limit]:
        where = f"{manifest}:{line}"
        key = (entry.task_index, entry.rollout_index)
        path = (manifest.parent / entry.trajectory_path).resolve()
        if key in seen_keys or path in seen_files:
            raise DataError(f"{where}: rollout {key} or file {path} is in the manifest twice")
        try:
            trajectory, digest = _load(path, entry.expected_sha256)
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
        identity = trajectory.trajectory_id or f"content:{_content_sha256(trajectory)}"
        if digest in seen_hashes or identity in seen_ids:
            raise DataError(f"{where}: {path} repeats the content or trajectory id of an earlier line")
        seen_keys.add(key), seen_files.add(path), seen_hashes.add(digest), seen_ids.add(identity)
        _declared_source(trajectory, key, where)
        if key not in tasks:
            raise DataError(f"{where}: rollout {key} has no row in the materialized inputs")
        task = tasks[key]
        request = task.get("responses_create_params")
        if not isinstance(request, Mapping):
            raise DataError(f"{where}: the task row of rollout {key} has no responses_create_params")
        try:
            response = trajectory_to_response(trajectory, request)
        except DataError as exc:
            raise DataError(f"{where}: {path}: {exc}") from None
        provenance = {
            "trajectory_id": trajectory.trajectory_id, "session_id": trajectory.session_id, "source_sha256": digest,
            "schema_version": trajectory.schema_version, "projection_status": "complete",
        }  # fmt: skip
        rows.append((line, {**task, "response": response, ATIF_PROVENANCE_KEY: provenance}))
    return rows
