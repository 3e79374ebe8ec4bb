"""The rollout viewer's index, filters, rendering and statistics, on NeMo Gym's real example rollouts.

The browser test (a real `ng_viewer` process in Chromium) and the 200 MB memory test are in
test_viewer_integration.py.
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import numpy as np
import pytest

from nemo_gym.cli import main
from nemo_gym.collect.health import run_health_checks
from nemo_gym.collect.profile import reward_stats
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.capture import TrajectoryCapture
from nemo_gym.viewer import RolloutIndex, RowFilter, render_rollout, reward_histogram, task_reward_stats
from nemo_gym.viewer.capture_view import HealthVerdicts
from nemo_gym.viewer.index import output_chars

REPO = Path(__file__).resolve().parent.parent
PEER_SERVERS = REPO.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
MULTIREWARD = PEER_SERVERS / "example_tool_call_multireward" / "data" / "example_rollouts.jsonl"
MULTIREWARD_AGENT = "example_tool_call_multireward_simple_agent"
pytestmark = pytest.mark.skipif(not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found (../shared/peer_data)")


def peer_rollout_files() -> list[Path]:
    return sorted(PEER_SERVERS.glob("*/data/example_rollouts.jsonl"))


@pytest.fixture
def all_peer_rollouts(tmp_path: Path) -> Path:
    """The 5 peer rollout files (25 rows) in one file, with a blank line between files."""
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"\n".join(f.read_bytes() for f in peer_rollout_files()))
    return path


def test_index_reads_every_row_back_by_offset(all_peer_rollouts: Path) -> None:
    index = RolloutIndex.build(all_peer_rollouts)
    rows = read_jsonl(all_peer_rollouts)
    assert len(index) == len(rows) == 25 and index.skipped_lines == []
    for row_id, row in enumerate(rows):
        assert index.read(row_id) == row
    with pytest.raises(IndexError):
        index.read(25)


def test_index_table_fields_of_multireward_rollouts() -> None:
    index = RolloutIndex.build(MULTIREWARD)
    table = index.table(range(len(index)))
    assert list(table.columns) == [
        "row",
        "task_index",
        "repeat",
        "reward",
        "output_chars",
        "output_tokens",
        "tool_calls",
        "turns",
        "environment",
        "stop_reason",
    ]
    assert table["task_index"].tolist() == [1, 0, 4, 2, 3]  # `_ng_task_index`, not the line order
    assert table["repeat"].tolist() == [0] * 5
    assert table["reward"].tolist() == [2.0] * 5
    assert set(table["environment"]) == {MULTIREWARD_AGENT} and set(table["stop_reason"]) == {"completed"}
    assert table["output_tokens"].iloc[0] == 142  # response.usage.output_tokens
    # row 0 [reasoning, call, output, message]: 1 call, 2 turns; the others [reasoning, call, output, reasoning,
    # message]: the same
    assert table["tool_calls"].tolist() == [1] * 5 and table["turns"].tolist() == [2] * 5
    # Row 0 generated: an empty reasoning item, arguments '{"city": "New York"}' (20 characters) and the message
    # "\n\nThe weather in New York is sunny." (2 + 33 characters): 20 + 35 = 55.
    assert table["output_chars"].iloc[0] == 55


def test_rows_without_collector_fields_get_position_and_response_status(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rows = [
        {
            "response": {"output": [], "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
            "reward": 0.5,
        },
        {"response": {"output": []}, "dataset": "gsm8k"},  # no reward, no usage
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n[1, 2]\n{"truncated')
    index = RolloutIndex.build(path)
    assert index.skipped_lines == [3, 4]  # a list and a half-written tail line are skipped, not fatal
    table = index.table([0, 1])
    assert table["task_index"].tolist() == [0, 1] and table["stop_reason"].tolist() == ["max_output_tokens", "(none)"]
    assert table["environment"].tolist() == ["(none)", "gsm8k"]
    assert math.isnan(table["reward"].iloc[1]) and table["output_tokens"].isna().tolist() == [True, True]
    # A row without a reward passes only when the reward range is open.
    assert index.filter(RowFilter()).tolist() == [0, 1]
    assert index.filter(RowFilter(reward_max=1.0)).tolist() == [0]


def test_filters_by_reward_environment_and_text(all_peer_rollouts: Path) -> None:
    index = RolloutIndex.build(all_peer_rollouts)
    table = index.table(range(len(index)))
    high = index.filter(RowFilter(reward_min=1.5))
    assert table.loc[high, "environment"].eq(MULTIREWARD_AGENT).all() and len(high) == 5
    zero = index.filter(RowFilter(reward_min=0.0, reward_max=0.0))
    assert sorted(table.loc[zero, "reward"].unique()) == [0.0] and len(zero) == int((table["reward"] == 0.0).sum()) > 0
    assert index.filter(RowFilter(environments=(MULTIREWARD_AGENT,))).tolist() == high.tolist()
    assert index.filter(RowFilter(environments=("no_such_env",))).tolist() == []
    # Case-insensitive; the quoted form matches the JSON-escaped arguments string '{\"city\": \"New York\"}'.
    new_york = index.filter(RowFilter(text='"CITY": "new york"'))
    assert len(new_york) > 0 and all('"city": "New York"' in json.dumps(index.read(i)) for i in new_york)
    assert set(index.filter(RowFilter(reward_min=1.5, text='"city": "new york"'))) <= set(high)
    assert index.filter(RowFilter(text="no such text anywhere 8c1f")).tolist() == []


def test_render_shows_messages_tool_calls_outputs_reward_and_verifier_fields() -> None:
    row = RolloutIndex.build(MULTIREWARD).read(0)
    page = render_rollout(row, "Row 0")
    assert "respond with exactly one get_weather tool call" in page  # developer message
    assert "how hot is it in New York today?" in page  # user message
    assert "reasoning" in page and "(no reasoning text)" in page
    assert 'class="ng-tool-name">get_weather</code>' in page
    assert "&quot;city&quot;: &quot;New York&quot;" in page  # arguments, pretty-printed and escaped
    assert "The weather in New York is sunny." in page  # function_call_output and assistant message
    assert 'ng-final-reward">2.0<' in page
    assert "reward_components" in page and "schema_valid" in page and "predicted_calls" in page


def test_render_escapes_html_and_hides_token_ids() -> None:
    row = {
        "responses_create_params": {"input": "<script>alert(1)</script>", "instructions": "be brief"},
        "response": {
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "a < b"}],
                    "generation_token_ids": [1, 2, 3],
                }
            ]
        },
        "reward": 1.0,
        "extracted_answer": "<b>",
    }
    page = render_rollout(row)
    assert (
        "<script>" not in page
        and "&lt;script&gt;" in page
        and "a &lt; b" in page
        and "&quot;&lt;b&gt;&quot;" not in page
    )
    assert "be brief" in page and "not shown: 3 generation_token_ids" in page and "[1, 2, 3]" not in page


def test_a_captured_rollout_shows_its_calls_and_health_verdict_not_the_raw_record(tmp_path) -> None:
    """A rollout of `+observability_enabled=true`: its model calls (a refused one, then the answer) and ng_perf as
    tables and a line, not the record's JSON (whose request copies repeat the conversation), and the health verdict
    ng_health_check wrote beside the file, in the table too, to sort and filter by."""
    capture = TrajectoryCapture.of_row("policy_model", {"task_id": "t"}, "0-0")
    sent = {"input": [{"role": "user", "content": "REQUEST-COPY"}]}
    capture.model_call(sent, None, 1.0, 0.2, status_code=503, error_category="http_error")
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}
    answer = {"id": "r1", "status": "completed", "output": [message], "usage": {"input_tokens": 7, "output_tokens": 3}}
    capture.model_call(sent, answer, 2.0, 0.5)
    row = {
        "responses_create_params": {"input": "2+2?"},
        "response": answer,
        "reward": 1.0,
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "ng_trajectory": capture.record([*sent["input"], message], completed=True, resolved=True),
        "ng_perf": {"num_turns": 1, "prompt_tokens": 7},
    }
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(json.dumps(row) + "\n")
    run_health_checks(rollouts)  # rollout_verdicts.jsonl beside it
    verdict = HealthVerdicts.beside(rollouts).of(row)
    page = render_rollout(row, verdict=verdict)
    assert f"health: {verdict['verdict']}" in page
    assert "503 (http_error)" in page and "<td>500.0</td>" in page and "root</code>: completed, 1 turns" in page
    assert "ng_perf: num_turns 1, prompt_tokens 7" in page and "REQUEST-COPY" not in page
    assert HealthVerdicts.beside(tmp_path / "elsewhere" / "rollouts.jsonl").of(row) is None
    hollow = {"verdict": "unhealthy", "findings": [{"check": "agent_turn_hollow", "turn": 1}], "unobserved": ["x"]}
    shown = render_rollout(row, verdict=hollow)
    assert (
        "health: unhealthy" in shown and "agent_turn_hollow: {&quot;turn&quot;:1}" in shown and "unobserved: x" in shown
    )
    assert "health:" not in render_rollout(row) and "Capture record" not in render_rollout({"reward": 0.0})
    assert HealthVerdicts({(0, 0): hollow}).label(0, 0) == "unhealthy: agent_turn_hollow"
    # the table has a health column beside the reward to sort by
    from nemo_gym.viewer.app import _Views

    table = _Views(RolloutIndex.build(rollouts)).apply("", "", [], "")[0]
    assert table["health"].tolist() == [verdict["verdict"]]
    assert list(table.columns).index("health") == list(table.columns).index("reward") + 1
    # and a filter by verdict: the unhealthy rollouts alone
    views = _Views(RolloutIndex.build(rollouts))
    views.verdicts = HealthVerdicts({(0, 0): hollow}, rollouts)
    assert views.apply("", "", [], "", ["unhealthy"])[0]["health"].tolist() == ["unhealthy: agent_turn_hollow"]
    none, summary, *_ = views.apply("", "", [], "", ["healthy", "unobserved"])
    assert none.empty and summary.startswith("**0** of 1 rollouts match")


def test_output_chars_counts_generated_text_only() -> None:
    response = {
        "output": [
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "think"}],
                "content": [{"type": "reasoning_text", "text": "hard"}],
            },
            {"type": "function_call", "name": "f", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": "a long tool output not generated by the policy",
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
        ]
    }
    assert output_chars(response) == len("think") + len("hard") + len("{}") + len("done")  # 5 + 4 + 2 + 4 = 15
    assert output_chars(None) == 0


def test_task_reward_stats_match_ng_profile(all_peer_rollouts: Path) -> None:
    index = RolloutIndex.build(all_peer_rollouts)
    table = index.table(range(len(index)))
    table.loc[[0, 1], ["task_index", "environment"]] = [0, "(none)"]  # two rollouts of one task
    stats = task_reward_stats(table)
    for _, task in stats.iterrows():
        rewards = table[(table["environment"] == task["environment"]) & (table["task_index"] == task["task_index"])][
            "reward"
        ].tolist()
        expected = reward_stats(rewards)
        for key in ("avg_reward", "std_reward", "min_reward", "max_reward", "median_reward", "total_samples"):
            assert task[key] == pytest.approx(expected[key]), key


def test_reward_histogram_bars() -> None:
    two = reward_histogram(np.array([0.0, 1.0, 1.0, np.nan]))
    assert two["reward"].tolist() == ["0", "1"] and two["count"].tolist() == [1, 2]
    spread = reward_histogram(np.linspace(0.0, 1.0, 101), bins=4)  # 0.00 .. 1.00 in 4 bins of width 0.25
    assert spread["count"].tolist() == [25, 25, 25, 26] and spread["reward"].iloc[-1] == "[0.75, 1]"
    assert reward_histogram(np.array([np.nan])).empty


def test_viewer_page_callbacks(all_peer_rollouts: Path) -> None:
    from nemo_gym.viewer.app import _Views, build_app

    index = RolloutIndex.build(all_peer_rollouts)
    build_app(index)  # the page builds
    table, summary, histogram, per_task = _Views(index).apply("1.5", "", [], "")
    assert len(table) == 5 and summary.startswith("**5** of 25") and histogram["count"].tolist() == [5]
    assert "health" not in table.columns  # no ng_health_check verdicts beside that file
    assert per_task["avg_reward"].tolist() == [2.0] * 5
    assert "get_weather" in _Views(index).open_row(int(table["row"].iloc[0]))
    assert "Cannot open row 99" in _Views(index).open_row(99)


def test_free_port_skips_a_taken_port() -> None:
    from nemo_gym.viewer.app import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert free_port("127.0.0.1", port) > port


def test_ng_viewer_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("viewer", ["+help=true"]) == 0
    assert "+jsonl_fpath: str = required" in capsys.readouterr().out
    assert main("viewer", ["+jsonl_fpath=x.jsonl", "+server_prot=7000"]) == 2
    assert "did you mean" in capsys.readouterr().err
    assert main("viewer", ["+jsonl_fpath=x.jsonl", "+baseline_jsonl=y.jsonl"]) == 2
    assert "did you mean 'baseline_jsonl_fpath'" in capsys.readouterr().err


# -- two files compared (+baseline_jsonl_fpath) ------------------------------------------------------------
SINGLE_TOOL_CALL = PEER_SERVERS / "example_single_tool_call" / "data" / "example_rollouts.jsonl"


def before_after(tmp_path: Path) -> tuple[Path, Path]:
    """NeMo Gym's example_single_tool_call rollouts (rewards [0, 0, 1, 1, 1]; rows 0-1 answer in text) as "before";
    "after": tasks 0-1 answer with row 2's get_weather trajectory (reward 1), task 4 is missing, and task 0 has a
    second rollout (row 0's own, reward 0)."""
    rows = [json.loads(line) for line in SINGLE_TOOL_CALL.read_text().splitlines()]
    after = [
        {**row, "response": rows[2]["response"], "reward": 1.0} if i < 2 else row for i, row in enumerate(rows[:4])
    ] + [rows[0]]
    before_path, after_path = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after_path.write_text("".join(json.dumps(r) + "\n" for r in after))
    return before_path, after_path


def test_rows_of_task_in_repeat_order(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": r, "reward": 1.0}
        for t, r in [(1, 1), (0, 0), (1, 0), (0, 1), (1, 2)]
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = RolloutIndex.build(path)
    assert index.rows_of_task(1).tolist() == [2, 0, 4] and index.rows_of_task(0).tolist() == [1, 3]  # by repeat
    assert index.rows_of_task(7).tolist() == [] and index.rows_of_task("sha256:x").tolist() == []


def test_compared_files_summary_tasks_and_difference(tmp_path: Path) -> None:
    from nemo_gym.viewer.compare import ComparedFiles

    before, after = before_after(tmp_path)
    compared = ComparedFiles.build(RolloutIndex.build(before), RolloutIndex.build(after))
    summary = compared.summary_table().set_index("metric")
    # before: 5 rollouts, rewards [0, 0, 1, 1, 1], tool calls [0, 0, 1, 1, 1], turns [1, 1, 2, 2, 2]
    # after: 5 rollouts, rewards [1, 1, 1, 1, 0], tool calls [1, 1, 1, 1, 0], turns [2, 2, 2, 2, 1]
    assert summary.loc["tasks"].tolist() == [5, 4, -1] and summary.loc["rollouts"].tolist() == [5, 5, 0]
    assert summary.loc["mean reward", "baseline"] == pytest.approx(0.6) and summary.loc[
        "mean reward", "candidate"
    ] == pytest.approx(0.8)
    assert summary.loc["tool calls per rollout"].tolist() == pytest.approx([0.6, 0.8, 0.2])
    assert summary.loc["turns per rollout"].tolist() == pytest.approx([1.6, 1.8, 0.2])
    tasks = compared.tasks.set_index("task")
    task0 = compared.tasks.loc[compared.tasks["candidate_n"] == 2, "task"].iloc[0]  # the task with two rollouts after
    # task 0: before [0]; after [1, 0]: mean 0.5, delta +0.5; pass rate 0 -> 0.5; tool calls 0 -> 0.5; turns 1 -> 1.5
    assert tasks.loc[
        task0,
        [
            "baseline_reward",
            "candidate_reward",
            "reward_delta",
            "candidate_pass_rate",
            "candidate_tool_calls",
            "candidate_turns",
        ],
    ].tolist() == [0.0, 0.5, 0.5, 0.5, 0.5, 1.5]
    assert sorted(compared.tasks["status"]) == ["baseline only"] + ["both"] * 4
    # paired deltas: task 0 +0.5, task 1 +1, tasks 2-3 0: mean 0.375
    assert compared.difference.mean_difference == pytest.approx(0.375)
    assert (compared.difference.improved, compared.difference.worsened, compared.difference.unchanged) == (2, 0, 2)
    assert "**+0.3750**" in compared.headline() and "Tasks only in baseline: 1;" in compared.headline()
    assert (
        len(compared.filter_tasks("improved")) == 2
        and len(compared.filter_tasks("baseline only")) == 1
        and len(compared.filter_tasks("all")) == 5
    )


def test_compare_views_side_by_side(tmp_path: Path) -> None:
    from nemo_gym.viewer.app import build_app
    from nemo_gym.viewer.compare import ComparedFiles
    from nemo_gym.viewer.compare_page import CompareViews, parse_task_key

    before, after = before_after(tmp_path)
    compared = ComparedFiles.build(RolloutIndex.build(before), RolloutIndex.build(after))
    build_app(compared.candidate, 0.0, compared)  # the page builds, Compare tab included
    views = CompareViews(compared)
    headline, summary = views.overview()
    assert "+0.3750" in headline and summary["metric"].tolist()[:2] == ["tasks", "rollouts"]
    table, note = views.tasks("improved")
    assert note.startswith("**2** of 5 tasks (improved)") and set(table["status"]) == {"both"}
    task0 = compared.tasks.loc[compared.tasks["candidate_n"] == 2, "task"].iloc[0]
    left, right = views.open_task(task0, 0)
    assert (
        "before.jsonl" in left
        and "reward <b>0.0</b> · tool calls 0 · turns 1" in left
        and "how&#x27;s the outside?" in left
    )
    assert (
        "after.jsonl" in right
        and "reward <b>1.0</b> · tool calls 1 · turns 2" in right
        and 'ng-tool-name">get_weather<' in right
    )
    assert "rollout 1 of 2" in right and "rollout 2 of 2" in views.open_task(task0, 1)[1]
    assert "This file has 1 rollout(s)" in views.open_task(task0, 1)[0]
    only_before = compared.tasks.loc[compared.tasks["status"] == "baseline only", "task"].iloc[0]
    left, right = views.open_task(only_before, 0)
    assert "going out in sf tn" in left and "is not in this file" in right
    assert "Select a task" in views.open_task("", 0)[0]
    assert parse_task_key(" 12 ") == 12 and parse_task_key("sha256:ab") == "sha256:ab" and parse_task_key(None) is None


def test_compare_task_indexed_files_flags_other_prompts_and_unrated_rows(tmp_path: Path) -> None:
    from nemo_gym.viewer.compare import ComparedFiles

    rows = [json.loads(line) for line in MULTIREWARD.read_text().splitlines()]  # tasks 1, 0, 4, 2, 3; reward 2.0 each
    changed = json.loads(json.dumps(rows))
    changed[0]["responses_create_params"]["input"][-1]["content"] = "a different question"  # task 1
    changed[1]["reward"] = None  # task 0: no reward
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    compared = ComparedFiles.build(
        RolloutIndex.build(tmp_path / "a.jsonl"), RolloutIndex.build(tmp_path / "b.jsonl"), pass_threshold=2.0
    )
    assert compared.tasks["task"].tolist() == ["0", "1", "2", "3", "4"]  # by _ng_task_index
    assert compared.tasks["status"].tolist() == ["baseline only", "both", "both", "both", "both"]  # task 0 unrated in b
    assert compared.tasks["same_prompt"].tolist() == [None, False, True, True, True]
    assert compared.difference.prompt_mismatches == [1] and compared.unrated_rows == {"baseline": 0, "candidate": 1}
    assert "1 paired tasks have different prompts" in compared.headline() and "candidate 1" in compared.headline()
    assert compared.summary_table().set_index("metric").loc["pass rate"].tolist() == [1.0, 1.0, 0.0]  # 2.0 >= 2.0


def test_baseline_with_broken_lines_is_said_in_the_page(tmp_path: Path) -> None:
    from nemo_gym.viewer.app import _header
    from nemo_gym.viewer.compare import ComparedFiles

    before, after = before_after(tmp_path)
    before.write_text(before.read_text() + "{half-written\n")
    baseline = RolloutIndex.build(before)
    ComparedFiles.build(baseline, RolloutIndex.build(after))  # the rows that parse are compared
    assert "Skipped 1 line(s) that are not JSON objects (line 6)" in _header(
        baseline, 0.0, "Baseline"
    ) and "### Baseline:" in _header(baseline, 0.0, "Baseline")


def test_verdicts_are_shown_only_for_the_file_they_are_of(tmp_path, capsys):
    """Two collections in one folder: the second's health check replaces the first's verdicts (0.7.0's file names),
    says so, and the viewer shows them for the second file only; a changed file, files checked together and verdicts
    that 0.7.0's check wrote (no sources record) are each said on the page."""
    from nemo_gym.collect.health import SOURCES_FILE, VERDICTS_FILE, verdict_sources

    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    row = {"reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0, "response": {"output": []}}
    first.write_text(json.dumps(row) + "\n")
    second.write_text(json.dumps(row | {"reward": 0.5}) + "\n")
    assert run_health_checks(first).replaced == []
    assert HealthVerdicts.beside(first).of(row) and not HealthVerdicts.beside(first).note
    report = run_health_checks(second)
    assert report.replaced == ["first.jsonl"] and "Replaced the verdicts of first.jsonl" in report.text()
    assert run_health_checks(second).replaced == []  # its own verdicts again: nothing said
    shown, hidden = HealthVerdicts.beside(second), HealthVerdicts.beside(first)
    assert shown.of(row) and shown.path == tmp_path / VERDICTS_FILE
    assert hidden.of(row) is None and hidden.path is None and "holds the verdicts of second.jsonl" in hidden.note
    assert f"+rollouts_jsonl_fpath={first}" in hidden.note
    from nemo_gym.viewer.app import _Views

    assert "health" not in _Views(RolloutIndex.build(first)).apply("", "", [], "")[0].columns
    # the file as checked, then changed
    second.write_text(json.dumps(row | {"reward": 0.0}) + "\n")
    assert "this file changed since" in HealthVerdicts.beside(second).note and not HealthVerdicts.beside(second).of(row)
    # checked together: their indexes collide, so neither file's page takes them
    run_health_checks([first, second])
    assert [s["name"] for s in verdict_sources(tmp_path)] == ["first.jsonl", "second.jsonl"]
    assert "first.jsonl, second.jsonl checked together" in HealthVerdicts.beside(first).note
    # a check that records no sources (0.7.0's) replaced the verdicts since: shown, with what is not known
    (tmp_path / VERDICTS_FILE).write_text(json.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0, "verdict": "x"}))
    assert verdict_sources(tmp_path) is None
    unknown = HealthVerdicts.beside(first)
    assert unknown.of(row)["verdict"] == "x" and "nothing records which rollouts file" in unknown.note
    (tmp_path / SOURCES_FILE).write_text("{not json")
    assert verdict_sources(tmp_path) is None and HealthVerdicts.beside(first).of(row)["verdict"] == "x"
