"""OpenAPI declarations of the framework's routes: request body schemas and error answers.

The routes parse their JSON bodies themselves (`nemo_gym.serving.server.request_body`), so FastAPI cannot infer their
schemas; these helpers declare them through `openapi_extra`, without changing how a request is handled, so that
`/openapi.json` documents the real contract (and API fuzzers generate meaningful bodies).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

__all__ = ["AGGREGATE_BODY", "ERROR_RESPONSES", "json_body", "model_schema", "add_components", "row_schema"]

_REF_TEMPLATE = "#/components/schemas/{model}"
_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "`{detail}` for a rejected request, `{error: {type, server, message}}` for a failure of a server called"
    ),
    "anyOf": [{"required": ["detail"]}, {"required": ["error"]}],
}
_ERRORS = {
    "413": "request body larger than the server's max_body_mb",
    "415": "content type other than application/json",
    "422": "body not a valid JSON object of the declared schema",
    "424": "a server called rejected the request (4xx)",
}
ERROR_RESPONSES: dict[str, Any] = {
    code: {"description": text, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for code, text in _ERRORS.items()
}

# `POST /aggregate_metrics` of a resources server
AGGREGATE_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["verify_responses"],
    "properties": {
        "verify_responses": {"type": "array", "items": {"type": "object", "properties": {"reward": {"type": "number"}}}}
    },
}


def json_body(
    schema: dict[str, Any], required: bool = False, streams: bool = False, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    """`openapi_extra` of a route whose JSON body follows `schema` (an empty body reads as `{}` unless `required`);
    `streams`: the route answers `stream: true` with server-sent events; `errors`: the route's own error statuses
    (`{status: when}`), besides the framework's."""
    responses = dict(ERROR_RESPONSES)
    for code, text in (errors or {}).items():
        responses[code] = {"description": text, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    if streams:
        responses["200"] = {
            "description": "the answer, or its events for `stream: true`",
            "content": {"text/event-stream": {}},
        }
    return {
        "requestBody": {"required": required, "content": {"application/json": {"schema": schema}}},
        "responses": responses,
    }


def model_schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of `model` with its sub-models moved into `components` (refs point at them there)."""
    schema = model.model_json_schema(ref_template=_REF_TEMPLATE)
    components.update(schema.pop("$defs", {}))
    return schema


def add_components(app: FastAPI, components: dict[str, Any]) -> None:
    """Add `components` to `components/schemas` of the app's OpenAPI document (FastAPI's own names win)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            for name, schema in components.items():
                schemas.setdefault(name, schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def row_schema(verify_type: type[BaseModel], seed_type: type[BaseModel] | None = None) -> dict[str, Any]:
    """JSON Schema of a dataset row of a resources server: its `/verify` body model without `response`, plus
    the fields of its `/seed_session` body model (when it has one) that the verify model lacks."""
    schema = verify_type.model_json_schema()
    properties = schema.setdefault("properties", {})
    properties.pop("response", None)
    required = [name for name in schema.get("required", []) if name != "response"]
    if seed_type is not None:
        seed = seed_type.model_json_schema()
        for name, field in seed.get("properties", {}).items():
            properties.setdefault(name, field)
        if seed.get("$defs"):
            schema.setdefault("$defs", {}).update(seed["$defs"])
        required += [name for name in seed.get("required", []) if name not in required]
    schema["required"] = required
    return schema
