"""Answer extraction and verify of mcqa, over HTTP (FastAPI TestClient, no mocks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.env.testing import assistant_response, post_verify, server_client

SERVER_DIR = Path(__file__).resolve().parents[1]
OPTIONS = [{"A": "Circle"}, {"B": "Square"}, {"C": "Triangle"}, {"D": "Hexagon"}, {"E": "Polygenic risk score"}]
ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Which shape has four sides?\nA: Circle\nB: Square\n..."}]
    },
    "options": OPTIONS,
    "expected_answer": "B",
    "grading_mode": "strict_single_letter_boxed",
    "uuid": "test-uuid",
}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with server_client(SERVER_DIR) as client:
        yield client


response = assistant_response


def verify(client: TestClient, text: str, **row: Any) -> dict[str, Any]:
    return post_verify(client, {**ROW, **row, "response": response(text)})


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        (r"\boxed{B}", "B"),
        (r"Final: \boxed{ [C] }", "C"),
        (r"\boxed{\text{E}}", "E"),
        (r"\[ \boxed{E: \text{Polygenic risk score}} \]", "E"),
        (r"\boxed{D) Hexagon}", "D"),
        (r"First \boxed{C}, on reflection \boxed{B}", "B"),  # the last box wins
        (r"\boxed{Square}", None),  # option text is lenient_boxed's job
        (r"\boxed{A polygenic risk score}", None),  # a sentence-initial capital is not a label
        (r"\boxed{F}", None),  # not an option letter
        (r"\boxed{b}", None),  # strict: upper-case only
        (r"\boxed{B", None),  # unclosed
        ("The answer is B.", None),
    ],
)
def test_strict_single_letter_boxed(client: TestClient, text: str, letter: str | None) -> None:
    answer = verify(client, text, expected_answer=letter or "B")
    assert answer["extracted_answer"] == letter
    assert answer["reward"] == (1.0 if letter else 0.0)


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        (r"First \boxed{C}, on reflection \boxed{B}", "C"),  # the first box holding a lone letter
        (r"\boxed{E: Polygenic risk score}", None),
        (r"\boxed{\text{E}}", None),
    ],
)
def test_legacy_boxed_parsing(text: str, letter: str | None) -> None:
    with server_client(SERVER_DIR, {"legacy_boxed_parsing": True}) as client:
        assert verify(client, text)["extracted_answer"] == letter


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        (r"\boxed{B}", "B"),
        (r"\boxed{Square}", "B"),
        (r"\boxed{\text{  triangle }}", "C"),
        (r"\boxed{Square or Circle}", None),  # two options match
        ("Square", None),  # outside a box
    ],
)
def test_lenient_boxed(client: TestClient, text: str, letter: str | None) -> None:
    assert verify(client, text, grading_mode="lenient_boxed")["extracted_answer"] == letter


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: B", "B"),
        ("answer : square", "B"),
        (r"Answer: \text{C}", "C"),
        ("Answer: B because", None),
        ("B", None),
    ],
)
def test_lenient_answer_colon(client: TestClient, text: str, letter: str | None) -> None:
    assert verify(client, text, grading_mode="lenient_answer_colon")["extracted_answer"] == letter


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("**Answer:** B", "B"),
        ("Answer: B because four sides", "B"),
        ("Answer: A\nOn second thought, Answer: C", "C"),  # the last payload wins
        ("Answer: A or B", None),  # a list is no answer
        ("Answer: Ｃ", "C"),  # full-width letter, NFKC
        ("الإجابة Answer: ب", "B"),  # Arabic answer letter
        ("Answer: the one with Z sides", None),
    ],
)
def test_lenient_answer_colon_md_from_server_config(text: str, letter: str | None) -> None:
    with server_client(SERVER_DIR, {"grading_mode": "lenient_answer_colon_md"}) as client:
        # The server's grading_mode overrides the row's.
        assert verify(client, text, grading_mode="strict_single_letter_boxed")["extracted_answer"] == letter


def test_answer_prefix_then_boxed_fallback() -> None:
    with server_client(SERVER_DIR, {"grading_mode": "lenient_answer_colon_md"}) as client:
        metadata = {"answer_prefix": "Final choice -"}
        assert verify(client, "Final choice - D\nthanks", template_metadata=metadata)["extracted_answer"] == "D"
        assert verify(client, r"so \boxed{C}", template_metadata=metadata)["extracted_answer"] == "C"
        assert verify(client, r"so \boxed{C}")["extracted_answer"] is None  # no prefix, no fallback


@pytest.mark.parametrize(
    ("regex", "text", "letter"),
    [
        (r"ANSWER IS\s*([A-Za-z])", "answer is a... no wait, ANSWER IS D", "D"),  # last match, any case
        ([r"Choice:\s*([A-Z])", r"Pick\s+(\w+)"], "Pick square", "B"),  # list; option text
        (r"Choice:\s*([A-Za-z])", "Choice: Z", "Z"),  # a lone letter is trusted
        (r"([", r"\boxed{B}", "B"),  # invalid regex: grading mode instead
    ],
)
def test_template_metadata_output_regex(client: TestClient, regex: Any, text: str, letter: str) -> None:
    assert verify(client, text, template_metadata={"output_regex": regex})["extracted_answer"] == letter


def test_text_of_all_assistant_messages_is_read(client: TestClient) -> None:
    answer = client.post("/verify", json={**ROW, "response": response("Thinking...", r"\boxed{B}")}).json()
    assert answer["extracted_answer"] == "B"


def test_verifier_fields(client: TestClient) -> None:
    answer = verify(client, "no idea", expected_answer=" b ")
    assert answer["expected_answer"] == "B"
    assert "extracted_answer" in answer and answer["extracted_answer"] is None  # null, as NeMo Gym writes it
    assert answer["uuid"] == "test-uuid" and answer["options"] == OPTIONS
    assert verify(client, "   ")["reward"] == 0.0


def test_without_options_no_letter_is_allowed(client: TestClient) -> None:
    assert verify(client, r"\boxed{B}", options=None)["extracted_answer"] is None


def test_without_gold_the_reward_is_zero(client: TestClient) -> None:
    answer = verify(client, r"\boxed{B}", expected_answer=None)
    assert answer["reward"] == 0.0 and answer["expected_answer"] == ""


@pytest.mark.parametrize(
    "row", [{"grading_mode": "lenient_answer_colon_md"}, {"grading_mode": "fuzzy"}, {"options": "A,B"}]
)
def test_malformed_rows_are_422(client: TestClient, row: dict[str, Any]) -> None:
    assert client.post("/verify", json={**ROW, **row, "response": response(r"\boxed{B}")}).status_code == 422


def test_aggregate_metrics_counts_no_answers(client: TestClient) -> None:
    rows = [{"reward": 1.0, "extracted_answer": "B"}, {"reward": 0.0, "extracted_answer": None}]
    metrics = client.post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert metrics["mean_reward"] == 0.5 and metrics["no_answer_rate"] == 0.5
