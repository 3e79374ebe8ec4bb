"""Rollouts as ATIF trajectories (`ng_export_atif`; NeMo Gym 0.7.0's `gym eval export --format atif`).

ATIF, the Agent Trajectory Interchange Format (Harbor's RFC 0001; the `atif` package's pydantic models build and
check every trajectory here), is the JSON that agent tooling reads a run from: steps by `system`, `user` or `agent`,
an agent step's tool calls with the observation that answered them, per-step metrics. One rollout row of
`ng_collect_rollouts`' output becomes one trajectory `<task index>-<rollout index>.json` in a new folder, with
`manifest.jsonl` (`{trajectory_path, _ng_task_index, _ng_rollout_index, expected_sha256}` per file), as 0.7.0
writes them; the folder appears whole or not at all.

A rollout's conversation is its `responses_create_params.input` (a string is one user message; `instructions` a
system message before it) followed by its `response.output`, read as 0.7.0 groups it into steps
(`atif_export._build_groups`): a system, developer or user message is a step of its own (`source` system for a
developer message); an agent step is the reasoning items before it (its `reasoning_content`) and then either one
assistant message (its `message`) or a run of function calls (its `tool_calls`, `message` "") with the function
call outputs that answer them (its `observation`). What 0.7.0 refuses, this writes down instead, in the step's or
call's `extra.nemo_gym`: an assistant message of the input is an agent step marked `is_copied_context`; arguments
that are not a JSON object are `{}` with the text as sent (`arguments_text`); a tool output that answers no call of
its step is an observation result without `source_call_id`; reasoning of several segments is joined by newlines.

A rollout collected with `+observability_enabled=true` carries its `ng_trajectory` capture record, and the steps
then get what 0.7.0's exporter takes from it: each agent step its turn's time, model and token counts and the model
call itself, each tool result its timing (`nemo_gym.eval.atif_capture`); what of the record does not line up with the
conversation is said in `extra.nemo_gym.conversion` (0.7.0 refuses the rollout). Departures from 0.7.0, which
exports only rollouts with a record: without one, an agent step's metrics come from the token information our model
servers put on the item that ends a model call (`prompt_token_ids`, `generation_token_ids` as
`completion_token_ids`, `generation_log_probs` as `logprobs`, and their counts as `prompt_tokens`/
`completion_tokens`), which 0.7.0's export refuses (with a record, the call's counts come first and the ids stay); a
rollout without them gets the response's `usage` as `final_metrics`. `agent.tool_definitions` are the request's
function tools (OpenAI's function format). The row's other fields (the task's, the reward and the verify answer's)
go into `extra.nemo_gym.rollout`. Rows for several agents may share a file (each trajectory names its agent).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atif import Agent, ContentPart, FinalMetrics, Metrics, Observation, ObservationResult, Step, ToolCall, Trajectory
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import AGENT_REF_KEY, NG_TRAJECTORY_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, iter_jsonl
from nemo_gym.env.trajectory import with_message_types
from nemo_gym.eval.atif_capture import apply_capture_record
from nemo_gym.serving.openai_convert import TOKEN_INFO_KEYS, token_info

__all__ = ["ATIF_SCHEMA_VERSION", "ExportAtifOptions", "export_atif_main", "export_rollouts", "rollout_to_atif"]

try:
    VERSION = importlib.metadata.version("nemo-gym")
except importlib.metadata.PackageNotFoundError:  # a checkout used without installing it
    VERSION = "unknown"
ATIF_SCHEMA_VERSION = "ATIF-v1.7"  # what NeMo Gym 0.7.0 writes (atif_v1_7.ATIF_SCHEMA_VERSION)
MANIFEST = "manifest.jsonl"
# a row's keys the trajectory holds as its steps (the capture record: in the steps and extra.nemo_gym)
_CONVERSATION_KEYS = ("response", "responses_create_params", NG_TRAJECTORY_KEY)


class ExportAtifOptions(BaseModel):
    """Parameters of `ng_export_atif` (0.7.0's `gym eval export` flags: --rollouts, --output-dir, --session-id,
    --agent-version)."""

    model_config = ConfigDict(extra="forbid")
    rollouts_jsonl_fpath: str = Field(description="rollouts JSONL to export (ng_collect_rollouts' output)")
    output_dirpath: str = Field(description="new folder for the trajectories and manifest.jsonl (must not exist)")
    session_id: str = Field(
        min_length=1, description="stable name of the run the rollouts come from (quote a number: +session_id='7')"
    )
    agent_version: str = Field(
        VERSION,
        min_length=1,
        description="version of the agent that made the rollouts (quote a number: +agent_version='1.10')",
    )
    format: str = Field("atif", pattern="^atif$", description="NeMo Gym 0.7.0's --format: atif, the only one")


@dataclass
class _Steps:
    """The steps of one trajectory as they are built, and the reasoning items waiting for their agent step."""

    steps: list[Step] = field(default_factory=list)
    reasoning: list[dict[str, Any]] = field(default_factory=list)  # reasoning items waiting for their agent step

    def add(self, **fields: Any) -> Step:
        step = Step(step_id=len(self.steps) + 1, **fields)
        self.steps.append(step)
        return step


def _text(content: Any) -> str | list[ContentPart]:
    """A message's content as ATIF content: a string as is, text parts (`input_text`, `output_text`, `text`) as text
    parts; other parts as text parts of their JSON (an image input, a refusal), kept."""
    if isinstance(content, str):
        return content
    parts = []
    for part in content if isinstance(content, list) else []:
        text = part.get("text") if isinstance(part, dict) else None
        is_text = isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
        parts.append(ContentPart(type="text", text=text if is_text and isinstance(text, str) else json.dumps(part)))
    return parts or ""


def _reasoning(items: list[dict[str, Any]]) -> tuple[str | None, list[str]]:
    """The reasoning items' text (their `content` parts, else their `summary` parts; segments joined by newlines)
    and their ids."""
    segments = []
    for item in items:
        source = item.get("content") or item.get("summary") or []
        segments += [p["text"] for p in source if isinstance(p, dict) and isinstance(p.get("text"), str)]
    ids = [item["id"] for item in items if isinstance(item.get("id"), str)]
    return ("\n".join(segments) if segments else None), ids


def _arguments(call: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A function call's arguments as an object, and what `extra.nemo_gym` keeps of the call (its item id; its
    arguments text when it is no JSON object)."""
    kept: dict[str, Any] = {"source_item_id": call["id"]} if isinstance(call.get("id"), str) else {}
    raw = call.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        return {}, {**kept, "arguments_text": raw}
    return arguments, kept


def _metrics(items: list[dict[str, Any]]) -> Metrics | None:
    """An agent step's metrics from the token information on its items (the item that ends a model call)."""
    carrier = next((info for item in reversed(items) if (info := token_info(item))), None)
    if carrier is None:
        return None
    prompt, generated, logprobs = (carrier.get(k) for k in TOKEN_INFO_KEYS)
    return Metrics(
        prompt_tokens=len(prompt) if isinstance(prompt, list) else None,
        completion_tokens=len(generated) if isinstance(generated, list) else None,
        prompt_token_ids=prompt,
        completion_token_ids=generated,
        logprobs=logprobs,
    )


def _nemo_gym(**fields: Any) -> dict[str, Any] | None:
    """`{"nemo_gym": fields}` with the empty ones (None, '', [], {}) left out (a dict's too); None when none is left."""
    kept = {
        key: {k: v for k, v in value.items() if v} if isinstance(value, dict) else value
        for key, value in fields.items()
    }
    kept = {key: value for key, value in kept.items() if value}
    return {"nemo_gym": kept} if kept else None


def _agent_message(built: _Steps, item: dict[str, Any], *, copied: bool, model_name: str | None) -> None:
    reasoning, reasoning_ids = _reasoning(built.reasoning)
    message_id = item.get("id") if isinstance(item.get("id"), str) else None
    built.add(
        source="agent",
        message=_text(item.get("content")),
        reasoning_content=reasoning,
        model_name=model_name,
        metrics=_metrics([*built.reasoning, item]),
        is_copied_context=True if copied else None,
        extra=_nemo_gym(source_items={} if copied else {"reasoning_ids": reasoning_ids, "message_id": message_id}),
    )
    built.reasoning = []


def _tool_step(
    built: _Steps, calls: list[dict[str, Any]], outputs: list[dict[str, Any]], *, copied: bool, model_name: str | None
) -> None:
    reasoning, reasoning_ids = _reasoning(built.reasoning)
    tool_calls = []
    for number, call in enumerate(calls):
        arguments, kept = _arguments(call)
        name = call.get("name") if isinstance(call.get("name"), str) else ""
        call_id = call.get("call_id") if isinstance(call.get("call_id"), str) and call["call_id"] else None
        tool_calls.append(
            ToolCall(
                tool_call_id=call_id or f"call_{len(built.steps) + 1}_{number}",  # a call without one gets one
                function_name=name,
                arguments=arguments,
                extra=_nemo_gym(**kept, call_id_missing=call_id is None),
            )
        )
    ids = {call.tool_call_id for call in tool_calls}
    results = []
    for output in outputs:
        answers = output.get("call_id") if output.get("call_id") in ids else None
        kept = {"source_item_id": output.get("id"), "call_id": output.get("call_id") if answers is None else None}
        content = output.get("output")
        results.append(
            ObservationResult(
                source_call_id=answers,
                content=_text(content) if isinstance(content, (str, list)) else json.dumps(content),
                extra=_nemo_gym(**kept),
            )
        )
    built.add(
        source="agent",
        message="",
        reasoning_content=reasoning,
        tool_calls=tool_calls,
        observation=Observation(results=results) if results else None,
        model_name=model_name,
        metrics=_metrics([*built.reasoning, *calls]),
        is_copied_context=True if copied else None,
        extra=_nemo_gym(source_items={} if copied else {"reasoning_ids": reasoning_ids}),
    )
    built.reasoning = []


def _items(row: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    """The conversation's items in order, each with whether it came from the request (copied context)."""
    params = row.get("responses_create_params") if isinstance(row.get("responses_create_params"), dict) else {}
    if isinstance(params.get("instructions"), str) and params["instructions"]:
        yield {"type": "message", "role": "system", "content": params["instructions"]}, True
    given = params.get("input")
    for item in with_message_types([{"role": "user", "content": given}] if isinstance(given, str) else given or []):
        yield item, True
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    for item in response.get("output") or []:
        if isinstance(item, dict):
            yield item, False


def _steps(row: dict[str, Any], model_name: str | None) -> list[Step]:
    """The steps of one rollout's conversation (module docstring)."""
    built, items, index = _Steps(), list(_items(row)), 0
    while index < len(items):
        item, copied = items[index]
        kind, role = item.get("type"), item.get("role", "assistant")
        index += 1
        if kind == "reasoning":
            built.reasoning.append(item)
        elif kind == "message" and role != "assistant":
            source = "user" if role == "user" else "system"
            built.add(
                source=source,
                message=_text(item.get("content")),
                extra=_nemo_gym(role=role if role not in ("user", "system") else None),
            )
        elif kind == "message":
            _agent_message(built, item, copied=copied, model_name=None if copied else model_name)
        elif kind in ("function_call", "function_call_output"):
            calls = [item] if kind == "function_call" else []
            outputs = [] if calls else [item]
            while calls and index < len(items) and items[index][0].get("type") == "function_call":
                calls.append(items[index][0])
                index += 1
            while index < len(items) and items[index][0].get("type") == "function_call_output":
                outputs.append(items[index][0])
                index += 1
            _tool_step(built, calls, outputs, copied=copied, model_name=None if copied else model_name)
        else:  # an item type ATIF has no step for: kept as a system step of its JSON
            built.add(source="system", message=json.dumps(item), extra=_nemo_gym(item_type=str(kind)))
    if built.reasoning:  # reasoning with no answer after it (the rollout stopped there)
        _agent_message(built, {"content": ""}, copied=False, model_name=model_name)
    return built.steps


def _final_metrics(steps: list[Step], usage: Any) -> FinalMetrics:
    """Totals over the agent steps' metrics when every model-written step has them, else the response's usage."""
    written = [step for step in steps if step.source == "agent" and not step.is_copied_context]
    if written and all(step.metrics and step.metrics.prompt_tokens is not None for step in written):
        prompt = sum(step.metrics.prompt_tokens for step in written)
        completion = sum(step.metrics.completion_tokens or 0 for step in written)
        cached = [step.metrics.cached_tokens for step in written]
        return FinalMetrics(
            total_prompt_tokens=prompt,
            total_completion_tokens=completion,
            total_cached_tokens=sum(cached) if None not in cached else None,
            total_steps=len(steps),
        )
    usage = usage if isinstance(usage, dict) else {}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    return FinalMetrics(
        total_prompt_tokens=usage.get("input_tokens"),
        total_completion_tokens=usage.get("output_tokens"),
        total_cached_tokens=cached,
        total_steps=len(steps),
    )


def _tool_definitions(params: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's function tools in OpenAI's function format (`{type: function, function: {...}}`)."""
    tools = [
        {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}
        for tool in params.get("tools") or []
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
    return tools or None


def rollout_to_atif(row: dict[str, Any], *, session_id: str, agent_version: str) -> Trajectory:
    """One rollout row (`ng_collect_rollouts`' output) as an ATIF trajectory (module docstring).

    Raises:
        DataError: the row has no `agent_ref.name`, no non-negative `_ng_task_index`/`_ng_rollout_index`, no
            conversation, or a trajectory ATIF refuses (the `atif` package's checks).
    """
    task, rollout = (row.get(key) for key in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY))
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in (task, rollout)):
        raise DataError(
            f"{TASK_INDEX_KEY} and {ROLLOUT_INDEX_KEY} must be non-negative integers, got {task!r}, {rollout!r}"
        )
    agent = row.get(AGENT_REF_KEY).get("name") if isinstance(row.get(AGENT_REF_KEY), dict) else None
    if not isinstance(agent, str) or not agent:
        raise DataError(f"no {AGENT_REF_KEY}.name: the rollout's agent names the trajectory's")
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    model_name = response.get("model") if isinstance(response.get("model"), str) else None
    params = row.get("responses_create_params") if isinstance(row.get("responses_create_params"), dict) else {}
    try:
        steps = _steps(row, model_name)
        if not steps:
            raise DataError("no conversation: neither responses_create_params.input nor response.output has an item")
        identity = {"task_index": task, "rollout_index": rollout}
        captured = {"source": {"format": "responses_rollout", **identity}}
        if NG_TRAJECTORY_KEY in row:
            captured = apply_capture_record(row[NG_TRAJECTORY_KEY], steps, identity)
        return Trajectory(
            schema_version=ATIF_SCHEMA_VERSION,
            session_id=session_id,
            trajectory_id=f"{session_id}:{task}:{rollout}",
            agent=Agent(
                name=agent, version=agent_version, model_name=model_name, tool_definitions=_tool_definitions(params)
            ),
            steps=steps,
            final_metrics=_final_metrics(steps, response.get("usage")),
            extra={
                "nemo_gym": {
                    "exporter": {"name": "nemo_gym", "version": VERSION},
                    **captured,
                    "rollout": {k: v for k, v in row.items() if k not in _CONVERSATION_KEYS and k != AGENT_REF_KEY},
                }
            },
        )
    except ValidationError as exc:
        raise DataError(f"not a valid ATIF trajectory: {exc.errors(include_url=False)[0]['msg']}") from None


def _encoded(trajectory: Trajectory) -> bytes:
    return (json.dumps(trajectory.to_json_dict(exclude_none=True), indent=2, ensure_ascii=False) + "\n").encode()


def export_rollouts(source: Path, output: Path, *, session_id: str, agent_version: str) -> int:
    """Every rollout of `source` as an ATIF file in the new folder `output`, with its manifest; returns their count.
    Nothing is written unless every row converts (the folder is built aside, then renamed into place).

    Raises:
        ConfigError: `source` is missing or `output` exists.
        DataError: rows that cannot be exported, each named by `file:line` and why (all of them, at once); a
            repeated (task, rollout) pair; no rows.
    """
    if not source.is_file():
        raise ConfigError(f"+rollouts_jsonl_fpath: no such file: {source}")
    if os.path.lexists(output):
        raise ConfigError(f"+output_dirpath: {output} exists; name a new folder")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        manifest, errors, seen = [], [], set()
        for line, row in iter_jsonl(source):
            try:
                trajectory = rollout_to_atif(row, session_id=session_id, agent_version=agent_version)
                pair = (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY])
                if pair in seen:
                    raise DataError(f"a second row of rollout {pair}")
                seen.add(pair)
            except DataError as exc:
                errors.append(f"{source}:{line}: {exc}")
                continue
            encoded, name = _encoded(trajectory), f"{pair[0]}-{pair[1]}.json"
            (staging / name).write_bytes(encoded)
            digest = hashlib.sha256(encoded).hexdigest()
            entry = {
                "trajectory_path": name,
                TASK_INDEX_KEY: pair[0],
                ROLLOUT_INDEX_KEY: pair[1],
                "expected_sha256": digest,
            }
            manifest.append(json.dumps(entry, sort_keys=True, separators=(",", ":")))
        if errors:
            raise DataError(f"{len(errors)} rollout(s) cannot be exported, nothing was written:\n" + "\n".join(errors))
        if not manifest:
            raise DataError(f"{source}: no rollouts")
        (staging / MANIFEST).write_text("\n".join(manifest) + "\n", encoding="utf-8")
        staging.chmod(0o755)
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return len(manifest)


def export_atif_main(options: ExportAtifOptions) -> int:
    """`ng_export_atif`: export, print where. Returns 0 (errors raise, see `export_rollouts`)."""
    output = Path(options.output_dirpath).expanduser().absolute()
    count = export_rollouts(
        Path(options.rollouts_jsonl_fpath), output, session_id=options.session_id, agent_version=options.agent_version
    )
    print(f"Exported {count} ATIF trajectory file(s) to {output}")
    print(f"Manifest: {output / MANIFEST}")
    return 0
