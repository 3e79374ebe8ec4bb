"""The server base classes: tool routes and schemas, sessions by header or cookie, typed verify requests."""

from __future__ import annotations

import datetime
import time

from fastapi.testclient import TestClient

from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving.server import Session


class CountingRequest(VerifyRequest):
    expected_count: int


class Counter(ResourcesServer):
    verify_request_type = CountingRequest

    async def seed_session(self, row, session: Session) -> dict:
        session["count"] = row.get("initial_count", 0)
        return {"count": session["count"]}

    @tool
    async def add(self, amount: int, session: Session, note: str = "") -> dict:
        """Add `amount` to the counter."""
        session["count"] += amount
        return {"count": session["count"]}

    @tool
    def slow_echo(self, text: str) -> str:
        """A plain (blocking) function tool."""
        time.sleep(0.01)
        return text

    async def verify(self, request: CountingRequest, session: Session) -> VerifyResult:
        return VerifyResult(reward=float(session.get("count") == request.expected_count), count=session.get("count"))


def test_tool_schema_comes_from_hints_and_docstring():
    schemas = {s["name"]: s for s in Counter().tool_schemas()}
    assert schemas["add"] == {
        "type": "function",
        "name": "add",
        "description": "Add `amount` to the counter.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "note": {"type": "string", "default": ""}},
            "required": ["amount"],
            "additionalProperties": False,
        },
    }
    assert set(schemas) == {"add", "slow_echo"}


def test_sessions_by_header_and_by_cookie():
    with TestClient(Counter().build_app()) as client:
        client.post("/seed_session", json={"initial_count": 3}, headers={"X-Session-Id": "a"})
        client.post("/seed_session", json={"initial_count": 100}, headers={"X-Session-Id": "b"})
        assert client.post("/add", json={"amount": 2}, headers={"X-Session-Id": "a"}).json() == {"count": 5}
        assert client.post("/add", json={"amount": 1}, headers={"X-Session-Id": "b"}).json() == {"count": 101}
        body = {"responses_create_params": {"input": []}, "response": {"output": []}, "expected_count": 5}
        assert client.post("/verify", json=body, headers={"X-Session-Id": "a"}).json()["reward"] == 1.0
        # a client that keeps only cookies (NeMo Gym's style) gets its session from the seed answer's cookie
        with TestClient(client.app) as cookie_client:
            cookie_client.post("/seed_session", json={"initial_count": 7})
            assert cookie_client.post("/add", json={"amount": 1}).json() == {"count": 8}
        assert client.post("/close_session", headers={"X-Session-Id": "a"}).status_code == 200
        assert client.post("/close_session", headers={"X-Session-Id": "a"}).status_code == 200  # idempotent


def test_verify_can_end_the_session():
    server = Counter()
    body = {"responses_create_params": {"input": []}, "response": {"output": []}, "expected_count": 0}
    with TestClient(server.build_app()) as client:
        for session in ("kept", "ended"):
            client.post("/seed_session", json={}, headers={"X-Session-Id": session})
        assert client.post("/verify", json=body, headers={"X-Session-Id": "kept"}).json()["reward"] == 1.0
        assert (
            client.post("/verify?close_session=true", json=body, headers={"X-Session-Id": "ended"}).json()["reward"]
            == 1.0
        )
        assert set(server.sessions) == {"kept"}
        refused = client.post("/verify?close_session=maybe", json=body, headers={"X-Session-Id": "kept"})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["close_session"]
        assert set(server.sessions) == {"kept"}
        [parameter] = client.get("/openapi.json").json()["paths"]["/verify"]["post"]["parameters"]
        assert (
            parameter["name"] == "close_session"
            and parameter["in"] == "query"
            and parameter["schema"]["type"] == "boolean"
        )


def test_bad_input_gets_422_never_500():
    with TestClient(Counter().build_app(), raise_server_exceptions=False) as client:
        client.post("/seed_session", json={}, headers={"X-Session-Id": "s"})
        assert client.post("/add", json={"amount": "many"}, headers={"X-Session-Id": "s"}).status_code == 422
        assert client.post("/add", json={"amount": 1, "extra": 2}, headers={"X-Session-Id": "s"}).status_code == 422
        assert client.post("/add", content=b"{not json", headers={"X-Session-Id": "s"}).status_code == 422
        missing = client.post("/verify", json={"responses_create_params": {}, "response": {}})
        assert missing.status_code == 422 and "expected_count" in missing.text
        assert client.post("/slow_echo", json={"text": "hi"}).json() == "hi"


def test_a_tool_takes_no_boolean_as_a_number():
    """A tool's arguments are validated as NeMo Gym's FastAPI routes validate them (`"2"` for an `int` is 2, a date
    string a date), except that a JSON boolean is no number: lax pydantic took `true` as 1; it is a 422 naming the
    argument, and the call runs nothing."""

    class Dated(Counter):
        @tool
        def stamp(self, day: datetime.date, scale: float = 1.0, exact: bool = False) -> str:
            """A tool of a date, a float and a bool."""
            return f"{day.isoformat()} x{scale} {exact}"

    with TestClient(Dated().build_app()) as client:
        client.post("/seed_session", json={"initial_count": 1}, headers={"X-Session-Id": "s"})
        for amount in (True, False, 2.5, None, "two"):
            refused = client.post("/add", json={"amount": amount}, headers={"X-Session-Id": "s"})
            assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["amount"], (amount, refused)
            assert "input" not in refused.json()["detail"][0]
        assert client.post("/add", json={"amount": 2}, headers={"X-Session-Id": "s"}).json() == {"count": 3}
        assert client.post("/add", json={"amount": "2", "note": "true"}, headers={"X-Session-Id": "s"}).json() == {
            "count": 5
        }
        assert client.post("/stamp", json={"day": "2026-11-29", "scale": 2, "exact": True}).json() == (
            "2026-11-29 x2.0 True"
        )
        refused = client.post("/stamp", json={"day": "2026-11-29", "scale": False})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["scale"]


class CounterSeed(SeedRequest):
    initial_count: int


class TypedCounter(Counter):
    seed_request_type = CounterSeed

    async def seed_session(self, row: CounterSeed, session: Session) -> dict:
        session["count"] = row.initial_count
        return {"count": row.initial_count, "kept": row.model_extra}


def test_seed_request_type_types_the_row_and_rejects_a_bad_one():
    with TestClient(TypedCounter().build_app()) as client:
        answer = client.post("/seed_session", json={"initial_count": 3, "task_id": "t1"}, headers={"X-Session-Id": "a"})
        assert answer.json() == {"count": 3, "kept": {"task_id": "t1"}}
        for row in ({}, {"initial_count": "three"}):
            answer = client.post("/seed_session", json=row, headers={"X-Session-Id": "b"})
            assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["initial_count"], answer.text
        assert client.post("/add", json={"amount": 2}, headers={"X-Session-Id": "a"}).json() == {"count": 5}


def test_row_schema_has_the_verify_and_seed_task_fields():
    schema = TypedCounter().row_schema()
    assert {"expected_count", "initial_count", "responses_create_params"} <= set(
        schema["properties"]
    ) and "response" not in schema["properties"]
    assert sorted(schema["required"]) == ["expected_count", "initial_count", "responses_create_params"]
    assert sorted(Counter().row_schema()["required"]) == ["expected_count", "responses_create_params"]
