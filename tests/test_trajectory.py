"""nemo_gym.env.trajectory: the typed view of a rollout's `response`, on NeMo Gym's real rollouts and on malformed
ones."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.env.answers import last_assistant_text
from nemo_gym.env.trajectory import Trajectory

PEER_SERVERS = REPO_ROOT.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
needs_peer_data = pytest.mark.skipif(
    not PEER_SERVERS.is_dir(), reason="NeMo Gym peer data not found (../shared/peer_data)"
)


def rollouts(server: str) -> list[dict[str, Any]]:
    return read_jsonl(PEER_SERVERS / server / "data" / "example_rollouts.jsonl")


def call(call_id: str | None, name: Any = "submit", arguments: Any = "{}") -> dict[str, Any]:
    item = {"type": "function_call", "name": name, "arguments": arguments}
    return item if call_id is None else {**item, "call_id": call_id}


def tool_output(call_id: str | None, output: Any = "ok") -> dict[str, Any]:
    item = {"type": "function_call_output", "output": output}
    return item if call_id is None else {**item, "call_id": call_id}


def message(text: str, role: str | None = "assistant") -> dict[str, Any]:
    item = {"type": "message", "content": [{"type": "output_text", "text": text}]}
    return item if role is None else {**item, "role": role}


# -- NeMo Gym's rollouts ---------------------------------------------------------------------------------------
@needs_peer_data
@pytest.mark.parametrize(
    "server",
    ["example_multi_step", "example_tool_call_multireward", "example_single_tool_call", "example_session_state_mgmt"],
)
def test_real_rollouts_match_each_call_to_its_output(server: str) -> None:
    for row in rollouts(server):
        output = row["response"]["output"]
        view = Trajectory.of(row["response"])
        raw_calls = [item for item in output if item.get("type") == "function_call"]
        assert [c.name for c in view.function_calls] == [item["name"] for item in raw_calls]
        assert [c.arguments for c in view.function_calls] == [json.loads(item["arguments"]) for item in raw_calls]
        assert all(
            c.arguments_error is None and c.arguments_text == item["arguments"]
            for c, item in zip(view.function_calls, raw_calls)
        )
        # NeMo Gym's simple agent answers every call right after it, with the same call_id
        for c in view.function_calls:
            assert c.output is not None and c.output.call_id == c.call_id and c.output.index > c.index
            assert c.output.text == output[c.output.index]["output"]
        assert view.orphan_outputs == () and len(view.tool_outputs) == len(raw_calls)
        assert view.final_text == last_assistant_text(row["response"])


@needs_peer_data
def test_multi_step_rollout_worked_example() -> None:
    # row 0: 3 calls, each answered (call, output, call, output, call, output, message): 3 + 1 model turns
    view = Trajectory.of(rollouts("example_multi_step")[0]["response"])
    assert [c.name for c in view.function_calls] == ["get_synonym_value", "get_synonym_value", "extract_synonym_values"]
    assert view.last_call("extract_synonym_values").arguments == {"synonym_values": [711, 407]}
    assert view.last_call("get_synonym_value").output.text == '{"synonym_value": 407}'
    assert view.final_text == "[711, 407]" and view.model_turns == 4 and view.reasoning_text == ""
    assert [m.role for m in view.messages] == ["assistant"]


@needs_peer_data
def test_reasoning_item_and_call_are_one_turn() -> None:
    # reasoning (empty summary), function_call, function_call_output, message: turns 1 (reasoning + call) and 2
    view = Trajectory.of(rollouts("example_tool_call_multireward")[0]["response"])
    assert view.model_turns == 2 and view.reasoning_text == ""
    assert view.function_calls[0].arguments == {"city": "New York"}


@needs_peer_data
def test_single_tool_call_rewards_are_whether_get_weather_was_called() -> None:
    # NeMo Gym 0.7.0's verifier: reward 1.0 iff the trajectory holds a get_weather call (rewards [0, 0, 1, 1, 1])
    rows = rollouts("example_single_tool_call")
    assert [float(bool(Trajectory.of(r["response"]).calls_named("get_weather"))) for r in rows] == [
        r["reward"] for r in rows
    ]


@needs_peer_data
def test_mcqa_output_text_is_the_message_text() -> None:
    for row in rollouts("mcqa"):
        view = Trajectory.of(row["response"])
        assert view.function_calls == () and view.model_turns == 1
        assert view.output_text == view.final_text == row["response"]["output"][-1]["content"][0]["text"]


# -- malformed responses ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "response",
    [{}, {"output": None}, {"output": "text"}, {"output": {"type": "message"}}, {"output": [1, "x", None, []]}],
)
def test_missing_or_junk_output_gives_an_empty_view(response: dict[str, Any]) -> None:
    view = Trajectory.of(response)
    assert (view.function_calls, view.tool_outputs, view.messages) == ((), (), ())
    assert (view.final_text, view.reasoning_text, view.output_text, view.model_turns) == ("", "", "", 0)


@pytest.mark.parametrize("response", [None, [], "output", 3])
def test_a_response_that_is_not_a_dict_is_a_type_error(response: Any) -> None:
    with pytest.raises(TypeError, match="must be a dict"):
        Trajectory.of(response)


@pytest.mark.parametrize(
    ("arguments", "parsed", "error"),
    [
        ('{"a": 1', None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object, got list"),
        ("null", None, "must be a JSON object, got NoneType"),
        ({"a": 1}, None, "must be a JSON string, got dict"),
        (7, None, "must be a JSON string, got int"),
        ("[" * 100_000, None, "not valid JSON"),  # nested past the recursion limit
        ("", {}, None),
        (None, {}, None),
        ('{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}, None),
    ],
)
def test_arguments_are_parsed_or_kept_raw_with_an_error(
    arguments: Any, parsed: dict[str, Any] | None, error: str | None
) -> None:
    (fc,) = Trajectory.of({"output": [call("c1", arguments=arguments)]}).function_calls
    assert fc.arguments == parsed
    assert (fc.arguments_error is None) if error is None else (error in fc.arguments_error)
    assert fc.arguments_text == (arguments if isinstance(arguments, str) else "")


def test_calls_without_name_or_call_id_are_kept() -> None:
    view = Trajectory.of({"output": [call(None, name=None), call("c2", name=["x"]), tool_output("c2")]})
    assert [(c.name, c.call_id) for c in view.function_calls] == [("", None), ("", "c2")]
    assert view.function_calls[0].output is None and view.function_calls[1].output.index == 2


def test_tool_outputs_without_their_call_are_orphans() -> None:
    output = [
        tool_output("early"),
        call("early"),
        call("c1"),
        tool_output("c1"),
        tool_output("unknown"),
        tool_output(None),
        tool_output("c1"),
    ]
    view = Trajectory.of({"output": output})
    early, c1 = view.function_calls
    assert early.output is None, "an output before its call answers nothing"
    assert c1.output.index == 3
    assert [o.index for o in view.orphan_outputs] == [0, 4, 5, 6]  # the second answer to c1 too
    assert len(view.tool_outputs) == 5


def test_repeated_call_ids_match_in_order() -> None:
    # some servers number call ids per turn: each output answers the earliest unanswered call with its id
    view = Trajectory.of({"output": [call("0", "a"), tool_output("0", "A"), call("0", "b"), tool_output("0", "B")]})
    assert [(c.name, c.output.text) for c in view.function_calls] == [("a", "A"), ("b", "B")]
    parallel = Trajectory.of({"output": [call("0", "a"), call("0", "b"), tool_output("0", "A"), tool_output("0", "B")]})
    assert [(c.name, c.output.text) for c in parallel.function_calls] == [("a", "A"), ("b", "B")]


def test_tool_output_that_is_not_a_string_is_json_text() -> None:
    parts = [{"type": "input_text", "text": "sunny"}]
    deep: list[Any] = []
    for _ in range(100_000):  # deeper than json.dumps goes
        deep = [deep]
    output = [
        call("c"),
        tool_output("c", parts),
        call("d"),
        tool_output("d", {"n": 1}),
        call("e"),
        tool_output("e", None),
        call("f"),
        tool_output("f", deep),
    ]
    view = Trajectory.of({"output": output})
    assert [c.output.text for c in view.function_calls] == [json.dumps(parts), '{"n": 1}', "", ""]


def test_messages_texts_and_turns() -> None:
    output = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
        message("first"),
        {"type": "message", "role": "assistant", "content": "a plain string"},  # not content parts: no text
        message("observation", role="user"),
        {
            "type": "reasoning",
            "summary": [{"text": "ignored"}],
            "content": [{"type": "reasoning_text", "text": "think"}, {"text": 5}],
        },
        message("final", role=None),  # no role: the assistant's
        message("   "),  # blank: not the final text
        {"type": "web_search_call"},  # neither starts nor ends a turn
    ]
    view = Trajectory.of({"output": output})
    assert [(m.index, m.role, m.text) for m in view.messages] == [
        (1, "assistant", "first"),
        (2, "assistant", ""),
        (3, "user", "observation"),
        (5, "assistant", "final"),
        (6, "assistant", "   "),
    ]
    assert view.final_text == "final" and view.output_text == "firstobservationfinal   "
    assert view.reasoning_text == "plan\nthink"
    assert view.model_turns == 2  # reasoning + first | user | reasoning + final + blank


def test_view_is_read_only() -> None:
    view = Trajectory.of({"output": [call("c1")]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.final_text = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.function_calls[0].name = "y"  # type: ignore[misc]


def test_last_call_and_calls_named() -> None:
    view = Trajectory.of({"output": [call("1", "a", '{"i": 1}'), call("2", "b"), call("3", "a", '{"i": 3}')]})
    assert [c.call_id for c in view.calls_named("a")] == ["1", "3"]
    assert view.last_call("a").arguments == {"i": 3} and view.last_call("missing") is None
