"""The tools of a resources server: the `@tool` marker, the per-rollout `Session` a tool (and `verify`) may take,
and a tool method's arguments as a pydantic model and as the JSON schema of a Responses API function tool.
`Session` itself is `nemo_gym.serving.server.Session`; `nemo_gym.env` gathers what an environment's author imports."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from nemo_gym.serving.server import Session

__all__ = ["tool", "tool_methods", "arguments_model", "function_tool_schema"]


def tool(fn: Callable) -> Callable:
    """Mark a method of a ResourcesServer as a tool: route `POST /<method name>`, description = docstring,
    JSON schema of the arguments from the type hints. A parameter annotated `Session` receives the
    rollout's session state and is not part of the schema."""
    fn.__nemo_gym_tool__ = True
    return fn


def tool_methods(server: object) -> dict[str, Callable]:
    """The `@tool` methods of a resources server, bound, by name."""
    tools = {}
    for name, member in inspect.getmembers(type(server), predicate=inspect.isfunction):
        if getattr(member, "__nemo_gym_tool__", False):
            tools[name] = getattr(server, name)
    return tools


def arguments_model(name: str, fn: Callable) -> tuple[type[BaseModel], str | None]:
    """A pydantic model of the tool's arguments, and the name of its Session parameter if any."""
    hints = get_type_hints(fn, include_extras=True)  # keep Annotated constraints (patterns, ranges)
    fields: dict[str, Any] = {}
    session_param = None
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is Session:
            session_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return model, session_param


def function_tool_schema(name: str, fn: Callable) -> dict[str, Any]:
    """The Responses API function tool (`{type, name, description, parameters, strict}`) of a tool method."""
    model, _ = arguments_model(name, fn)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    schema["additionalProperties"] = False
    return {
        "type": "function",
        "name": name,
        "description": inspect.getdoc(fn) or "",
        "parameters": schema,
        "strict": True,
    }
