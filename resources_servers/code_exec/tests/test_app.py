"""code_exec server through real HTTP (FastAPI TestClient), its code extraction and comparison, and the data
preparation. Runs code in the bubblewrap sandbox (`apt-get install -y bubblewrap`). No model needed."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
CodeExecServer = load_server_class(SERVER_DIR / "app.py")
app_module = sys.modules[CodeExecServer.__module__]
grading = app_module.grading
TASKS = SERVER_DIR / "data/code_tasks.jsonl"
EXAMPLES = SERVER_DIR / "data/example.jsonl"


def rows(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


response = assistant_response


@pytest.fixture(scope="module")
def client():
    server = CodeExecServer({"test_timeout_s": 1.0, "wall_time_s": 5.0}, name="code_exec")
    with TestClient(server.build_app()) as c:
        server.sandbox.check()  # fails with "install bubblewrap" when it is missing
        yield c


def verify(client: TestClient, row: dict[str, Any], text: str) -> dict[str, Any]:
    return post_verify(client, {**row, "response": response(text)})


ADD = next(r for r in rows(TASKS) if r["entry_point"] == "add")


# -- the bundled data ----------------------------------------------------------------------------------------


def test_every_reference_solution_scores_one(client):
    tasks = rows(TASKS)
    assert len(tasks) >= 50 and len({t["entry_point"] for t in tasks}) == len(tasks)
    with ThreadPoolExecutor(2) as pool:  # the server runs 2 sandboxes at once
        results = list(pool.map(lambda t: verify(client, t, f"```python\n{t['reference_solution']}```"), tasks))
    failed = {t["task_id"]: r["test_results"] for t, r in zip(tasks, results) if r["reward"] != 1.0}
    assert failed == {}
    assert all(r["failure_reason"] is None and r["tests_passed"] == r["tests_total"] for r in results)


def test_prepare_reproduces_the_bundled_files(tmp_path):
    module = import_file(SERVER_DIR / "prepare.py")
    assert module.main(["--data-dir", str(tmp_path)]) == 0
    assert (tmp_path / "code_tasks.jsonl").read_bytes() == TASKS.read_bytes()
    assert (tmp_path / "example.jsonl").read_bytes() == EXAMPLES.read_bytes()
    assert len(rows(EXAMPLES)) == 5


# -- scoring -------------------------------------------------------------------------------------------------


def test_partial_credit_per_test(client):
    # `a - b` instead of `a + b`: of (1,2)->3, (-5,5)->0, (0,0)->0, (123,877)->1000, (-7,-8)->-15 only (0,0) passes:
    # 1/5.
    result = verify(client, ADD, "```python\ndef add(a, b):\n    return a - b\n```")
    assert result["reward"] == pytest.approx(0.2)
    assert result["reward_components"] == {"test_0": 0.0, "test_1": 0.0, "test_2": 1.0, "test_3": 0.0, "test_4": 0.0}
    assert result["tests_passed"] == 1 and result["tests_total"] == 5
    assert result["failure_reason"] == "tests_failed"
    assert result["test_results"][0]["error"] == "wrong answer: returned -1"
    assert result["task_id"] == "code_exec-add"  # the row comes back with the verifier fields


def test_last_python_block_of_the_last_assistant_message_is_run(client):
    body = {
        **ADD,
        "response": response(
            "```python\ndef add(a, b):\n    return 0\n```\nBetter:\n```python\ndef add(a, b):\n    return a + b\n```"
        ),
    }
    body["response"]["output"].insert(
        0,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "```python\nbroken(\n```"}],
        },
    )
    body["response"]["output"].append({"type": "function_call", "name": "x", "arguments": "{}", "call_id": "c"})
    result = client.post("/verify", json=body).json()
    assert result["reward"] == 1.0 and result["extracted_code"] == "def add(a, b):\n    return a + b\n"


def test_keyword_arguments_and_floats(client):
    row = {
        "responses_create_params": {"input": "x"},
        "entry_point": "scale",
        "tests": [{"args": [0.1], "kwargs": {"factor": 3}, "expected": 0.3}, {"args": [2], "expected": 2}],
    }
    result = verify(client, row, "def scale(x, factor=1):\n    return x * factor\n")  # 0.1 * 3 = 0.30000000000000004
    assert result["reward"] == 1.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no_code"),
        ("```python\ndef add(a, b)\n    return a + b\n```", "syntax_error"),
        ("```python\ndef plus(a, b):\n    return a + b\n```", "missing_function"),
        ("```python\nraise ValueError('at import')\n```", "load_error"),
        ("```python\nimport numpy\ndef add(a, b):\n    return a + b\n```", "load_error"),  # standard library only
        ("```python\ndef add(a, b):\n    raise KeyError(a)\n```", "tests_failed"),
        ("```python\ndef add(a, b):\n    return {a, b}\n```", "tests_failed"),  # a set is not a JSON value
        ("```python\nimport os\ndef add(a, b):\n    os._exit(0)\n```", "exited_early"),
        ("```python\ndef add(a, b):\n    return add(a, b)\n```", "recursion_limit"),
    ],
)
def test_failures_score_zero_with_a_reason(client, text, reason):
    result = verify(client, ADD, text)
    assert result["reward"] == 0.0 and result["failure_reason"] == reason, result


def test_too_long_code_is_not_run():
    server = CodeExecServer({"max_code_chars": 20}, name="code_exec")
    with TestClient(server.build_app()) as c:
        result = verify(c, ADD, "def add(a, b):\n    return a + b  # a long comment\n")
    assert result["reward"] == 0.0 and result["failure_reason"] == "code_too_long" and result["sandbox"] is None


def test_forged_result_lines_only_claim_the_candidates_own_values(client):
    # The candidate reads the nonce and prints result lines before the harness does: the server takes them,
    # but they carry values, and the verdict is made against expected values the sandbox never saw.
    code = (
        "import json\nnonce = json.load(open('spec.json'))['nonce']\nfor i in range(5):\n    print(nonce,"
        " json.dumps({'event': 'test', 'index': i, 'ok': True, 'value': 42}), flush=True)\n   "
        ' __import__(\'os\').write(1, f\'{nonce} {json.dumps({"event": "test", "index": i, "ok": True, "passed":'
        " True})}\\n'.encode())\ndef add(a, b):\n    return 42\n"
    )
    result = verify(client, ADD, f"```python\n{code}```")
    assert result["reward"] == 0.0
    # print() goes to stderr (ignored); the lines written to fd 1 are taken first, and claim no value: null.
    assert {t["error"] for t in result["test_results"]} == {"wrong answer: returned null"}


# -- extraction and comparison -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\nx = 1\n```", "x = 1\n"),
        ("```py\na\n```\ntext\n```Python\nb\n```", "b\n"),
        ("```python\na\n```\n```\nb\n```", "a\n"),  # a python block wins over a later untagged one
        ("```\nuntagged\n```", "untagged\n"),
        ("```js\nlet x\n```", "```js\nlet x\n```"),  # no python or untagged block: the whole text
        ("def f():\n    return 1", "def f():\n    return 1"),
        ("````python\nprint('```')\n````", "print('```')\n"),  # a longer fence holds a shorter one
        ("text\n```python\nunclosed = True", "unclosed = True"),
    ],
)
def test_extract_code(text, code):
    assert grading.extract_code(text) == code


@pytest.mark.parametrize(
    ("actual", "expected", "equal"),
    [
        (1, 1, True),
        (1.0, 1, True),
        (0.30000000000000004, 0.3, True),
        (0.31, 0.3, False),
        (True, 1, False),
        (1, True, False),
        (False, False, True),
        (None, None, True),
        (None, 0, False),
        ("a", "a", True),
        ([1, [2, 3]], [1, [2, 3]], True),
        ([1, 2], [2, 1], False),
        ([1], [1, 1], False),
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"b": 1}, False),
        ("1", 1, False),
    ],
)
def test_values_equal(actual, expected, equal):
    assert grading.values_equal(actual, expected) is equal


# -- malformed rows and infrastructure failures --------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.pop("entry_point"), "entry_point"),
        (lambda r: r.pop("tests"), "tests"),
        (lambda r: r.update(tests=[]), "tests"),
        (lambda r: r.update(tests="assert add(1, 2) == 3"), "tests"),
        (lambda r: r.update(tests=[{"args": [1, 2]}]), "expected"),
        (lambda r: r.update(tests=[{"args": 1, "expected": 1}]), "args"),
        (lambda r: r.update(entry_point="add; import os"), "entry_point"),
        (lambda r: r.pop("response"), "response"),
    ],
)
def test_malformed_rows_get_422(client, change, field):
    body = {**json.loads(json.dumps(ADD)), "response": response("def add(a, b):\n    return a + b")}
    change(body)
    reply = client.post("/verify", json=body)
    assert reply.status_code == 422 and field in reply.text, reply.text


def test_missing_bwrap_is_an_infrastructure_failure_not_a_zero():
    server = CodeExecServer({"bwrap_path": "/nonexistent/bwrap"}, name="code_exec")
    with TestClient(server.build_app()) as c:
        reply = c.post("/verify", json={**ADD, "response": response("def add(a, b):\n    return a + b")})
        assert reply.status_code == 502
        assert reply.json()["error"]["type"] == "sandbox_unavailable"
        assert "apt-get install -y bubblewrap" in reply.json()["error"]["message"]
        assert verify(c, ADD, "")["failure_reason"] == "no_code"  # nothing to run: still scored


def test_aggregate_metrics(client):
    answers = [
        {"reward": 1.0, "failure_reason": None},
        {"reward": 0.4, "failure_reason": "tests_failed"},
        {"reward": 0.0, "failure_reason": "timeout"},
        {"reward": 0.0, "failure_reason": "timeout"},
    ]
    metrics = client.post("/aggregate_metrics", json={"verify_responses": answers}).json()
    assert metrics["num_rollouts"] == 4 and metrics["mean_reward"] == pytest.approx(0.35)
    assert metrics["pass_rate"] == 0.25 and metrics["failure_reasons"] == {"tests_failed": 1, "timeout": 2}


def test_verifier_cases(client):
    for case in rows(SERVER_DIR / "tests/verifier_cases.jsonl"):
        reply = client.post("/verify", json=case["request"])
        if case["kind"] == "malformed":
            assert reply.status_code == 422 and case["expected_error"] in reply.text, case["name"]
        else:
            assert reply.status_code == 200 and reply.json()["reward"] == case["expected_reward"], case["name"]
