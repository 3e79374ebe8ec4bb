"""equivalence_rule: each rule, row overrides and failure reasons, over HTTP (FastAPI TestClient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.env.testing import assistant_response, client_fixture, server_client, text_verifier
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
app = import_file(SERVER_DIR / "app.py")
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1/4 + 2/4?"}]},
    "expected_answer": "3/4",
}
client = client_fixture(SERVER_DIR)
verify = text_verifier(ROW)


@pytest.mark.parametrize(
    ("answer", "reference", "rule"),
    [
        ("3/4", "3/4", "exact"),
        ("1,234", "1234", "numeric"),
        ("−3", "-3.0", "numeric"),  # Unicode minus
        ("$5$", "5", "numeric"),
        ("0.75", "3/4", "fraction_decimal"),
        ("\\frac{6}{8}", "0.75", "fraction_decimal"),
        ("1 1/2", "1.5", "fraction_decimal"),
        ("0.2", "20%", "percentage"),
        ("20", "20%", "percentage"),  # percent_accepts_bare_number
        ("20 percent", "20\\%", "percentage"),
        ("1.5 km", "1500 m", "units"),
        ("30 km/h", "8.333333 m/s", "units"),
        ("120 kilometers", "120 km", "units"),
        ("True", "yes", "boolean"),
        ("Correct.", "yes", "boolean"),
        ("The Eiffel Tower!", "eiffel tower", "normalized_text"),
        ("\\text{Paris}", "paris", "normalized_text"),
        ("8, 4, 6", "4, 6, 8", "unordered_list"),
        ("[6; 4 and 8]", "{4, 6, 8}", "unordered_list"),
        ("0.5, 3/4", "3/4, 1/2", "unordered_list"),  # items compared by the scalar rules
    ],
)
def test_equivalent_by_rule(client: TestClient, answer: str, reference: str, rule: str) -> None:
    result = verify(client, f"\\boxed{{{answer}}}", expected_answer=reference)
    assert (result["reward"], result["matched_rule"]) == (1.0, rule), result


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("-3", "3"),  # numbers are never compared as text
        ("0.7", "3/4"),
        ("1.5 km", "1500 s"),  # different dimensions
        ("120", "120 km"),  # a missing unit
        ("no", "yes"),
        ("Lyon", "Paris"),
        ("2, 2, 3", "2, 3, 3"),  # multisets
        ("4, 6", "4, 6, 8"),
        ("25", "20%"),
    ],
)
def test_not_equivalent(client: TestClient, answer: str, reference: str) -> None:
    result = verify(client, f"\\boxed{{{answer}}}", expected_answer=reference)
    assert (result["reward"], result["matched_rule"], result["failure_reason"]) == (0.0, None, "mismatch"), result


@pytest.mark.parametrize(
    ("answer", "row", "reward"),
    [
        ("0.428", {"expected_answer": "0.43"}, 0.0),
        ("0.428", {"expected_answer": "0.43", "equivalence": {"abs_tol": 0.005}}, 1.0),
        ("8, 4, 6", {"expected_answer": "4, 6, 8", "equivalence": {"ordered_lists": True}}, 0.0),
        (
            "4, 6, 8",
            {
                "expected_answer": "4, 6, 8 ",
                "equivalence": {"ordered_lists": True, "rules": ["ordered_list", "numeric"]},
            },
            1.0,
        ),
        ("0.75", {"equivalence": {"rules": ["exact", "numeric"]}}, 0.0),  # fraction_decimal disabled
        ("20", {"expected_answer": "20%", "equivalence": {"percent_accepts_bare_number": False}}, 0.0),
        ("Peking", {"expected_answer": ["Beijing", "Peking"]}, 1.0),  # any reference
    ],
)
def test_row_overrides(client: TestClient, answer: str, row: dict[str, Any], reward: float) -> None:
    assert verify(client, f"\\boxed{{{answer}}}", **row)["reward"] == reward


def test_server_defaults() -> None:
    with server_client(SERVER_DIR, {"equivalence": {"abs_tol": 0.01}}) as client:
        assert verify(client, "\\boxed{0.745}")["matched_rule"] == "fraction_decimal"
        assert verify(client, "\\boxed{0.745}", equivalence={"abs_tol": 0.0})["reward"] == 0.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [("", "no_answer"), ("\\boxed{" + "1, " * 1000 + "}", "too_long"), ("\\boxed{0.7}", "mismatch")],
)
def test_failure_reasons(client: TestClient, text: str, reason: str) -> None:
    assert (verify(client, text)["reward"], verify(client, text)["failure_reason"]) == (0.0, reason)


@pytest.mark.parametrize("response_body", [{"output": "x"}, {"output": [None, {"type": "message", "content": 3}]}, {}])
def test_malformed_model_output_scores_0(client: TestClient, response_body: dict[str, Any]) -> None:
    answer = client.post("/verify", json={**ROW, "response": response_body})
    assert answer.status_code == 200 and answer.json()["failure_reason"] == "no_answer"


def test_extraction_order() -> None:
    assert app.extract_answer("<think>\\boxed{1}</think>The answer is: **3/4**") == "3/4"
    assert app.extract_answer("x\n<answer> 0.75 </answer>\nbye") == "0.75"
    assert app.extract_answer("Let me think.\n3/4") == "3/4"


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"expected_answer": None}, "expected_answer"),
        ({"expected_answer": []}, "at least one"),
        ({"expected_answer": ["3/4", " "]}, "at least one"),
        ({"equivalence": {"rules": ["fuzzy"]}}, "rules"),
        ({"equivalence": {"tolerance": 1}}, "tolerance"),
        ({"equivalence": {"rel_tol": -1}}, "rel_tol"),
    ],
)
def test_malformed_rows_are_422(client: TestClient, row: dict[str, Any], error: str) -> None:
    answer = client.post("/verify", json={**ROW, **row, "response": assistant_response("\\boxed{3/4}")})
    assert answer.status_code == 422 and error in answer.text, answer.text


def test_aggregate_metrics_counts_rules(client: TestClient) -> None:
    rows = [
        {"reward": 1.0, "matched_rule": "units"},
        {"reward": 1.0, "matched_rule": "units"},
        {"reward": 0.0, "failure_reason": "mismatch"},
    ]
    metrics = client.post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert metrics["matched_rules"] == {"units": 2} and metrics["failure_reasons"] == {"mismatch": 1}


ALTERNATIVES = {
    "fraction": lambda r: str(float(eval(r))),
    "percent": lambda r: str(int(r[:-1]) / 100),  # noqa: S307 a/b
    "distance": lambda r: f"{int(r.split()[0]) * 1000} m",
    "parity": lambda r: {"yes": "True", "no": "False"}[r],
    "evens": lambda r: ", ".join(reversed(r.split(", "))),
    "division": lambda r: f"{float(r) + 0.004:.3f}",
}


def test_bundled_tasks_accept_an_equivalent_form(client: TestClient) -> None:
    rows = import_file(SERVER_DIR / "prepare.py").build_rows()
    assert len(rows) == 60
    for row in rows:
        other = ALTERNATIVES[row["task_id"].split("-")[0]](row["expected_answer"])
        assert verify(client, f"\\boxed{{{other}}}", **row)["reward"] == 1.0, (row, other)


def test_prepare_reproduces_the_bundled_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare = import_file(SERVER_DIR / "prepare.py")
    monkeypatch.setattr(prepare, "DATA_DIR", tmp_path)
    prepare.main()
    for name in ("example.jsonl", "equivalence_rule_tasks.jsonl"):
        assert (tmp_path / name).read_bytes() == (SERVER_DIR / "data" / name).read_bytes(), name
