"""`train.jsonl` entries of a ReinforceNow project: reading and checking them, each problem with its line.

An entry: `messages` (required; `system` only first, at least one `user`, the first other message a `user`
one; an RL entry ends with a `user` or `tool` message, which the policy answers; an SFT entry, for
`dataset_type: sft` or `+algorithm=sft`, ends with the `assistant` turn to learn, and its assistant `tool_calls`
carry `arguments` as a JSON string, as in OpenAI's chat format), `rewards` (names of `@reward` functions,
required for RL, not read for SFT), `metadata` and `variables` (objects, given to rewards as
`args.metadata` / `args.variables`; `$name` in message texts is replaced by the variable's value),
`tools` (names of `@tool` functions; all of them when absent), `docker` (required by `sandbox=True`
rewards and tools), `docker_env` (needs `docker`). Other keys are kept and ignored, as rnow does.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from nemo_gym.common.jsonl import iter_lines
from nemo_gym.config import did_you_mean
from nemo_gym.rnow.loading import ProjectFunctions

__all__ = ["Entry", "read_entries", "entry_problems", "entry_tool_names", "substituted_messages", "ROLES"]

ROLES = ("system", "user", "assistant", "tool")
Entry = tuple[int, dict[str, Any]]  # (line number, the entry)


def read_entries(path: Path) -> tuple[list[Entry], list[str]]:
    """(entries with their 1-based line numbers, problems `train.jsonl:<line>: ...`); blank lines are skipped."""
    entries, problems = [], []
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            problems.append(f"{path.name}:{number}: not valid JSON: {exc}")
            continue
        if not isinstance(value, dict):
            problems.append(f"{path.name}:{number}: an entry must be a JSON object, got {type(value).__name__}")
            continue
        entries.append((number, value))
    if not entries and not problems:
        problems.append(f"{path.name}: no entries")
    return entries, problems


def substituted_messages(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entry's messages with `$name` / `${name}` in string contents replaced by `variables[name]`
    (unknown names are left as they are)."""
    variables = {str(k): str(v) for k, v in (entry.get("variables") or {}).items()}
    if not variables:
        return [dict(m) for m in entry["messages"]]
    out = []
    for message in entry["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            message = {**message, "content": string.Template(content).safe_substitute(variables)}
        out.append(dict(message))
    return out


def _message_problems(messages: Any, sft: bool = False) -> list[str]:
    if not isinstance(messages, list) or not messages:
        return ["'messages' must be a non-empty list of {role, content} objects"]
    problems = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else None
            problems.append(f"messages[{index}]: role {role!r} is not one of {', '.join(ROLES)}")
        elif not isinstance(message.get("content"), (str, list)) and not message.get("tool_calls"):
            problems.append(f"messages[{index}]: 'content' must be a string or a list of content parts")
        elif message["role"] == "system" and index != 0:
            problems.append(f"messages[{index}]: a system message may only come first")
    if problems:
        return problems
    roles = [m["role"] for m in messages]
    if "user" not in roles:
        return ["messages: at least one user message is required"]
    first = 1 if roles[0] == "system" else 0
    if roles[first] != "user":
        problems.append(
            f"messages[{first}]: the first message after the optional system message must be a user message, got"
            f" {roles[first]}"
        )
    if sft:
        if roles[-1] != "assistant":
            problems.append(
                f"messages: an SFT entry ends with the assistant turn to learn, but the last message is a {roles[-1]}"
                " message"
            )
        problems += _tool_call_problems(messages)
    elif roles[-1] == "assistant":
        problems.append(
            "messages: the last message is an assistant turn: an RL entry ends with a user (or tool) message that the"
            " policy answers (entries that end with the answer are SFT data: train them with +algorithm=sft)"
        )
    return problems


def _tool_call_problems(messages: list[dict[str, Any]]) -> list[str]:
    """Assistant `tool_calls` of SFT entries: `{"type": "function", "function": {"name", "arguments": "<JSON
    object>"}}`."""
    problems = []
    for index, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if message["role"] != "assistant" or not isinstance(calls, list):
            problems.append(f"messages[{index}]: 'tool_calls' must be a list on an assistant message")
            continue
        for number, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            where = f"messages[{index}].tool_calls[{number}]"
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                problems.append(f"{where}: needs a 'function' object with a string 'name'")
            elif isinstance(arguments, str):
                try:
                    if not isinstance(json.loads(arguments), dict):
                        problems.append(f"{where}.function.arguments: the JSON string must hold an object")
                except ValueError as exc:
                    problems.append(f"{where}.function.arguments: not valid JSON ({exc})")
            elif not isinstance(arguments, dict):
                problems.append(f"{where}.function.arguments: must be a JSON string (or an object)")
    return problems


def _names_problems(
    entry: dict[str, Any], key: str, known: dict[str, Any], source_file: str, required: bool
) -> list[str]:
    names = entry.get(key)
    if names is None:
        return (
            [f"'{key}' is required: the names of the {source_file} functions that score this entry"] if required else []
        )
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or (required and not names):
        return [f"'{key}' must be a {'non-empty ' if required else ''}list of names"]
    return [
        f"unknown {key[:-1]} {name!r}{did_you_mean(name, known)}; {source_file} defines:"
        f" {', '.join(sorted(known)) or 'none'}"
        for name in names
        if name not in known
    ]


def entry_problems(entry: dict[str, Any], functions: ProjectFunctions, sft: bool = False) -> list[str]:
    """What is wrong with one entry (empty when nothing): message order and roles, unknown reward or tool
    names (with a suggestion), sandbox functions without `docker`, bad metadata/variables types; for SFT
    (`sft`), the final assistant turn and the tool calls' JSON arguments, and no reward needed."""
    problems = _message_problems(entry.get("messages"), sft)
    if sft:
        problems += _names_problems(entry, "tools", functions.tools, "tools.py", required=False)
        return problems
    problems += _names_problems(entry, "rewards", functions.rewards, "rewards.py", required=True)
    problems += _names_problems(entry, "tools", functions.tools, "tools.py", required=False)
    for key in ("metadata", "variables", "docker_env"):
        if entry.get(key) is not None and not isinstance(entry[key], dict):
            problems.append(f"'{key}' must be an object")
    if entry.get("docker_env") and not entry.get("docker"):
        problems.append("'docker_env' needs a 'docker' field")
    if not entry.get("docker"):
        rewards = [
            n
            for n in entry.get("rewards") or []
            if isinstance(n, str) and n in functions.rewards and functions.rewards[n].sandbox
        ]
        for name in rewards:
            problems.append(
                f"reward {name!r} has sandbox=True, which needs a 'docker' field on the entry (e.g. \"docker\":"
                ' "python:3.11-slim")'
            )
    for name in [n for n in _tool_names(entry, functions) if functions.tools[n].sandbox]:
        problems.append(
            f"tool {name!r} has sandbox=True: sandbox tools are not supported yet (no Docker container keeping state"
            " between calls); drop sandbox=True or leave the tool out of this entry's 'tools'"
        )
    return problems


def _tool_names(entry: dict[str, Any], functions: ProjectFunctions) -> list[str]:
    names = entry.get("tools")
    if names is None:
        return list(functions.tools)
    return [n for n in names if isinstance(n, str) and n in functions.tools] if isinstance(names, list) else []


def entry_tool_names(entry: dict[str, Any], functions: ProjectFunctions) -> list[str]:
    """The tools of an entry: its `tools` subset, or every tool of the project when absent."""
    return _tool_names(entry, functions)
