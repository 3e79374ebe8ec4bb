"""reasoning_gym server and prepare step, through real HTTP (FastAPI TestClient). No model needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.env.testing import NgRun, assert_verifier_cases, assistant_response, post_verify, server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = SERVER_DIR.parents[1]
QUICKSTART_TASKS = REPO_ROOT / "data/quickstart/reasoning_gym_tasks.jsonl"
QUICKSTART_CONFIG = SERVER_DIR / "configs/quickstart_tasks.yaml"
EXAMPLE_TASKS = SERVER_DIR / "data/example.jsonl"


app_module = import_file(SERVER_DIR / "app.py")
prepare = import_file(SERVER_DIR / "prepare.py")
_rows = read_jsonl


def _response(text: str) -> dict[str, Any]:
    """A Responses `Response` whose trajectory ends with one assistant message holding `text`."""
    return assistant_response(text, reasoning=True)


@pytest.fixture(scope="module")
def client():
    with server_client(SERVER_DIR) as c:
        yield c


@pytest.fixture(scope="module")
def binary_client():
    with server_client(SERVER_DIR, {"binary_reward": True}) as c:
        yield c


def _verify(client: TestClient, row: dict[str, Any], text: str) -> dict[str, Any]:
    return post_verify(client, {**row, "response": _response(text)})


# -- verify ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [QUICKSTART_TASKS, EXAMPLE_TASKS], ids=["quickstart", "example"])
def test_reference_answers_score_one(client, path):
    rows = _rows(path)
    by_dataset: dict[str, dict] = {}
    for row in rows:
        by_dataset.setdefault(row["dataset"], row)
    assert set(by_dataset) == {"basic_arithmetic", "leg_counting", "simple_equations", "spell_backward"}
    for dataset, row in by_dataset.items():
        result = _verify(client, row, f"Let me think.\n\\boxed{{{row['entry']['answer']}}}")
        assert result["reward"] == 1.0, dataset
        assert result["extracted_answer"] == row["answer"]
        assert result["extraction"] == "boxed"
        assert result["dataset"] == dataset
        assert result["task_id"] == row["task_id"]  # the row comes back with the verifier fields


def test_every_quickstart_row_scores_one_with_its_answer(client):
    for row in _rows(QUICKSTART_TASKS):
        assert _verify(client, row, f"\\boxed{{{row['answer']}}}")["reward"] == 1.0, row["task_id"]


def test_wrong_answers_score_zero(client):
    rows = {row["dataset"]: row for row in _rows(QUICKSTART_TASKS)}
    wrong = {"basic_arithmetic": "1000", "leg_counting": "999", "simple_equations": "-77", "spell_backward": "qqqqq"}
    for dataset, answer in wrong.items():
        result = _verify(client, rows[dataset], f"\\boxed{{{answer}}}")
        assert result["reward"] == 0.0, dataset
        assert result["extracted_answer"] == answer


def test_partial_credit_and_binary_reward(client, binary_client):
    # spell_backward gives 1/len per matching leading letter, minus nothing: "daz" answered "dax" = 2/3.
    row = next(r for r in _rows(QUICKSTART_TASKS) if r["dataset"] == "spell_backward" and r["answer"] == "daz")
    assert _verify(client, row, "\\boxed{dax}")["reward"] == pytest.approx(2 / 3)
    binary = _verify(binary_client, row, "\\boxed{dax}")
    assert binary["reward"] == 0.0 and binary["score"] == pytest.approx(2 / 3)
    assert _verify(binary_client, row, "\\boxed{daz}")["reward"] == 1.0


@pytest.mark.parametrize(
    ("text", "expected", "where"),
    [
        ("So the answer is \\boxed{3}.", "3", "boxed"),
        ("first \\boxed{7}, no wait, \\boxed{3}", "3", "boxed"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "boxed"),
        ("\\boxed{ 3 } and an unclosed \\boxed{4", "3", "boxed"),
        ("<think>maybe \\boxed{9}</think>\n<answer>3</answer>", "3", "answer_tag"),
        ("<answer>5</answer> then <answer> 3 </answer>", "3", "answer_tag"),
        ("4 - 1 is\n3\n\n", "3", "last_line"),
        ("   \n", None, "none"),
        ("", None, "none"),
    ],
)
def test_extract_final_answer(text, expected, where):
    assert app_module.extract_final_answer(text) == (expected, app_module.Extraction(where))


def test_extraction_variants_over_http(client):
    row = _rows(QUICKSTART_TASKS)[0]  # "Calculate 4 - 1." -> "3"
    assert row["answer"] == "3"
    assert _verify(client, row, "<answer>3</answer>")["reward"] == 1.0
    assert _verify(client, row, "4 - 1 = ?\n3")["reward"] == 1.0
    empty = _verify(client, row, "")
    assert empty["reward"] == 0.0 and empty["extraction"] == "none" and empty.get("extracted_answer") is None


def test_last_assistant_message_is_scored(client):
    row = _rows(QUICKSTART_TASKS)[0]
    response = _response("\\boxed{3}")
    response["output"] = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\\boxed{8}"}]},
        {"type": "function_call", "name": "calc", "arguments": "{}", "call_id": "c1"},
        *response["output"],
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "\\boxed{9}"}]},
    ]
    result = client.post("/verify", json={**row, "response": response}).json()
    assert result["reward"] == 1.0 and result["extracted_answer"] == "3"


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda row: row.pop("response"), id="no-response"),
        pytest.param(lambda row: row.pop("responses_create_params"), id="no-responses_create_params"),
        pytest.param(lambda row: row.pop("entry"), id="no-entry"),
        pytest.param(lambda row: row.pop("dataset"), id="no-dataset"),
        pytest.param(lambda row: row.update(dataset="basic_arithmetc"), id="unknown-dataset"),
        pytest.param(lambda row: row.update(entry="not an object"), id="entry-not-object"),
        pytest.param(lambda row: row["entry"].pop("answer"), id="entry-without-answer"),
        pytest.param(lambda row: row.update(response=[]), id="response-not-object"),
    ],
)
def test_malformed_bodies_get_422(client, mutate):
    row = {**_rows(QUICKSTART_TASKS)[0], "response": _response("\\boxed{3}")}
    mutate(row)
    answer = client.post("/verify", json=row)
    assert answer.status_code == 422, answer.text


def test_unknown_dataset_suggests_a_name(client):
    row = {**_rows(QUICKSTART_TASKS)[0], "dataset": "basic_arithmetc", "response": _response("\\boxed{3}")}
    assert "basic_arithmetic" in client.post("/verify", json=row).text


def test_non_json_body_gets_422(client):
    answer = client.post("/verify", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 422


def test_verifier_cases():
    assert_verifier_cases(SERVER_DIR, at_least=6)


# -- prepare ---------------------------------------------------------------------------------------------


def test_prepare_is_deterministic(tmp_path):
    generators = load_config([f"+config_paths=[{QUICKSTART_CONFIG}]"]).values["generators"]
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert prepare.prepare_tasks(generators, first) == 100
    assert prepare.prepare_tasks(generators, second) == 100
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == QUICKSTART_TASKS.read_bytes()  # the bundled file is up to date


def test_prepare_row_layout(tmp_path):
    spec = prepare.GeneratorSpec(name="leg_counting", size=3, seed=5, config={"min_animals": 1, "max_animals": 2})
    rows = prepare.build_tasks([spec], answer_instruction="Answer in \\boxed{}.")
    assert [r["task_id"] for r in rows] == ["leg_counting-5-0", "leg_counting-5-1", "leg_counting-5-2"]
    row = rows[0]
    assert set(row) == {"responses_create_params", "question", "answer", "dataset", "entry", "task_id"}
    assert row["responses_create_params"]["input"] == [
        {"role": "user", "content": f"{row['question'].rstrip()}\n\nAnswer in \\boxed{{}}."}
    ]
    assert row["dataset"] == "leg_counting" and row["answer"] == row["entry"]["answer"]
    assert row["entry"]["metadata"]["difficulty"]["num_animals"] == [1, 2]  # tuples become JSON lists


def test_prepare_cli(tmp_path):
    out = tmp_path / "tasks.jsonl"
    argv = [
        f"+output_jsonl_fpath={out}",
        "+generators=[{name: simple_equations, size: 2, seed: 3, config: {max_value: 10}}]",
    ]
    assert prepare.main(argv) == 0
    assert [r["task_id"] for r in _rows(out)] == ["simple_equations-3-0", "simple_equations-3-1"]


@pytest.mark.parametrize(
    ("generators", "message"),
    [
        ([{"name": "spell_backwards", "size": 1}], "close names: spell_backward"),
        ([{"name": "leg_counting", "size": 1, "config": {"max_animal": 2}}], "Its fields: min_animals, max_animals"),
        ([{"name": "leg_counting", "size": 1, "config": {"min_animals": 5, "max_animals": 2}}], "bad config"),
        ([{"name": "leg_counting", "size": 1, "config": {"seed": 2}}], "not inside config"),
        ([{"name": "leg_counting", "size": 0}], "size"),
        (
            [{"name": "leg_counting", "size": 1}, {"name": "leg_counting", "sise": 1}],
            r"generators\.1\.sise: not a key of generators\.1 \(did you mean 'size'\?\)",
        ),
        ([{"name": "leg_counting", "size": 1}, {"name": "leg_counting", "size": 2}], "different seeds"),
    ],
)
def test_prepare_errors(tmp_path, generators, message):
    with pytest.raises(ConfigError, match=message):
        prepare.prepare_tasks(generators, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


def test_example_rows_match_the_documented_command(tmp_path):
    out = tmp_path / "example.jsonl"
    prepare.main([f"+output_jsonl_fpath={out}", EXAMPLE_GENERATORS])
    assert out.read_bytes() == EXAMPLE_TASKS.read_bytes()


EXAMPLE_GENERATORS = (
    "+generators=[{name: basic_arithmetic, size: 2, seed: 0, config: {max_terms: 3, max_digits: 2}}, {name:"
    " leg_counting, size: 1, seed: 0}, {name: simple_equations, size: 1, seed: 0}, {name: spell_backward, size: 1,"
    " seed: 0}]"
)


# -- real processes ----------------------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.integration
def test_ng_run_rollouts():
    """ng_run starts this server (in its own uv environment), the simple agent and a scripted policy; the
    agent's `/run` scores the example rows end to end."""
    config = (
        "+config_paths=[resources_servers/reasoning_gym/configs/reasoning_gym.yaml,"
        "resources_servers/reasoning_gym/tests/scripted_policy.yaml]"
    )
    with NgRun(config, timeout_s=600) as run:
        agent_url = run.server_url("reasoning_gym_simple_agent")
        rewards = {}
        for row in _rows(EXAMPLE_TASKS):
            answer = httpx.post(f"{agent_url}/run", json=row, headers=run.headers, timeout=60)
            assert answer.status_code == 200, answer.text
            rewards[row["task_id"]] = answer.json()["reward"]
        assert rewards == {
            "basic_arithmetic-0-0": 0.0,
            "basic_arithmetic-0-1": 1.0,  # "\boxed{2}"
            "leg_counting-0-0": 0.0,
            "simple_equations-0-0": 0.0,
            "spell_backward-0-0": 1.0,  # "<answer>noremopyh</answer>"
        }


def test_fallback_extraction_for_small_models():
    """SmolLM2 rarely writes \\boxed{}: "1 + 5 = 6" answers 6 for a numeric task; stated answers are read."""
    app = app_module
    assert app.extract_final_answer("1 + 5 = 6", numeric=True) == ("6", app.Extraction.LAST_NUMBER)
    assert app.extract_final_answer("17 + 5 = 22.\nSo, the answer is 20.", numeric=True) == (
        "20",
        app.Extraction.ANSWER_IS,
    )
    assert app.extract_final_answer("The answer is: etyk", numeric=False) == ("etyk", app.Extraction.ANSWER_IS)
    assert app.extract_final_answer("I think\netyk", numeric=False) == ("etyk", app.Extraction.LAST_LINE)
    assert app.extract_final_answer("no digits here", numeric=True) == ("no digits here", app.Extraction.LAST_LINE)
