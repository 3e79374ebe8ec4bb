"""`@reward` and `@tool`: ReinforceNow's decorators for a project's `rewards.py` and `tools.py`.

    from nemo_gym.rnow import reward, tool, RewardArgs     # or, unchanged from rnow: from rnow.core import ...

    @reward(precondition=True)
    def has_answer(args: RewardArgs, messages: list) -> float:
        "Gate: the last message holds an answer."
        return float("Answer:" in messages[-1]["content"])

    @tool
    def add(a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: the first term
            b: the second term
        '''
        return a + b

The decorators only mark a function (its spec in `__rnow_reward__` / `__rnow_tool__`) and check its shape;
there is no global registry: the project loader (`nemo_gym.rnow.loading`) collects the marked functions of
the project's files. Departures from rnow: the type hints of a reward's two parameters are not enforced
(only their number), and `timeout` is in seconds as a float.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

__all__ = ["RewardArgs", "ToolArgs", "RewardSpec", "ToolSpec", "reward", "tool", "get_response", "docstring_arguments"]

DEFAULT_REWARD_TIMEOUT_S = 60.0  # rnow's `reward_timeout` default


class RewardArgs(BaseModel):
    """What a reward gets besides the messages: the entry's `metadata` and `variables` (and `secrets`, always
    empty here: nothing is read from a `.env`)."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] = Field(default_factory=dict)
    variables: dict[str, Any] = Field(default_factory=dict)
    secrets: dict[str, Any] = Field(default_factory=dict)


class ToolArgs(BaseModel):
    """Given to a tool that declares a parameter named `args`: the entry's `metadata`."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class RewardSpec:
    """A reward function and its options. `fn(args, messages) -> float` in [0, 1], sync or async."""

    name: str
    fn: Callable[..., Any]
    precondition: bool = False
    sandbox: bool = False
    timeout_s: float | None = None  # None: the server's default (60 s)


@dataclass(frozen=True)
class ToolSpec:
    """A tool function, its Responses function-tool schema and options."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    sandbox: bool = False
    timeout_s: float | None = None
    takes_args: bool = False  # a parameter named `args` receives ToolArgs


def reward(
    fn: Callable | None = None, *, precondition: bool = False, sandbox: bool = False, timeout: float | None = None
) -> Callable:
    """Mark `fn(args: RewardArgs, messages: list) -> float` as a reward (`@reward` or `@reward(...)`).

    Args:
        precondition: a gate: when it returns 0 the total reward is 0 (else it counts like any other reward).
        sandbox: run it in the sandbox (the entry needs a `docker` field; see nemo_gym.rnow.sandboxed).
        timeout: seconds it may take (default 60); past it the rollout is a `reward_timeout` failure.

    Raises:
        TypeError: `fn` does not take exactly two parameters, or `timeout` is not positive.
    """
    if timeout is not None and not timeout > 0:
        raise TypeError(f"@reward(timeout={timeout!r}): the timeout must be a positive number of seconds")

    def mark(func: Callable) -> Callable:
        params = [
            p
            for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) != 2 or len(inspect.signature(func).parameters) != 2:
            raise TypeError(
                f"reward {func.__name__!r} must take exactly two parameters: (args: RewardArgs, messages: list) ->"
                " float"
            )
        func.__rnow_reward__ = RewardSpec(
            func.__name__, func, precondition, sandbox, None if timeout is None else float(timeout)
        )
        return func

    return mark(fn) if fn is not None else mark


def tool(fn: Callable | None = None, *, sandbox: bool = False, timeout: float | None = None) -> Callable:
    """Mark a typed, documented function as a tool (`@tool` or `@tool(...)`). Its JSON schema comes from the
    type hints, its description from the docstring, each argument's description from the docstring's `Args:`
    section. A parameter named `args` is not part of the schema: it receives `ToolArgs` (the entry's metadata).

    Raises:
        TypeError: no docstring, `*args`/`**kwargs`, a parameter without a type hint, or a bad `timeout`.
    """
    if timeout is not None and not timeout > 0:
        raise TypeError(f"@tool(timeout={timeout!r}): the timeout must be a positive number of seconds")

    def mark(func: Callable) -> Callable:
        schema, takes_args = tool_schema(func)
        func.__rnow_tool__ = ToolSpec(
            func.__name__, func, schema, sandbox, None if timeout is None else float(timeout), takes_args
        )
        return func

    return mark(fn) if fn is not None else mark


def tool_parameters(func: Callable) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """The schema parameters of a tool (all but `args`) and their resolved type hints.

    Raises:
        TypeError: `*args`/`**kwargs`, or a parameter without a type hint.
    """
    hints = get_type_hints(func, include_extras=True)
    params = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"tool {func.__name__!r}: *args and **kwargs are not allowed; declare each argument with its type"
            )
        if param.name == "args":
            continue
        if param.name not in hints:
            raise TypeError(
                f"tool {func.__name__!r}: parameter {param.name!r} has no type hint (the schema is built from them)"
            )
        params.append(param)
    return params, hints


def tool_schema(func: Callable) -> tuple[dict[str, Any], bool]:
    """(the Responses function tool `{type, name, description, parameters, strict}`, whether it takes `args`)."""
    doc = inspect.getdoc(func) or ""
    if not doc.strip():
        raise TypeError(f"tool {func.__name__!r} needs a docstring: it is the tool's description the model reads")
    params, hints = tool_parameters(func)
    described = docstring_arguments(doc)
    fields = {
        p.name: (
            hints[p.name],
            Field(... if p.default is inspect.Parameter.empty else p.default, description=described.get(p.name)),
        )
        for p in params
    }
    parameters = create_model(
        f"{func.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    ).model_json_schema()
    parameters.pop("title", None)
    for prop in parameters.get("properties", {}).values():
        prop.pop("title", None)
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    parameters["additionalProperties"] = False
    takes_args = "args" in inspect.signature(func).parameters
    # strict: false, since arguments with defaults are optional (OpenAI's strict mode requires all of them)
    return {
        "type": "function",
        "name": func.__name__,
        "description": docstring_summary(doc),
        "parameters": parameters,
        "strict": False,
    }, takes_args


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARGUMENT = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def docstring_summary(doc: str) -> str:
    """The docstring without its Google-style sections (`Args:`, `Returns:`, ...)."""
    lines = []
    for line in doc.splitlines():
        if _SECTION.match(line.strip()):
            break
        lines.append(line)
    return "\n".join(lines).strip()


def docstring_arguments(doc: str) -> dict[str, str]:
    """Argument descriptions of a Google-style `Args:` section: `name: text` or `name (type): text`, with
    continuation lines indented deeper joined by a space."""
    described: dict[str, str] = {}
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:", "Parameters:")), None)
    if start is None:
        return described
    indent, current = None, None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if _SECTION.match(line.strip()) or (indent is not None and depth < indent):
            break
        match = _ARGUMENT.match(line.strip())
        if match and (indent is None or depth == indent):
            indent, current = depth, match.group(1).lstrip("*")
            described[current] = match.group(3).strip()
        elif current is not None:
            described[current] = f"{described[current]} {line.strip()}".strip()
    return described


def get_response(messages: list[dict[str, Any]]) -> str:
    """Text of the last assistant message (trailing tool messages skipped; text parts joined), '' if none."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                return "".join(
                    part.get("text", "")
                    for part in content
                    if isinstance(part, dict) and part.get("type") in ("text", "output_text")
                )
            return str(content)
    return ""
