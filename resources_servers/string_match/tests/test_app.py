"""string_match: extraction, the four match modes, row overrides and failure reasons, over HTTP (TestClient)."""

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
    "responses_create_params": {"input": [{"role": "user", "content": "What is the capital of France?"}]},
    "expected_answer": "Paris",
}
client = client_fixture(SERVER_DIR)
verify = text_verifier(ROW)


@pytest.mark.parametrize(
    ("text", "extract", "answer"),
    [
        ("It is Paris.\n\\boxed{Paris}", "auto", "Paris"),
        ("<think>\\boxed{Lyon}</think><answer> Paris </answer>", "auto", "Paris"),
        ("So the answer is: **Paris**.", "auto", "Paris"),
        ("Hmm.\nParis", "auto", "Paris"),
        ("Hmm.\nParis", "full", "Hmm.\nParis"),
        ("Paris", "boxed", None),
        ("   ", "auto", None),
    ],
)
def test_extract_answer(text: str, extract: str, answer: str | None) -> None:
    assert app.extract_answer(text, extract) == answer


@pytest.mark.parametrize(
    ("text", "row", "reward"),
    [
        ("\\boxed{paris!}", {}, 1.0),  # normalized (the server default): case and punctuation ignored
        ("\\boxed{The Eiffel  Tower}", {"expected_answer": "eiffel tower"}, 1.0),  # articles and spaces
        ("\\boxed{paris}", {"match": {"mode": "exact"}}, 0.0),
        ("\\boxed{ Paris }", {"match": {"mode": "exact"}}, 1.0),
        ("\\boxed{paris}", {"match": {"case_sensitive": True}}, 0.0),
        ("\\boxed{Peking}", {"expected_answer": ["Beijing", "Peking"]}, 1.0),  # any reference
        ("\\boxed{Shanghai}", {"expected_answer": ["Beijing", "Peking"]}, 0.0),
        ("\\boxed{Bread}", {"expected_answer": "b[a-z]*", "match": {"mode": "regex"}}, 1.0),  # case-insensitive
        ("\\boxed{Bread}", {"expected_answer": "b[a-z]*", "match": {"mode": "regex", "case_sensitive": True}}, 0.0),
        ("\\boxed{bread and butter}", {"expected_answer": "b[a-z]*", "match": {"mode": "regex"}}, 0.0),  # whole answer
        ("The total is 1,234 apples", {"expected_answer": "1234", "match": {"mode": "numeric"}}, 1.0),
        ("\\boxed{0.571}", {"expected_answer": "0.57", "match": {"mode": "numeric", "abs_tol": 0.005}}, 1.0),
        ("\\boxed{0.58}", {"expected_answer": "0.57", "match": {"mode": "numeric", "abs_tol": 0.005}}, 0.0),
        ("\\boxed{101}", {"expected_answer": "100", "match": {"mode": "numeric", "rel_tol": 0.02}}, 1.0),
    ],
)
def test_match_modes(client: TestClient, text: str, row: dict[str, Any], reward: float) -> None:
    assert verify(client, text, **row)["reward"] == reward


def test_server_defaults_and_row_overrides() -> None:
    config = {"match": {"mode": "exact", "case_sensitive": True}}
    with server_client(SERVER_DIR, config) as client:
        assert verify(client, "\\boxed{paris}")["reward"] == 0.0
        assert verify(client, "\\boxed{paris}", match={"mode": "normalized"})["reward"] == 0.0  # still case-sensitive
        assert verify(client, "\\boxed{paris}", match={"mode": "normalized", "case_sensitive": False})["reward"] == 1.0


@pytest.mark.parametrize(
    ("text", "row", "reason"),
    [
        ("", {}, "no_answer"),
        ("\\boxed{Lyon}", {}, "mismatch"),
        ("\\boxed{many}", {"expected_answer": "3", "match": {"mode": "numeric"}}, "not_a_number"),
        ("\\boxed{" + "x" * 20_000 + "}", {}, "too_long"),
        (
            "\\boxed{" + "ab" * 3000 + "}",
            {"expected_answer": "(.*a){20}", "match": {"mode": "regex"}},
            "timeout",
        ),  # catastrophic backtracking
    ],
)
def test_failure_reasons(text: str, row: dict[str, Any], reason: str) -> None:
    with server_client(SERVER_DIR, {"regex_timeout_s": 0.2}) as client:
        answer = verify(client, text, **row)
    assert (answer["reward"], answer["failure_reason"]) == (0.0, reason)


def test_verifier_fields(client: TestClient) -> None:
    answer = verify(client, "\\boxed{peking}", expected_answer=["Beijing", "Peking"])
    assert answer["extracted_answer"] == "peking" and answer["matched_reference"] == "Peking"
    assert answer["match_mode"] == "normalized" and answer["failure_reason"] is None


@pytest.mark.parametrize("response_body", [{"output": "x"}, {"output": [None, {"type": "message", "content": 3}]}, {}])
def test_malformed_model_output_scores_0(client: TestClient, response_body: dict[str, Any]) -> None:
    answer = client.post("/verify", json={**ROW, "response": response_body})
    assert answer.status_code == 200 and answer.json()["failure_reason"] == "no_answer"


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"expected_answer": None}, "expected_answer"),
        ({"expected_answer": []}, "at least one"),
        ({"match": {"mode": "fuzzy"}}, "mode"),
        ({"match": {"tolerance": 1}}, "tolerance"),
        ({"match": {"abs_tol": -1}}, "abs_tol"),
        ({"expected_answer": "([", "match": {"mode": "regex"}}, "not a valid regex"),
        ({"expected_answer": "three", "match": {"mode": "numeric"}}, "not a number"),
    ],
)
def test_malformed_rows_are_422(client: TestClient, row: dict[str, Any], error: str) -> None:
    for text in ("\\boxed{Paris}", ""):  # whatever the answer
        answer = client.post("/verify", json={**ROW, **row, "response": assistant_response(text)})
        assert answer.status_code == 422 and error in answer.text, answer.text


def test_bundled_tasks_match_their_own_references(client: TestClient) -> None:
    prepare = import_file(SERVER_DIR / "prepare.py")
    rows = prepare.build_rows()
    assert len(rows) == 60
    samples = {"pattern": lambda p: p.replace("[a-z]*", "ee").replace("[1-9]", "4")}
    for row in rows:
        reference = row["expected_answer"] if isinstance(row["expected_answer"], str) else row["expected_answer"][-1]
        text = samples.get(row["task_id"].split("-")[0], lambda r: r)(reference)
        assert verify(client, f"\\boxed{{{text}}}", **row)["reward"] == 1.0, row


def test_prepare_reproduces_the_bundled_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare = import_file(SERVER_DIR / "prepare.py")
    monkeypatch.setattr(prepare, "DATA_DIR", tmp_path)
    prepare.main()
    for name in ("example.jsonl", "string_match_tasks.jsonl"):
        assert (tmp_path / name).read_bytes() == (SERVER_DIR / "data" / name).read_bytes(), name
