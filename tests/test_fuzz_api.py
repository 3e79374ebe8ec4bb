"""Fuzzing of every kind of server's HTTP API from its own OpenAPI document (schemathesis).

Resources servers (example_single_tool_call, mcqa, workplace_tools), the scripted model server, simple_agent
(with the scripted model and a resources server behind it) and the head server, each on real uvicorn on
127.0.0.1. Every generated request, valid or not, must get an answer below 500 that conforms to the declared
status codes, content types and schemas, and the servers must stay up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from live_servers import serve
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app
from nemo_gym.serving.retry_policy import ClientTimeouts

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
RESOURCES = ["example_single_tool_call", "mcqa", "workplace_tools"]
SERVERS = [*RESOURCES, "scripted_model", "simple_agent", "head"]
MAX_EXAMPLES = 25  # per operation: the whole test stays under a minute
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def _server(folder: str, config: dict, addresses: dict[str, str] | None = None):
    cls = load_server_class(REPO / folder / "app.py")
    client = ServerClient(addresses=addresses or {}, timeouts=ClientTimeouts(read_s=10, max_retries=0))
    return cls(config, name=Path(folder).name, client=client)


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """Every server under test, by name → base URL."""
    with ExitStack() as stack:
        found = {
            name: stack.enter_context(serve(_server(f"resources_servers/{name}", {}).build_app())) for name in RESOURCES
        }
        found["scripted_model"] = stack.enter_context(
            serve(_server("responses_api_models/scripted_model", {}).build_app())
        )
        agent_config = {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
        }
        addresses = {"env": found["example_single_tool_call"], "policy_model": found["scripted_model"]}
        found["simple_agent"] = stack.enter_context(
            serve(_server("responses_api_agents/simple_agent", agent_config, addresses).build_app())
        )
        found["head"] = stack.enter_context(serve(build_head_app()))
        yield found
        for name, url in found.items():  # no server died under the fuzzing
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200, name


def _fuzz_operation(operation) -> None:
    strategy = operation.as_strategy(GenerationMode.POSITIVE)
    if operation.body:  # bodies that break the declared schema too: they must get a 4xx
        strategy = strategy | operation.as_strategy(GenerationMode.NEGATIVE)

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=True,
    )
    def fuzz(case) -> None:
        case.call_and_validate(checks=CHECKS, timeout=20)

    fuzz()


@pytest.mark.long
@pytest.mark.parametrize("server", SERVERS)
def test_no_server_error_and_answers_follow_the_schema(urls, server):
    api = schemathesis.openapi.from_url(f"{urls[server]}/openapi.json")
    failures = []
    for result in api.get_all_operations():
        operation = result.ok()
        try:
            _fuzz_operation(operation)
        except Exception as exc:  # every operation is fuzzed; the failures are reported together
            failures.append(f"{operation.label}: {exc}"[:3000])
    assert not failures, "\n\n".join(failures)
