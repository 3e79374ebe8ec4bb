"""The helpers of nemo_gym.orchestration.folder_tests that server tests share: server_client, the Responses bodies,
post_verify and assert_verifier_cases, on a real server folder (string_match) over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.env.testing import assert_verifier_cases, assistant_response, episode_response, post_verify, server_client

STRING_MATCH = Path(__file__).resolve().parents[1] / "resources_servers" / "string_match"
ROW = {"responses_create_params": {"input": "Capital of France?"}, "expected_answer": "Paris"}


def test_server_client_serves_the_folder_with_its_config() -> None:
    with server_client(STRING_MATCH, {"max_answer_chars": 3}, name="sm") as client:
        assert client.server.name == "sm" and client.server.config.max_answer_chars == 3
        assert client.get("/health").json()["status"] == "ok"
        assert (
            post_verify(client, {**ROW, "response": assistant_response("\\boxed{Paris}")})["failure_reason"]
            == "too_long"
        )
    with server_client(STRING_MATCH) as client:
        assert client.server.name == "string_match"
        assert (
            post_verify(client, {**ROW, "response": assistant_response("x", "\\boxed{paris}", reasoning=True)})[
                "reward"
            ]
            == 1.0
        )
        with pytest.raises(AssertionError, match="expected_answer"):
            post_verify(client, {"responses_create_params": {"input": "q"}, "response": assistant_response("x")})  # 422


def test_response_bodies() -> None:
    body = assistant_response("a", 5, reasoning=True)
    assert [item["type"] for item in body["output"]] == ["reasoning", "message", "message"]
    assert body["output"][2]["content"][0]["text"] == 5  # any JSON value, to test malformed output
    roles = [item["role"] for item in episode_response("x", "y")["output"]]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_assert_verifier_cases() -> None:
    assert assert_verifier_cases(STRING_MATCH, at_least=10) >= 10
    with pytest.raises(AssertionError, match="at least 1000"):
        assert_verifier_cases(STRING_MATCH, at_least=1000)
