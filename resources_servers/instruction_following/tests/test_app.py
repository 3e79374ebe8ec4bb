"""The instruction_following server over HTTP (FastAPI TestClient, no mocks), its fixtures and its data generator."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import NgRun, assert_verifier_cases, assistant_response, post_verify, server_client
from nemo_gym.env.validation import validate_data
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Describe tea. Use no commas, at least 5 words, and a <<title>>."}]
    },
    "key": 7,
    "prompt": "Describe tea. Use no commas, at least 5 words, and a <<title>>.",
    "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words", "detectable_format:title"],
    "kwargs": [{}, {"num_words": 5, "relation": "at least"}, {}],
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with server_client(SERVER_DIR) as client:
        yield client


response = assistant_response


def verify(client: TestClient, answer: dict[str, Any] | str, **row: Any) -> dict[str, Any]:
    return post_verify(client, {**ROW, **row, "response": response(answer) if isinstance(answer, str) else answer})


def test_reward_is_the_fraction_of_instructions_followed(client: TestClient) -> None:
    answer = verify(client, "<<Tea>>\nTea is a warm drink, loved everywhere.")  # a comma: 2 of 3 followed
    assert answer["reward"] == pytest.approx(2 / 3)
    assert answer["follow_instruction_list"] == [False, True, True]
    assert answer["follow_all_instructions"] is False
    assert answer["reward_components"] == {
        "punctuation:no_comma": 0.0,
        "length_constraints:number_words": 1.0,
        "detectable_format:title": 1.0,
    }
    assert answer["mode"] == "strict" and answer["failure_reason"] is None
    assert answer["key"] == 7 and answer["instruction_id_list"] == ROW["instruction_id_list"]  # the row is echoed
    assert verify(client, "<<Tea>>\nTea is a warm drink loved everywhere.")["reward"] == 1.0


def test_strict_and_loose_fractions_and_the_mode_that_rewards() -> None:
    row = {"instruction_id_list": ["startend:quotation", "punctuation:no_comma"], "kwargs": [{}, {}]}
    text = 'Here is my answer:\n"Tea is a drink."'  # quoted only without the first line
    with server_client(SERVER_DIR) as strict, server_client(SERVER_DIR, {"mode": "loose"}) as loose:
        strict_answer, loose_answer = verify(strict, text, **row), verify(loose, text, **row)
    for answer in (strict_answer, loose_answer):
        assert answer["strict_fraction"] == 0.5 and answer["loose_fraction"] == 1.0
    assert strict_answer["reward"] == 0.5 and strict_answer["follow_instruction_list"] == [False, True]
    assert loose_answer["reward"] == 1.0 and loose_answer["follow_instruction_list"] == [True, True]
    assert loose_answer["mode"] == "loose" and loose_answer["reward_components"]["startend:quotation"] == 1.0


def test_all_or_nothing() -> None:
    with server_client(SERVER_DIR, {"all_or_nothing": True}) as client:
        assert verify(client, "<<Tea>>\nTea is a warm drink, loved everywhere.")["reward"] == 0.0
        assert verify(client, "<<Tea>>\nTea is a warm drink loved everywhere.")["reward"] == 1.0


def test_the_last_assistant_message_is_checked(client: TestClient) -> None:
    assert verify(client, response("draft, with commas", "<<Tea>> tea is warm and kind"))["reward"] == 1.0
    assert (
        verify(client, response("<<Tea>> tea is warm and kind", ""))["reward"] == 1.0
    )  # an empty last message is skipped


def test_repeated_instruction_ids_get_numbered_components(client: TestClient) -> None:
    row = {
        "instruction_id_list": ["keywords:existence", "keywords:existence"],
        "kwargs": [{"keywords": ["tea"]}, {"keywords": ["cake"]}],
    }
    answer = verify(client, "I like tea.", **row)
    assert answer["reward_components"] == {"keywords:existence": 1.0, "keywords:existence#2": 0.0}


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (response(""), "no_assistant_text"),
        (response("  \n "), "no_assistant_text"),
        ({"output": []}, "no_assistant_text"),
        ({"output": "not a list"}, "no_assistant_text"),
        (
            {
                "output": [
                    None,
                    3,
                    "x",
                    {"type": "message", "content": "not a list"},
                    {"type": "message", "content": [None, {"type": "output_text", "text": 5}]},
                ]
            },
            "no_assistant_text",
        ),
        ({"output": [{"type": "function_call", "name": "f", "arguments": "{"}]}, "no_assistant_text"),
        (response("word " * 5_000), "response_too_long"),
    ],
)
def test_bad_model_output_scores_zero_with_a_reason(client: TestClient, answer: dict[str, Any], reason: str) -> None:
    result = verify(client, answer)
    assert result["reward"] == 0.0 and result["failure_reason"] == reason
    assert result["follow_instruction_list"] == [False, False, False] and result["loose_fraction"] == 0.0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"instruction_id_list": ["punctuation:no_coma"], "kwargs": [{}]}, "did you mean 'punctuation:no_comma'"),
        ({"instruction_id_list": ["ifbench:made_up"], "kwargs": [{}]}, "unknown instruction id 'ifbench:made_up'"),
        ({"kwargs": [{}, {}]}, "has 3 entries but kwargs has 2"),
        ({"instruction_id_list": []}, "instruction_id_list"),
        ({"instruction_id_list": "punctuation:no_comma"}, "instruction_id_list"),
        ({"kwargs": "none"}, "kwargs"),
        ({"kwargs": [{}, {"num_words": "many", "relation": "at least"}, {}]}, "num_words"),
        ({"kwargs": [{}, {"num_words": 5, "relation": "roughly"}, {}]}, "relation"),
    ],
)
def test_malformed_rows_get_422_at_verify_and_at_seed(client: TestClient, row: dict[str, Any], message: str) -> None:
    body = {**ROW, **row}
    answer = client.post("/verify", json={**body, "response": response("text")})
    assert answer.status_code == 422 and message in answer.text, answer.text
    seeded = client.post("/seed_session", json=body)
    assert seeded.status_code == 422 and message in seeded.text, seeded.text


def test_missing_task_fields_get_422(client: TestClient) -> None:
    for field in ("instruction_id_list", "kwargs"):
        body = {k: v for k, v in ROW.items() if k != field}
        assert client.post("/verify", json={**body, "response": response("text")}).status_code == 422
        assert client.post("/seed_session", json=body).status_code == 422


def test_ifeval_rows_with_null_kwargs_are_read(client: TestClient) -> None:
    # Google's IFEval on Hugging Face lists every key of every instruction, null where unused.
    null_keys = {"num_words": None, "relation": None, "keywords": None, "end_phrase": None}
    row = {
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [null_keys, {**null_keys, "num_words": 3, "relation": "less than"}],
    }
    assert verify(client, "Short answer.", **row)["reward"] == 1.0


def test_aggregate_metrics(client: TestClient) -> None:
    rows = [
        verify(client, "<<Tea>>\nTea is a warm drink loved everywhere."),  # 3/3
        verify(client, "<<Tea>>\nTea, warm."),  # 1/3 strict (title), loose the same
        verify(client, ""),
    ]  # 0/3
    metrics = client.post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert metrics["num_rollouts"] == 3 and metrics["mean_reward"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert metrics["prompt_level_strict_accuracy"] == pytest.approx(1 / 3)
    assert metrics["instruction_level_strict_accuracy"] == pytest.approx(4 / 9)  # (3 + 1 + 0) of 9 instructions
    assert metrics["instruction_follow_rate"]["detectable_format:title"] == pytest.approx(2 / 3)
    assert metrics["instruction_follow_rate"]["punctuation:no_comma"] == pytest.approx(1 / 3)


def test_verifier_cases_and_data_pass_ng_test_checks() -> None:
    assert_verifier_cases(SERVER_DIR, at_least=10)
    assert validate_data(SERVER_DIR) == []


# -- data generator ---------------------------------------------------------------------------------------


def test_generator_reproduces_the_bundled_files(tmp_path: Path) -> None:
    generate = import_file(SERVER_DIR / "generate_data.py")
    assert generate.main(["--out-dir", str(tmp_path)]) == 0
    for name in ("example.jsonl", "train.jsonl"):
        assert (tmp_path / name).read_bytes() == (SERVER_DIR / "data" / name).read_bytes(), name


def test_bundled_tasks_are_valid_and_cover_every_instruction(client: TestClient) -> None:
    rows = read_jsonl(SERVER_DIR / "data" / "train.jsonl")
    assert len(rows) >= 50
    instructions = import_file(SERVER_DIR / "instructions.py")
    assert {i for row in rows for i in row["instruction_id_list"]} == set(instructions.INSTRUCTIONS)
    assert all(1 <= len(row["instruction_id_list"]) <= 3 for row in rows)
    for row in rows:
        assert row["responses_create_params"]["input"][0]["content"] == row["prompt"]
        assert client.post("/seed_session", json=row).status_code == 200


# -- real processes ----------------------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.integration
def test_ng_run_rollouts() -> None:
    """ng_run starts this server (in its own uv environment), the simple agent and a scripted policy; the
    agent's `/run` scores the example rows end to end."""
    config = (
        "+config_paths=[resources_servers/instruction_following/configs/instruction_following.yaml,"
        "resources_servers/instruction_following/tests/scripted_policy.yaml]"
    )
    with NgRun(config, timeout_s=600) as run:
        agent_url = run.server_url("instruction_following_simple_agent")
        rewards = {}
        for line in (SERVER_DIR / "data" / "example.jsonl").read_text().splitlines():
            answer = httpx.post(f"{agent_url}/run", json=json.loads(line), headers=run.headers, timeout=60)
            assert answer.status_code == 200, answer.text
            rewards[answer.json()["key"]] = answer.json()["reward"]
        # "I do not know." (the default reply) has fewer than 150 words but no highlights: 1 of 2 for key 1.
        assert rewards == {0: 1.0, 1: 0.5, 2: 0.0, 3: 0.0, 4: 1.0}


ADVERSARIAL_TEXTS = {
    "one long sentence": "word " * 3_990,
    "many short sentences": "A b. " * 3_990,
    "many lines": "a\n" * 9_990,
    "markup": "Hi, *x* [y] <<t>> P.S. SECTION 1 ***\n\n- a\n" * 450,
    "brackets": "[" * 19_990,
    "angles": "<" * 19_990,
    "stars": "*" * 19_990,
    "blank lines": "\n" * 19_990 + "x",
}


def test_every_instruction_on_adversarial_answers_in_bounded_time() -> None:
    """Texts just under `max_response_chars` that make naive regexes (or segmenters) quadratic."""
    generate = import_file(SERVER_DIR / "generate_data.py")
    ids = list(generate.SAMPLERS)
    kwargs = [generate.SAMPLERS[i](random.Random(0)) or {} for i in ids]
    kwargs[ids.index("combination:repeat_prompt")] = {"prompt_to_repeat": "Write about tea."}
    with server_client(SERVER_DIR, {"mode": "loose"}) as client:
        for name, text in ADVERSARIAL_TEXTS.items():
            start = time.monotonic()
            answer = verify(client, text, instruction_id_list=ids, kwargs=kwargs)
            assert answer["failure_reason"] is None and 0.0 <= answer["reward"] <= 1.0, name
            assert time.monotonic() - start < 5.0, name
