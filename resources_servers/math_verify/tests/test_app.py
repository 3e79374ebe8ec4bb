"""math_verify: answer extraction, math-verify equivalence and failure reasons, over HTTP (FastAPI TestClient)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.env.testing import assistant_response, client_fixture, server_client, text_verifier
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
app = import_file(SERVER_DIR / "app.py")
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1/2 + 1/4?"}]},
    "expected_answer": "\\frac{3}{4}",
}
client = client_fixture(SERVER_DIR)
verify = text_verifier(ROW, reasoning=True)


@pytest.mark.parametrize(
    ("text", "answer", "where"),
    [
        ("so \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}", "boxed"),
        ("\\boxed{1} then \\boxed{\\frac{a}{b}}", "\\frac{a}{b}", "boxed"),  # the last box, nested braces
        ("<think>\\boxed{9}</think> The answer is 0.75.", "0.75", "answer_phrase"),  # thinking is dropped
        ("**Final answer:** $x = 3$", "x = 3", "answer_phrase"),
        ("The answer is 42 because 6*7 = 42", "42", "answer_phrase"),
        ("3 apples and 1,234 pears", "1,234", "last_number"),
        ("it is 3/4", "3/4", "last_number"),
        ("no idea", None, "none"),
        ("\\boxed{5", "5", "last_number"),  # an unclosed box is no box
    ],
)
def test_extract_final_answer(text: str, answer: str | None, where: str) -> None:
    assert app.extract_final_answer(text) == (answer, app.Extraction(where))


@pytest.mark.parametrize(
    ("text", "expected_answer"),
    [
        ("\\boxed{0.75}", "\\frac{3}{4}"),  # decimal vs LaTeX fraction
        ("\\boxed{\\dfrac{6}{8}}", "3/4"),
        ("The answer is $\\frac{1}{\\sqrt{2}}$.", "\\frac{\\sqrt{2}}{2}"),  # symbolic
        ("\\boxed{x(x+2)}", "x^2+2x"),
        ("so x = 7", "7"),
        ("Answer: 1,234", "1234"),
        ("\\boxed{-4}", "-4"),
    ],
)
def test_equivalent_answers_score_1(client: TestClient, text: str, expected_answer: str) -> None:
    answer = verify(client, text, expected_answer=expected_answer)
    assert (answer["reward"], answer["failure_reason"]) == (1.0, None), answer


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("\\boxed{0.7}", "mismatch"),
        ("The answer is 3/5.", "mismatch"),
        ("I do not know.", "no_answer"),
        ("", "no_answer"),
        ("\\boxed{???}", "unparsable"),
        ("\\boxed{" + "1+" * 600 + "1}", "too_long"),
    ],
)
def test_wrong_or_bad_answers_score_0_with_a_reason(client: TestClient, text: str, reason: str) -> None:
    answer = verify(client, text)
    assert (answer["reward"], answer["failure_reason"]) == (0.0, reason), answer


def test_verifier_fields(client: TestClient) -> None:
    answer = verify(client, "The answer is $\\frac{6}{8}$.")
    assert answer["extracted_answer"] == "\\frac{6}{8}" and answer["extraction"] == "answer_phrase"
    assert answer["parsed_answer"] == "3/4" and answer["expected_answer"] == ROW["expected_answer"]


@pytest.mark.parametrize(
    "response_body",
    [
        {"output": "not a list"},
        {"output": [1, None, {"type": "message", "content": "text"}]},
        {},
        {"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": 42}]}]},
    ],
)
def test_malformed_model_output_scores_0(client: TestClient, response_body: dict[str, Any]) -> None:
    answer = client.post("/verify", json={**ROW, "response": response_body})
    assert (
        answer.status_code == 200 and answer.json()["reward"] == 0.0 and answer.json()["failure_reason"] == "no_answer"
    )


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"expected_answer": None}, "expected_answer"),
        ({"expected_answer": 3}, "expected_answer"),
        ({"expected_answer": ""}, "expected_answer"),
        ({"expected_answer": "???"}, "no math expression"),
    ],
)
def test_malformed_rows_are_422(client: TestClient, row: dict[str, Any], error: str) -> None:
    answer = client.post("/verify", json={**ROW, **row, "response": assistant_response("\\boxed{1}", reasoning=True)})
    assert answer.status_code == 422 and error in answer.text


def test_a_hung_grading_process_is_killed_after_timeout_s() -> None:
    # sympy evaluates 9^(9^(9^9)) in C, where no signal interrupts it: only killing the process stops it.
    with server_client(SERVER_DIR, {"timeout_s": 0.5}) as client:
        start = time.monotonic()
        answer = verify(client, "\\boxed{9^{9^{9^{9}}}}", expected_answer="3")
        assert time.monotonic() - start < 3
    assert (answer["reward"], answer["failure_reason"]) == (0.0, "timeout")


def test_aggregate_metrics_counts_failure_reasons(client: TestClient) -> None:
    rows = [
        {"reward": 1.0, "failure_reason": None},
        {"reward": 0.0, "failure_reason": "mismatch"},
        {"reward": 0.0, "failure_reason": "mismatch"},
    ]
    metrics = client.post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert metrics["failure_reasons"] == {"mismatch": 2} and metrics["mean_reward"] == pytest.approx(1 / 3)


def test_bundled_expected_answers_are_parsable() -> None:
    rows = [
        json.loads(line)
        for name in ("example.jsonl", "math_tasks.jsonl")
        for line in (SERVER_DIR / "data" / name).read_text().splitlines()
    ]
    assert len(rows) == 65
    for row in rows:  # the generator's own answer verifies against itself
        assert app.grade(row["expected_answer"], row["expected_answer"])["equivalent"], row


@pytest.mark.integration  # slow (importing reasoning_gym takes ~10 s here), not a process test
def test_prepare_reproduces_the_bundled_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("reasoning_gym")
    prepare = import_file(SERVER_DIR / "prepare.py")
    monkeypatch.setattr(prepare, "DATA_DIR", tmp_path)
    prepare.main()
    for name in ("example.jsonl", "math_tasks.jsonl"):
        assert (tmp_path / name).read_bytes() == (SERVER_DIR / "data" / name).read_bytes(), name
