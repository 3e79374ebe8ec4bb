"""llm_judge over real HTTP: the scripted model as judge (its rules answer verdicts or fixed scores JSON).

Servers run with uvicorn on 127.0.0.1 in threads (`tests/live_servers.py`); the judge's calls are counted by
a middleware on its app.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_servers import serve

from nemo_gym import cli
from nemo_gym.collect.command import CollectConfig, collect_rollouts
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app
from nemo_gym.serving.module_loading import import_file
from nemo_gym.serving.retry_policy import ClientTimeouts

SERVER_DIR = Path(__file__).resolve().parents[1]
REPO = SERVER_DIR.parents[1]
FAST = ClientTimeouts(read_s=30, max_retries=0)
EQUAL, NOT_EQUAL = "Same meaning. [[A=B]]", "Different answers. [[A!=B]]"
OCEAN_ROW = json.loads((SERVER_DIR / "data/example.jsonl").read_text().splitlines()[0])  # expected "The Pacific Ocean"


judge, group, generate_data = (
    import_file(SERVER_DIR / name) for name in ("judge.py", "group_judge.py", "generate_data.py")
)


def response(text: str) -> dict[str, Any]:
    """A Responses `Response` whose output is one assistant message."""
    message = {
        "id": "msg",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp",
        "created_at": 0,
        "model": "policy",
        "object": "response",
        "output": [message],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


class Judge:
    """A scripted judge model served over HTTP; `calls` counts its /v1/responses calls."""

    def __init__(self, stack: ExitStack, **config: Any):
        self.calls, self.bodies = 0, []
        app = load_server_class(REPO / "responses_api_models/scripted_model/app.py")(config).build_app()

        @app.middleware("http")
        async def count(request, call_next):
            if request.url.path == "/v1/responses":
                self.calls += 1
                self.bodies.append(json.loads(await request.body()))
            return await call_next(request)

        self.url = stack.enter_context(serve(app))


@pytest.fixture
def stack():
    with ExitStack() as stack:
        yield stack


def start_env(stack: ExitStack, judge_url: str, **config: Any) -> str:
    server = load_server_class(SERVER_DIR / "app.py")(
        {"judge_model_server": {"type": "responses_api_models", "name": "judge"}, **config},
        name="llm_judge",
        client=ServerClient(addresses={"judge": judge_url}, timeouts=FAST),
    )
    return stack.enter_context(serve(server.build_app()))


def verify(url: str, row: dict[str, Any], text: str) -> httpx.Response:
    return httpx.post(f"{url}/verify", json={**row, "response": response(text)}, timeout=30)


# -- pointwise judge ---------------------------------------------------------------------------------------
def test_equal_and_not_equal_verdicts(stack):
    scripted = Judge(
        stack, rules=[{"match": r"<answer_b>\s*It is the Pacific", "reply": EQUAL}], default_reply=NOT_EQUAL
    )
    url = start_env(stack, scripted.url)
    equal = verify(url, OCEAN_ROW, "It is the Pacific, the biggest by far.").json()
    assert equal["reward"] == 1.0 and equal["judge_verdict"] == "equal" and equal["failure_reason"] is None
    assert equal["judge_replies"] == [EQUAL] and equal["extracted_answer"] == "It is the Pacific, the biggest by far."
    different = verify(url, OCEAN_ROW, "The Atlantic Ocean").json()
    assert (
        different["reward"] == 0.0
        and different["judge_verdict"] == "not_equal"
        and different["failure_reason"] == "judged_not_equal"
    )
    assert scripted.calls == 2


def test_exact_match_needs_no_judge_unless_turned_off(stack):
    scripted = Judge(stack, default_reply=EQUAL)
    assert (
        verify(start_env(stack, scripted.url), OCEAN_ROW, "  the pacific OCEAN. ").json()["judge_verdict"]
        == "exact_match"
    )
    assert scripted.calls == 0
    assert (
        verify(start_env(stack, scripted.url, skip_judge_on_exact_match=False), OCEAN_ROW, "The Pacific Ocean").json()[
            "judge_verdict"
        ]
        == "equal"
    )
    assert scripted.calls == 1


def test_prompt_template_regexes_and_answer_regex_are_configurable(stack):
    # The rule sees the rendered template: the row's `question` field, then the extracted answer only.
    scripted = Judge(
        stack,
        rules=[
            {
                "match": r"^Q: What is the largest ocean on Earth\?\nREF: The Pacific Ocean\nGOT: Pacific$",
                "reply": "verdict: SAME",
            }
        ],
        default_reply="verdict: DIFFERENT",
    )
    url = start_env(
        stack,
        scripted.url,
        judge_prompt_template="Q: {question}\nREF: {expected_answer}\nGOT: {generated_answer}",
        judge_equal_regex=r"\bSAME\b",
        judge_not_equal_regex=r"\bDIFFERENT\b",
        answer_regex=r"ANSWER: (\w+)",
    )
    assert verify(url, OCEAN_ROW, "Let me think. ANSWER: Atlantic... no wait, ANSWER: Pacific").json()["reward"] == 1.0
    assert verify(url, OCEAN_ROW, "ANSWER: Indian").json()["reward"] == 0.0
    no_match = verify(url, OCEAN_ROW, "Pacific, I think").json()  # answer_regex finds nothing: no answer, no judge call
    assert no_match["reward"] == 0.0 and no_match["failure_reason"] == "no_answer" and scripted.calls == 2


def test_constrained_judge_output_asks_for_a_json_verdict_and_group_scores(stack):
    scripted = Judge(
        stack,
        rules=[{"match": "<answer_b>", "reply": '{"verdict": "[[A=B]]"}'}],
        default_reply=(
            '{"scores": [{"id": "1", "score": 0.9, "explanation": "right"}, {"id": "2", "score": 0.1, "explanation":'
            ' "wrong"}]}'
        ),
    )
    url = start_env(stack, scripted.url, constrain_judge_output=True)
    assert verify(url, OCEAN_ROW, "Pacific").json()["reward"] == 1.0
    verdict_format = scripted.bodies[-1]["text"]["format"]
    assert verdict_format["type"] == "json_schema" and verdict_format["schema"]["properties"]["verdict"]["enum"] == [
        "[[A=B]]",
        "[[A!=B]]",
    ]
    rows = [{**OCEAN_ROW, "response": response(text)} for text in ("Pacific", "Atlantic")]
    answer = httpx.post(f"{url}/verify_group", json={"rows": rows}, timeout=30).json()
    assert answer["rewards"] == [0.9, 0.1]
    items = scripted.bodies[-1]["text"]["format"]["schema"]["properties"]["scores"]
    assert items["minItems"] == items["maxItems"] == 2
    unconstrained = Judge(stack, rules=[], default_reply=EQUAL)
    verify(start_env(stack, unconstrained.url), OCEAN_ROW, "Pacific")
    assert "text" not in unconstrained.bodies[-1]


def test_verdict_labels_must_match_the_regexes_when_constrained():
    config_type = load_server_class(SERVER_DIR / "app.py").Config
    with pytest.raises(ValueError, match="judge_verdict_labels"):
        config_type.model_validate({"constrain_judge_output": True, "judge_verdict_labels": ["yes", "no"]})
    config_type.model_validate(
        {
            "constrain_judge_output": True,
            "judge_verdict_labels": ["SAME", "DIFFERENT"],
            "judge_equal_regex": r"\bSAME\b",
            "judge_not_equal_regex": r"\bDIFFERENT\b",
        }
    )


def test_question_defaults_to_the_last_user_message(stack):
    scripted = Judge(
        stack,
        rules=[
            {
                "match": (
                    r"<question>\nWhat is the largest ocean on Earth\? Answer in one short sentence\.\n</question>"
                ),
                "reply": EQUAL,
            }
        ],
        default_reply=NOT_EQUAL,
    )
    row = {k: v for k, v in OCEAN_ROW.items() if k != "question"}
    assert verify(start_env(stack, scripted.url), row, "Pacific").json()["reward"] == 1.0


def test_swap_check_both_orders_must_agree(stack):
    forward = {"match": r"<answer_a>\nThe Pacific Ocean\n</answer_a>\s*<answer_b>\nPacific\n", "reply": EQUAL}
    swapped = {"match": r"<answer_a>\nPacific\n</answer_a>\s*<answer_b>\nThe Pacific Ocean\n", "reply": EQUAL}
    agreeing = Judge(stack, rules=[forward, swapped], default_reply=NOT_EQUAL)
    answer = verify(start_env(stack, agreeing.url, check_twice_swap=True), OCEAN_ROW, "Pacific").json()
    assert answer["reward"] == 1.0 and answer["judge_swap_verdict"] == "equal" and agreeing.calls == 2
    biased = Judge(stack, rules=[forward], default_reply=NOT_EQUAL)  # says equal only in the first order
    answer = verify(
        start_env(stack, biased.url, check_twice_swap=True, reward_if_swap_fails=0.25), OCEAN_ROW, "Pacific"
    ).json()
    assert answer["reward"] == 0.25 and answer["failure_reason"] == "swap_disagrees"
    assert (answer["judge_verdict"], answer["judge_swap_verdict"]) == ("equal", "not_equal") and biased.calls == 2


def test_judge_down_or_failing_is_a_typed_502_not_reward_0(stack):
    down = verify(start_env(stack, "http://127.0.0.1:9"), OCEAN_ROW, "Pacific")
    assert (
        down.status_code == 502
        and down.json()["error"]["type"] == "unavailable"
        and down.json()["error"]["server"] == "judge"
    )
    failing = Judge(stack, error_status=500)
    broken = verify(start_env(stack, failing.url), OCEAN_ROW, "Pacific")
    assert broken.status_code == 502 and broken.json()["error"]["type"] == "http_error"


def test_unparsable_verdict_is_retried_then_a_failure(stack):
    scripted = Judge(stack, default_reply="Hard to say.")
    answer = verify(start_env(stack, scripted.url, max_judge_attempts=3), OCEAN_ROW, "Pacific")
    assert answer.status_code == 502 and answer.json()["error"]["type"] == "judge_unparsable"
    assert "Hard to say." in answer.json()["error"]["message"] and scripted.calls == 3


def test_bad_model_output_scores_0_without_a_judge_call(stack):
    scripted = Judge(stack, default_reply=EQUAL)
    url = start_env(stack, scripted.url, max_answer_chars=100)
    assert verify(url, OCEAN_ROW, "").json()["failure_reason"] == "no_answer"
    assert verify(url, OCEAN_ROW, "<think>Pacific?</think>").json()["failure_reason"] == "no_answer"
    assert verify(url, OCEAN_ROW, "Pacific " * 50).json()["failure_reason"] == "too_long"
    odd = httpx.post(
        f"{url}/verify",
        json={**OCEAN_ROW, "response": {"output": [{"type": "message", "content": 7}, "x"]}},
        timeout=30,
    ).json()
    assert odd["reward"] == 0.0 and odd["failure_reason"] == "no_answer" and scripted.calls == 0


def test_collector_writes_a_judge_failure_to_the_failures_file(stack, tmp_path):
    env_url = start_env(stack, "http://127.0.0.1:9")
    policy = stack.enter_context(
        serve(
            load_server_class(REPO / "responses_api_models/scripted_model/app.py")(
                {"default_reply": "Pacific"}
            ).build_app()
        )
    )
    agent = load_server_class(REPO / "responses_api_agents/simple_agent/app.py")(
        {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
        },
        client=ServerClient(addresses={"env": env_url, "policy_model": policy}, timeouts=FAST),
    )
    head = build_head_app()
    head.state.servers["agent"] = {"name": "agent", "url": stack.enter_context(serve(agent.build_app()))}
    head_url = stack.enter_context(serve(head))
    (tmp_path / "in.jsonl").write_text(json.dumps(OCEAN_ROW) + "\n")
    config = CollectConfig(
        agent_name="agent",
        input_jsonl_fpath=str(tmp_path / "in.jsonl"),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        progress=False,
        max_retries=0,
        head_server_url=head_url,
    )

    async def collect():
        async with ServerClient(head_url, timeouts=FAST) as client:
            return await collect_rollouts(config, client)

    summary = asyncio.run(collect())
    assert summary.rollouts_done == 0 and sum(summary.failures_by_class.values()) == 1
    failure = json.loads((tmp_path / "out_failures.jsonl").read_text())
    # The typed failure of the judge travels through the environment and the agent with its class and server.
    assert (
        failure["failure_class"] == "unavailable"
        and failure["failed_server"] == "judge"
        and failure["status_code"] == 502
    )
    assert not (tmp_path / "out.jsonl").read_text().strip()


def test_parse_verdict_last_label_wins():
    assert (
        judge.parse_verdict("Not [[A!=B]] after all: [[A=B]]", judge.DEFAULT_EQUAL_REGEX, judge.DEFAULT_NOT_EQUAL_REGEX)
        is True
    )
    assert (
        judge.parse_verdict("[[A=B]]? No. [[A!=B]]", judge.DEFAULT_EQUAL_REGEX, judge.DEFAULT_NOT_EQUAL_REGEX) is False
    )
    assert judge.parse_verdict("no label", judge.DEFAULT_EQUAL_REGEX, judge.DEFAULT_NOT_EQUAL_REGEX) is None
    assert (
        judge.render_prompt("{generated_answer} vs {expected_answer} {x} {question}", "q", "{question}", "a")
        == "a vs {question} {x} q"
    )


# -- group judge ---------------------------------------------------------------------------------------------
PARIS = generate_data.task_row(0, "geography", "What is the capital of France?", "Paris")
SCORES = json.dumps(
    {
        "scores": [
            {"id": "1", "score": 1.0, "explanation": "correct"},
            {"id": 2, "score": 0.0, "explanation": "wrong city"},
            {"id": "3", "score": 0.8, "explanation": "correct, wordier"},
        ]
    }
)


def group_rows(*answers: str, row: dict[str, Any] = PARIS) -> list[dict[str, Any]]:
    return [{**row, "response": response(answer), "reward": 0.5} for answer in answers]


def verify_group(url: str, rows: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{url}/verify_group", json={"rows": rows}, timeout=30)


def test_group_judge_scores_distinct_answers_once_and_caches_the_group(stack):
    scripted = Judge(
        stack, rules=[{"match": r'<trajectory id="3">', "reply": f"```json\n{SCORES}\n```"}], default_reply="no"
    )
    url = start_env(stack, scripted.url)
    first = verify_group(url, group_rows("Paris", "Lyon", "Paris", "Paris, the capital city")).json()
    assert first == {
        "rewards": [1.0, 0.0, 1.0, 0.8],
        "explanations": ["correct", "wrong city", "correct", "correct, wordier"],
        "cached": False,
    }
    again = verify_group(
        url, group_rows("Lyon", "Paris, the capital city", "Paris")
    ).json()  # same task, same set of answers
    assert again == {
        "rewards": [0.0, 0.8, 1.0],
        "explanations": ["wrong city", "correct, wordier", "correct"],
        "cached": True,
    }
    assert scripted.calls == 1


def test_group_judge_bad_json_is_retried_once_then_a_failure(stack):
    scripted = Judge(stack, default_reply='{"scores": [{"id": "1", "score": 1.5}]}')  # score out of range, ids missing
    answer = verify_group(start_env(stack, scripted.url), group_rows("Paris", "Lyon", "Nice"))
    assert answer.status_code == 502 and answer.json()["error"]["type"] == "judge_unparsable" and scripted.calls == 2


def test_group_request_errors_are_422(stack):
    url = start_env(stack, "http://127.0.0.1:9")
    other_task = group_rows("Rome", row=generate_data.task_row(1, "geography", "What is the capital of Italy?", "Rome"))
    assert verify_group(url, group_rows("Paris") + other_task).status_code == 422
    assert verify_group(url, []).status_code == 422
    assert (
        verify_group(url, [{k: v for k, v in group_rows("Paris")[0].items() if k != "expected_answer"}]).status_code
        == 422
    )
    assert httpx.post(f"{url}/verify_group", content=b"[1]", timeout=30).status_code == 422


def test_shared_prefix_is_sent_once():
    rows = group_rows("Paris", "Lyon")
    trajectories = [group.trajectory_messages(r["responses_create_params"], r["response"]) for r in rows]
    assert group.shared_prefix_length(trajectories) == 1
    assert group.shared_prefix_length([trajectories[0], trajectories[0]]) == 1  # each keeps its last message
    messages = group.render_group_prompt("be fair", trajectories[0][:1], ["[1]", "[2]"], "Paris")
    assert messages[1]["content"].count("capital of France") == 1 and "be fair" in messages[0]["content"]


def test_ng_group_verify_end_to_end(stack, tmp_path):
    scripted = Judge(
        stack, rules=[{"match": "capital of France", "reply": SCORES}], default_reply="I cannot score these."
    )
    env_url = start_env(stack, scripted.url)
    head = build_head_app()
    head.state.servers["llm_judge"] = {"name": "llm_judge", "url": env_url}
    head_url = stack.enter_context(serve(head))
    italy = generate_data.task_row(1, "geography", "What is the capital of Italy?", "Rome")
    rows = group_rows("Paris", "Lyon", "Paris, the capital city") + group_rows("Rome", "Milan", row=italy)
    for index, row in enumerate(rows):
        row.update(_ng_task_index=0 if index < 3 else 1, _ng_rollout_index=index % 3)
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        f"+rollouts_jsonl_fpath={tmp_path / 'rollouts.jsonl'}",
        f"+output_jsonl_fpath={tmp_path / 'grouped.jsonl'}",
        "+resources_server=llm_judge",
        f"+head_server_url={head_url}",
        "+num_groups_in_parallel=2",
        "+max_retries=0",
    ]
    assert (
        cli.main("group_verify", argv) == 1
    )  # the command as ng_group_verify runs it, in this process; one group failed
    scored = read_jsonl(tmp_path / "grouped.jsonl")
    assert [(r["reward"], r["pointwise_reward"], r["group_explanation"]) for r in scored] == [
        (1.0, 0.5, "correct"),
        (0.0, 0.5, "wrong city"),
        (0.8, 0.5, "correct, wordier"),
    ]
    failure = json.loads((tmp_path / "grouped_failures.jsonl").read_text())
    assert (
        failure["_ng_task_index"] == 1
        and failure["_ng_rollout_indices"] == [0, 1]
        and failure["failure_class"] == "judge_unparsable"
    )


# -- data and configs ------------------------------------------------------------------------------------------
def test_bundled_data_is_what_the_script_writes():
    rows = generate_data.all_rows()
    assert len(rows) >= 50 and len({r["task_id"] for r in rows}) == len(rows)
    written = (SERVER_DIR / "data/llm_judge_tasks.jsonl").read_text()
    assert written == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert (SERVER_DIR / "data/example.jsonl").read_text() == "".join(
        json.dumps(r, ensure_ascii=False) + "\n" for r in generate_data.example_rows(rows)
    )


def test_openai_judge_config_composes_a_separate_judge_model():
    scripted = REPO / "responses_api_models/scripted_model/configs/scripted_model.yaml"
    loaded = load_config(
        [
            f"+config_paths=[{SERVER_DIR / 'configs/llm_judge_openai.yaml'},{scripted}]",
            "+policy_base_url=http://127.0.0.1:1/v1",
            "+policy_api_key=x",
            "+policy_model_name=m",
            "++judge_base_url=http://127.0.0.1:2/v1",
            "++judge_model_name=judge-m",
        ]
    )
    instances = {i.name: i for i in server_instances(loaded)}
    assert (
        instances["judge_model"].fields["openai_base_url"] == "http://127.0.0.1:2/v1"
        and instances["judge_model"].fields["openai_model"] == "judge-m"
    )
    config = load_server_class(SERVER_DIR / "app.py").Config.model_validate(instances["llm_judge"].fields)
    assert config.judge_model_server.name == "judge_model" and config.check_twice_swap


def test_group_verify_names_a_row_without_task_index(tmp_path):
    from nemo_gym.collect.group_verify import group_rollouts
    from nemo_gym.common.errors import DataError

    (tmp_path / "r.jsonl").write_text(json.dumps({"_ng_task_index": 0}) + "\n\n" + json.dumps({"reward": 1.0}) + "\n")
    with pytest.raises(DataError, match=r"r.jsonl:3: no integer _ng_task_index"):
        group_rollouts(tmp_path / "r.jsonl")
