"""Training token capture (NeMo Gym 0.7.0's `token_id_capture`): the model server records each call of a rollout with
its token ids, putting the dropped token ids of the last assistant turn back (no drift); the collector rebuilds the
rollouts of an agent that drops them (openai_client_agent) and masks what it cannot rebuild whole.

Real HTTP on loopback: a head server, the example_single_tool_call resources server, openai_client_agent (the `openai`
client) and `ByteModel`, a model server whose tokenizer is UTF-8 bytes and whose every generation ends with token
256, an end-of-turn id that re-tokenizing the answer's text cannot give back (as a BPE model's re-tokenized text drifts
from its sampled ids)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_servers import serve

from nemo_gym.collect.engine import collect
from nemo_gym.collect.token_capture import MaskedCaptureError, TokenCaptureRebuild, rebuild_rollout
from nemo_gym.common.errors import ConfigError, DataError
from nemo_gym.common.jsonl import parse_line
from nemo_gym.config import LoadedConfig
from nemo_gym.env.metrics import mask_reason
from nemo_gym.model_servers.model_server import ModelServer
from nemo_gym.orchestration.run import run_options
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app, run_token_headers
from nemo_gym.serving.openai_convert import chat_to_response, responses_to_chat
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.serving.token_capture import (
    TOKEN_ID_CAPTURE_ENV,
    TokenCaptureStore,
    TokenIdCaptureSettings,
    capture_environment,
)
from nemo_gym.serving.token_fingerprints import compute_digest, conversation_digest, prefix_digests, request_items
from nemo_gym.train.batch import model_calls, rollout_to_sequence

REPO = Path(__file__).resolve().parents[1]
ROWS = [json.loads(line) for line in (REPO / "resources_servers/example_single_tool_call/data/example.jsonl").open()]
END_OF_TURN = 256  # a token id no UTF-8 byte is


def encode(text: str) -> list[int]:
    return list(text.encode())


def render(messages: list[dict[str, Any]]) -> str:
    """ByteModel's chat template."""
    return "".join(
        f"<{m['role']}>{m.get('content') or ''}{json.dumps(m.get('tool_calls') or [], sort_keys=True)}"
        for m in messages
    )


class ByteModel(ModelServer):
    """A policy whose tokens are UTF-8 bytes. Its prompt is spliced after the last assistant turn that carries token
    ids (as vllm_model's), else the whole chat re-tokenized; it calls `get_weather` once, then answers "cold"; every
    generation ends with END_OF_TURN. `drop_tokens`: answers without token ids (a server that cannot return them)."""

    drop_tokens = False

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        chat = responses_to_chat(body, keep_token_info=True)  # as vllm_model serves the Responses API
        return chat_to_response(await self.chat_completions(chat), request=body)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        last = max((i for i, m in enumerate(messages) if m.get("generation_token_ids")), default=None)
        if last is None:
            prompt = encode(render(messages))
        else:
            kept = messages[last]
            prompt = kept["prompt_token_ids"] + kept["generation_token_ids"] + encode(render(messages[last + 1 :]))
        called = any(m["role"] == "tool" for m in messages)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if body.get("tools") and not called:
            arguments = json.dumps({"city": "San Francisco"})
            message["tool_calls"] = [
                {
                    "id": f"call_{len(prompt)}",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ]
            generated = encode(arguments) + [END_OF_TURN]
        else:
            message["content"] = "It is cold."
            generated = encode("It is cold.") + [END_OF_TURN]
        if not self.drop_tokens:
            message |= {
                "prompt_token_ids": prompt,
                "generation_token_ids": generated,
                "generation_log_probs": [-0.5] * len(generated),
            }
        return {
            "id": f"chatcmpl-{hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:12]}-{len(prompt)}",
            "object": "chat.completion",
            "created": 0,
            "model": "byte",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if called is False and body.get("tools") else "stop",
                }
            ],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generated), "total_tokens": 0},
        }


def _server(cls: type, config: dict, head_url: str, name: str):
    return cls(config, name=name, client=ServerClient(head_url, timeouts=ClientTimeouts(read_s=30, max_retries=0)))


@pytest.fixture
def gym(tmp_path, monkeypatch):
    """A captured run: head, ByteModel, example_single_tool_call and openai_client_agent (its rollouts captured) and
    simple_agent (not), registered as ng_run registers them; yields (head URL, records' directory, model)."""
    records = tmp_path / "records"
    settings = TokenIdCaptureSettings(enabled=True, dir=records)
    monkeypatch.setenv(TOKEN_ID_CAPTURE_ENV, settings.to_env())
    refs = {
        "resources_server": {"type": "resources_servers", "name": "weather"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    with ExitStack() as stack:
        head = stack.enter_context(serve(build_head_app()))
        model = _server(ByteModel, {}, head, "policy_model")
        servers = {
            "policy_model": ("responses_api_models", model),
            "weather": (
                "resources_servers",
                _server(
                    load_server_class(REPO / "resources_servers/example_single_tool_call/app.py"), {}, head, "weather"
                ),
            ),
            "harness": (
                "responses_api_agents",
                _server(
                    load_server_class(REPO / "responses_api_agents/openai_client_agent/app.py"),
                    {**refs, "token_id_capture": True},
                    head,
                    "harness",
                ),
            ),
            "native": (
                "responses_api_agents",
                _server(load_server_class(REPO / "responses_api_agents/simple_agent/app.py"), refs, head, "native"),
            ),
        }
        for name, (server_type, server) in servers.items():
            url = stack.enter_context(serve(server.build_app()))
            registration = {
                "name": name,
                "server_type": server_type,
                "implementation": "test",
                "url": url,
                "pid": os.getpid(),
                **server.registration_extras(),  # as nemo_gym.serving.entrypoint registers a server
            }
            httpx.post(f"{head}/register", json=registration, trust_env=False).raise_for_status()
        yield head, records, model


def _collect(head: str, agent: str, repeats: int = 2) -> Any:
    """The engine's collection of the first two example rows through `agent`, `repeats` rollouts each."""
    rows = [{**row, "agent_ref": {"name": agent}} for row in ROWS[:2]]

    async def run() -> Any:
        async with ServerClient(head, timeouts=ClientTimeouts(read_s=30, max_retries=0)) as client:
            return await collect(rows, client, num_repeats=repeats)

    return asyncio.run(run())


def test_a_harness_that_drops_token_ids_is_rebuilt_for_training(gym):
    head, records, _ = gym
    result = _collect(head, "harness")
    assert len(result.rollouts) == 4 and not result.failures
    for rollout in result.rollouts:
        assert rollout["reward"] == 1.0 and rollout["stop_reason"] == "completed"  # what the verifier scored, kept
        assert "mask_sample" not in rollout
        counts = rollout["_ng_token_capture"]
        assert counts["terminal_attribution"]["method"] == "response_id" and counts["chains"] == 1
        assert counts["delivered_fraction"] == 1.0
        calls = model_calls(rollout)
        assert len(calls) == 2  # the tool call, then the answer
        # the second prompt extends the first call's prompt and generation, END_OF_TURN included: the model server
        # put back the token ids the harness dropped (re-tokenizing its text would have lost END_OF_TURN)
        first = calls[0].prompt_token_ids + calls[0].generation_token_ids
        assert calls[1].prompt_token_ids[: len(first)] == first and END_OF_TURN in calls[1].prompt_token_ids
        sequence = rollout_to_sequence(rollout)
        assert sequence.input_ids == calls[1].prompt_token_ids + calls[1].generation_token_ids
        assert sequence.num_generated_tokens == len(calls[0].generation_token_ids) + len(calls[1].generation_token_ids)
        # the records are 0.7.0's file layout, one per call, the second resolved to the first by its text
        entries = TokenCaptureStore(records).entries(f"{rollout['_ng_task_index']}-{rollout['_ng_rollout_index']}")
        assert [e["parent_resolution"] for e in entries] == ["root", "resolved"]
        assert (
            entries[1]["parent_call_id"] == entries[0]["model_call_id"]
            and entries[1]["parent_resolution_reason"] == "fingerprint"
        )


def test_an_agent_that_keeps_token_ids_is_left_as_it_is(gym):
    head, records, _ = gym
    result = _collect(head, "native", repeats=1)
    assert len(result.rollouts) == 2
    for rollout in result.rollouts:
        assert "_ng_token_capture" not in rollout and len(model_calls(rollout)) == 2
    assert not list(records.glob("*.tokens.jsonl"))  # simple_agent here is not captured: no records


def test_a_rerun_does_not_merge_an_earlier_attempts_records(gym):
    head, records, _ = gym
    stale = {
        "schema_version": 1,
        "rollout_id": "0-0",
        "model_call_id": "stale",
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-1.0],
        "parent_resolution": "root",
    }
    TokenCaptureStore(records).append(stale)
    result = _collect(head, "harness", repeats=1)
    rollout = next(r for r in result.rollouts if r["_ng_task_index"] == 0)
    assert rollout["_ng_token_capture"]["n_calls"] == 2 and "mask_sample" not in rollout


def test_a_model_server_without_token_ids_masks_and_the_kill_switch_stops(gym, monkeypatch):
    head, records, model = gym
    model.drop_tokens = True
    result = _collect(head, "harness", repeats=1)
    for rollout in result.rollouts:  # kept with its reward, masked: left out of statistics and GRPO groups
        assert rollout["mask_sample"] is True and mask_reason(rollout) == "token_id_capture"
        assert rollout["reward"] == 1.0 and rollout["_ng_token_capture"]["error"] == "nothing recorded"
        assert "return_token_id_information" in rollout["_ng_token_capture"]["incomplete_calls"][0]
    strict = TokenIdCaptureSettings(enabled=True, dir=records, max_mask_fraction=0.5, mask_fraction_min_samples=1)
    registration = httpx.get(f"{head}/servers/harness").json()
    httpx.post(
        f"{head}/register", json={**registration, "token_id_capture": strict.model_dump(mode="json")}
    ).raise_for_status()
    with pytest.raises(
        MaskedCaptureError,
        match=r"1/1 rebuilt rollouts \(100.0%\) are masked, over token_id_capture.max_mask_fraction=0.5",
    ):
        _collect(head, "harness", repeats=1)


def test_a_capture_call_in_a_run_that_does_not_capture_is_refused(monkeypatch):
    monkeypatch.delenv(TOKEN_ID_CAPTURE_ENV, raising=False)
    with serve(ByteModel({}, name="policy_model").build_app()) as url:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{url}/ng-rollout/0-0/training-token-capture/v1/chat/completions", json=body)
        assert answer.status_code == 409 and "+token_id_capture.enabled=true" in answer.text
        assert httpx.post(f"{url}/ng-rollout/0-0/v1/chat/completions", json=body).status_code == 200  # not captured


WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_a_history_rewritten_before_the_turn_is_rendered_as_sent_and_left_unresolved(tmp_path, monkeypatch):
    """A harness that compacts its history (here it rewrites the user's message) but echoes the model's turn verbatim:
    the turn still names the call that answered it, but that call's request is not what comes before the turn now,
    and putting the call's token ids back would splice the original history in (the model would read what the
    harness removed). As 0.7.0's resolver does, the call is left unresolved and its prompt is the conversation as
    sent; the same turn after the unchanged history resolves and extends the first call's tokens."""
    monkeypatch.setenv(TOKEN_ID_CAPTURE_ENV, TokenIdCaptureSettings(enabled=True, dir=tmp_path).to_env())
    asked = [{"role": "user", "content": "How is the weather in San Francisco?"}]
    with serve(ByteModel({}, name="policy_model").build_app()) as url:

        def call(rollout_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
            route = f"{url}/ng-rollout/{rollout_id}/training-token-capture/v1/chat/completions"
            answer = httpx.post(route, json={"messages": messages, "tools": [WEATHER_TOOL]}, trust_env=False)
            answer.raise_for_status()
            return answer.json()

        seconds = {}
        for rollout_id, history in (("0-0", asked), ("1-0", [{"role": "user", "content": "(summary) SF weather"}])):
            first = call(rollout_id, asked)["choices"][0]["message"]
            echoed = {"role": "assistant", "content": None, "tool_calls": first["tool_calls"]}  # token ids dropped
            output = {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "cold"}
            seconds[rollout_id] = (first, call(rollout_id, [*history, echoed, output]), [*history, echoed, output])
    first, answer, _ = seconds["0-0"]
    second = answer["choices"][0]["message"]
    assert second["prompt_token_ids"][: len(first["prompt_token_ids"]) + len(first["generation_token_ids"])] == (
        first["prompt_token_ids"] + first["generation_token_ids"]
    )
    first, answer, sent = seconds["1-0"]
    second = answer["choices"][0]["message"]
    assert second["prompt_token_ids"] == encode(render(sent))  # the rewritten history, as sent; nothing spliced in
    assert encode("How is the weather") != second["prompt_token_ids"][: len(encode("How is the weather"))]
    store = TokenCaptureStore(tmp_path)
    assert [e["parent_resolution"] for e in store.entries("0-0")] == ["root", "resolved"]
    (_, rewritten) = store.entries("1-0")
    assert (
        rewritten["parent_resolution"] == "unresolved"
        and "history before it is not" in rewritten["parent_resolution_reason"]
    )
    # each record carries its own request's context (0.7.0's continuation fields), which the next call must continue
    assert rewritten["continuation_context_len"] == 4  # the tools' envelope and the three messages
    assert rewritten["continuation_context_digest"] == conversation_digest(
        request_items({"messages": sent, "tools": [WEATHER_TOOL]}, chat=True)
    )
    # the collector masks the rollout: its verified answer's call does not continue the first one
    rollout = {
        "_ng_task_index": 1,
        "_ng_rollout_index": 0,
        "reward": 1.0,
        "response": {"id": answer["id"], "output": []},
    }
    rebuild_rollout(rollout, store)
    assert rollout["mask_sample"] is True and rollout["_ng_token_capture"]["unresolved_parent_calls"] == 1


def test_changed_tools_break_the_context_too(tmp_path, monkeypatch):
    """The tools render into the prompt: a later request with other tools does not continue the call (0.7.0's request
    envelope), and gets its own prompt."""
    monkeypatch.setenv(TOKEN_ID_CAPTURE_ENV, TokenIdCaptureSettings(enabled=True, dir=tmp_path).to_env())
    asked = [{"role": "user", "content": "How is the weather?"}]
    other_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    with serve(ByteModel({}, name="policy_model").build_app()) as url:
        route = f"{url}/ng-rollout/2-0/training-token-capture/v1/chat/completions"
        first = httpx.post(route, json={"messages": asked, "tools": [WEATHER_TOOL]}, trust_env=False).json()
        message = first["choices"][0]["message"]
        echoed = {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
        output = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "cold"}
        body = {"messages": [*asked, echoed, output], "tools": [WEATHER_TOOL, other_tool]}
        httpx.post(route, json=body, trust_env=False).raise_for_status()
    assert [e["parent_resolution"] for e in TokenCaptureStore(tmp_path).entries("2-0")] == ["root", "unresolved"]


# -- the rebuild's rules, on records written by hand -------------------------------------------------------------
def _entry(call_id: str, prompt: list[int], generated: list[int], parent: str | None = None, **extra: Any) -> dict:
    sequence = prompt + generated
    return {
        "schema_version": 1,
        "rollout_id": "0-0",
        "model_call_id": call_id,
        "prompt_token_ids": prompt,
        "generation_token_ids": generated,
        "generation_log_probs": [-0.25] * len(generated),
        "output_items": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": call_id}]}
        ],
        "token_item_index": 0,
        "response_id": f"resp-{call_id}",
        "created_at": float(len(prompt)),
        "parent_call_id": parent,
        "parent_resolution": "resolved" if parent else "root",
        "cum_len": len(sequence),
        "digest": compute_digest(sequence),
        **extra,
    }


def _rebuilt(tmp_path: Path, entries: list[dict], response_id: str | None) -> dict:
    store = TokenCaptureStore(tmp_path)
    for entry in entries:
        store.append(entry)
    rollout = {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 1.0,
        "response": {"id": response_id, "output": []},
    }
    rebuild_rollout(rollout, store)
    return rollout


def test_the_terminal_chain_is_delivered_and_a_retry_off_it_is_left_out(tmp_path):
    a = _entry("a", [1, 2], [3])
    retry, b = _entry("retry", [1, 2, 3, 4], [9]), _entry("b", [1, 2, 3, 4], [5, 6], parent="a")
    retry |= {"parent_call_id": "a", "parent_resolution": "resolved"}
    rollout = _rebuilt(tmp_path, [a, retry, b], "resp-b")
    assert "mask_sample" not in rollout
    assert [item["content"][0]["text"] for item in rollout["response"]["output"]] == ["a", "b"]
    assert rollout_to_sequence(rollout).input_ids == [1, 2, 3, 4, 5, 6]
    counts = rollout["_ng_token_capture"]
    # 4 tokens generated, 3 on the chain delivered: 3 / 4
    assert counts["chains"] == 2 and counts["generated_tokens_delivered"] == 3 and counts["delivered_fraction"] == 0.75


def test_two_chains_and_no_terminal_are_masked(tmp_path):
    rollout = _rebuilt(tmp_path, [_entry("a", [1], [2]), _entry("b", [7], [8])], "resp-unknown")
    assert rollout["mask_sample"] is True and rollout["response"]["output"] == []
    assert rollout["_ng_token_capture"]["error"] == "no terminal call named and the calls do not form one chain"


def test_a_link_whose_digest_does_not_match_breaks_the_terminal_chain(tmp_path):
    # b claims a as its parent, but its prompt does not start with a's prompt + generation ([1, 2] vs [1, 9])
    rollout = _rebuilt(tmp_path, [_entry("a", [1], [2]), _entry("b", [1, 9, 4], [5], parent="a")], "resp-b")
    assert rollout["mask_sample"] is True
    assert rollout["_ng_token_capture"]["parent_link_failures"] == {"parent_digest_mismatch": 1}
    assert rollout["_ng_token_capture"]["terminal_attribution"]["chain"] == "broken"


def test_an_unresolved_call_with_no_terminal_named_is_masked(tmp_path):
    unresolved = _entry("b", [1, 2, 3], [4]) | {"parent_resolution": "unresolved"}
    rollout = _rebuilt(tmp_path, [_entry("a", [1], [2]), unresolved], None)
    assert rollout["mask_sample"] is True and rollout["_ng_token_capture"]["unresolved_parent_calls"] == 1


def test_a_bad_record_line_is_named_by_file_and_line(tmp_path):
    store = TokenCaptureStore(tmp_path)
    store.append(_entry("a", [1], [2]))
    with store.path_for("0-0").open("a") as out:
        out.write("{not json\n")
    with pytest.raises(DataError, match=r"0-0\.tokens\.jsonl:2: not valid JSON"):
        store.entries("0-0")
    with pytest.raises(DataError, match="not a rollout id"):
        store.entries("../etc")


def _counting_parses(monkeypatch) -> list[int]:
    """Every line the store parses from here on, by its line number."""
    from nemo_gym.serving import token_capture

    parsed: list[int] = []

    def counting(line: bytes, path: Path, line_no: int) -> dict:
        parsed.append(line_no)
        return parse_line(line, path, line_no)

    monkeypatch.setattr(token_capture, "parse_line", counting)
    return parsed


def test_the_store_parses_only_the_lines_appended_since_its_last_read(tmp_path, monkeypatch):
    """A model server reads a rollout's records at each of its calls: n calls cost n parsed records, not n²."""
    parsed = _counting_parses(monkeypatch)
    reader, writer = TokenCaptureStore(tmp_path), TokenCaptureStore(tmp_path)  # two processes, one directory
    writer.append(_entry("a", [1], [2]))
    assert [e["model_call_id"] for e in reader.entries("0-0")] == ["a"]
    writer.append(_entry("b", [1, 2, 3], [4], parent="a"))
    writer.append(_entry("c", [1, 2, 3, 4, 5], [6], parent="b"))
    assert [e["model_call_id"] for e in reader.entries("0-0")] == ["a", "b", "c"]
    assert reader.entries("0-0") == writer.entries("0-0")
    assert parsed == [1, 2, 3, 1, 2, 3]  # the reader's 3 lines once each, then the writer's own first read
    with writer.path_for("0-0").open("a") as out:
        out.write("{not json\n")
    with pytest.raises(DataError, match=r"0-0\.tokens\.jsonl:4: not valid JSON"):  # numbered as in the file
        reader.entries("0-0")


def test_a_records_file_removed_and_written_again_is_read_anew(tmp_path, monkeypatch):
    """The collector removes a rollout's records before the rollout is sent again; a model server that read the old
    file reads the new one from its start, even when it is as long (and the filesystem gave it the old inode)."""
    model_server, collector = TokenCaptureStore(tmp_path), TokenCaptureStore(tmp_path)
    collector.append(_entry("a", [1], [2]))
    collector.append(_entry("b", [1, 2, 3], [4], parent="a"))
    assert len(model_server.entries("0-0")) == 2
    collector.delete("0-0")
    assert model_server.entries("0-0") == []
    for call_id in ("x", "y", "z"):
        collector.append(_entry(call_id, [7], [8]))
    assert [e["model_call_id"] for e in model_server.entries("0-0")] == ["x", "y", "z"]
    # removed and written again between two reads, as long as before: read anew all the same
    collector.delete("0-0")
    for call_id in ("p", "q", "r"):
        collector.append(_entry(call_id, [7], [8]))
    assert [e["model_call_id"] for e in model_server.entries("0-0")] == ["p", "q", "r"]


def test_the_store_keeps_what_it_read_for_the_rollouts_read_last_only(tmp_path, monkeypatch):
    parsed = _counting_parses(monkeypatch)
    store = TokenCaptureStore(tmp_path, max_cached_rollouts=1, max_cached_tokens=1_000)
    for rollout_id in ("0-0", "1-0"):
        store.append(_entry("a", [1], [2]) | {"rollout_id": rollout_id})
    store.entries("0-0"), store.entries("1-0"), store.entries("1-0")
    assert parsed == [1, 1]  # 1-0 kept
    store.entries("0-0")
    assert parsed == [1, 1, 1]  # 0-0 was left out when 1-0 was read: read whole again
    store.append(_entry("big", [1] * 600, [2] * 600))  # over max_cached_tokens: nothing of 0-0 kept
    store.entries("0-0"), store.entries("0-0")
    assert parsed == [1, 1, 1, 2, 1, 2]


def test_the_digest_is_0_7_0s():
    # sha256 over b"nemo-gym-tokens", then version 1 as one byte, the length 2 and the ids 5 and 300 as big-endian
    # unsigned 64-bit integers; the empty sequence hashes the domain alone
    packed = (
        b"nemo-gym-tokens" + bytes([1]) + (2).to_bytes(8, "big") + (5).to_bytes(8, "big") + (300).to_bytes(8, "big")
    )
    assert compute_digest([5, 300]) == hashlib.sha256(packed).hexdigest()
    assert compute_digest([]) == hashlib.sha256(b"nemo-gym-tokens").hexdigest()


# -- ng_run's block ------------------------------------------------------------------------------------------------
def _options(values: dict) -> Any:
    return run_options(LoadedConfig(values, {}))


def test_ng_run_takes_0_7_0s_block_and_refuses_what_is_not_served(tmp_path):
    options = _options({"token_id_capture": {"enabled": True, "max_mask_fraction": 0.2}})
    env = capture_environment(options.token_id_capture, tmp_path / "run", None)
    assert (
        TokenIdCaptureSettings.model_validate_json(env[TOKEN_ID_CAPTURE_ENV]).dir
        == tmp_path / "run" / "token_id_capture"
    )
    assert capture_environment(_options({}).token_id_capture, tmp_path, None) == {}
    with pytest.raises(ConfigError, match="token_id_capture.sink .NeMo Gym 0.7.0. is not served"):
        _options({"token_id_capture": {"enabled": True, "sink": "pkg.mod:Sink"}})
    with pytest.raises(ConfigError, match=r"\+token_id_capture.dri.*did you mean"):
        _options({"token_id_capture": {"dri": "/tmp/x"}})
    with pytest.raises(ConfigError, match="must be an absolute path"):
        _options({"token_id_capture": {"dir": "records"}})
    with pytest.raises(ConfigError, match="with \\+ray_address is not served"):
        capture_environment(TokenIdCaptureSettings(enabled=True), tmp_path, "auto")


# -- against NeMo Gym 0.7.0's own consumer ---------------------------------------------------------------------------
PEER_REBUILD = """
import json, sys
from pathlib import Path
from nemo_gym.token_id_capture.consumer import trajectories_for_rollout

built = []
for rollout_id, response in json.loads(sys.argv[1]):
    result = trajectories_for_rollout(rollout_id, [Path(sys.argv[2])], verified_response=response)
    metrics = result.get("metrics") or {}
    built.append({
        "mask_sample": result["mask_sample"],
        "output": (result.get("rebuilt_response") or {}).get("output"),
        "terminal": (metrics.get("terminal_attribution") or {}).get("chain"),
    })
print(json.dumps(built))
"""


PEER_DIGEST = """
import json, sys
from nemo_gym.base_responses_api_model import _request_messages
from nemo_gym.token_id_capture.fingerprint import conversation_digest
print(json.dumps([conversation_digest(_request_messages(body)) for body in json.loads(sys.argv[1])]))
"""

# requests of each dialect, with what the digest reads: content as text or parts of several types, an image part,
# tool calls with arguments spaced and ordered otherwise, tool results, reasoning, a namespaced function call and
# the envelope (instructions, tools)
DIGESTED_BODIES = [
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather?"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"b": 1,  "a": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "cold"},
            {"role": "assistant", "content": [{"type": "text", "text": "It is cold."}], "generation_token_ids": [1]},
        ],
        "tools": [WEATHER_TOOL],
    },
    {
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "look it up"}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "namespace": "wx",
                "arguments": "not json ",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "cold"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
    },
    {"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
    {"messages": []},
]


def test_the_prefix_digests_are_the_digests_of_the_prefixes():
    """The model server hashes a request once (`prefix_digests`) and compares each candidate parent's context with the
    digest of the prefix as long as that parent's request."""
    for body in DIGESTED_BODIES:
        items = request_items(body, chat="messages" in body)
        assert prefix_digests(items) == [conversation_digest(items[:k]) for k in range(len(items) + 1)]


@pytest.mark.peer
def test_the_context_digest_is_0_7_0s(tmp_path):
    """Our records' `continuation_context_digest` is 0.7.0's for the same request (its `_request_messages`, then its
    `conversation_digest`), so a record either writes is continued by the same requests."""
    from nemo_gym_peer07 import peer07_json

    theirs = peer07_json(PEER_DIGEST, json.dumps(DIGESTED_BODIES), cwd=tmp_path)
    ours = [conversation_digest(request_items(body, chat="messages" in body)) for body in DIGESTED_BODIES]
    assert ours == theirs and len(set(ours)) == len(ours)


@pytest.mark.peer
def test_0_7_0s_consumer_rebuilds_our_records_into_the_same_rollouts(gym, tmp_path):
    from nemo_gym_peer07 import peer07_json

    head, records, _ = gym
    result = _collect(head, "harness")
    copied = tmp_path / "copied"  # 0.7.0's store writes its freeze state beside the records
    shutil.copytree(records, copied)
    jobs = [[f"{r['_ng_task_index']}-{r['_ng_rollout_index']}", r["response"]] for r in result.rollouts]
    built = peer07_json(PEER_REBUILD, json.dumps(jobs), str(copied), cwd=tmp_path)
    assert len(built) == 4
    for rollout, theirs in zip(result.rollouts, built):
        assert theirs == {"mask_sample": False, "output": rollout["response"]["output"], "terminal": "delivered"}


def test_a_record_that_cannot_be_read_masks_its_rollout_and_the_collection_goes_on(tmp_path):
    settings = TokenIdCaptureSettings(enabled=True, dir=tmp_path)
    (tmp_path / "0-0.tokens.jsonl").write_text("{not json\n")
    rebuild = TokenCaptureRebuild({"harness": settings})
    rollout = {"_ng_task_index": 0, "_ng_rollout_index": 0, "agent_ref": {"name": "harness"}, "reward": 1.0}
    asyncio.run(rebuild.after(rollout))
    assert (
        rollout["mask_sample"] is True and "0-0.tokens.jsonl:1: not valid JSON" in rollout["_ng_token_capture"]["error"]
    )
    other = {"_ng_task_index": 0, "_ng_rollout_index": 0, "agent_ref": {"name": "other"}, "reward": 1.0}
    asyncio.run(rebuild.after(other))
    assert "mask_sample" not in other  # an agent that is not captured is not rebuilt


def test_all_agents_captures_an_agent_whose_config_does_not_ask(monkeypatch, tmp_path):
    simple_agent = load_server_class(REPO / "responses_api_agents/simple_agent/app.py")
    refs = {
        "resources_server": {"type": "resources_servers", "name": "weather"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    row = {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 2}
    monkeypatch.setenv(TOKEN_ID_CAPTURE_ENV, TokenIdCaptureSettings(enabled=True, dir=tmp_path).to_env())
    assert simple_agent(refs, name="a").model_path(row) == "/v1/responses"
    monkeypatch.setenv(
        TOKEN_ID_CAPTURE_ENV, TokenIdCaptureSettings(enabled=True, all_agents=True, dir=tmp_path).to_env()
    )
    agent = simple_agent(refs, name="a")
    assert agent.model_path(row) == "/ng-rollout/3-1-a2/training-token-capture/v1/responses"
    assert agent.registration_extras()["token_id_capture"]["dir"] == str(tmp_path)


def test_a_responses_harness_that_drops_token_ids_gets_them_put_back(gym):
    """A harness on the Responses API (`client.responses.create`, items without token ids): the second call's parent
    is found by the turn's text and tool calls, and its prompt is spliced after the first call's sampled ids."""
    import openai

    head, records, _ = gym
    model_url = httpx.get(f"{head}/servers/policy_model").json()["url"]
    base = f"{model_url}/ng-rollout/7-0/training-token-capture/v1"
    params = ROWS[0]["responses_create_params"]
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        first = client.responses.create(model="byte", input=params["input"], tools=params["tools"])
        call = first.output[-1]
        kept = {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "cold"}
        client.responses.create(model="byte", input=[*params["input"], kept, result], tools=params["tools"])
    first_call, second_call = TokenCaptureStore(records).entries("7-0")
    assert (
        second_call["parent_resolution"] == "resolved" and second_call["parent_call_id"] == first_call["model_call_id"]
    )
    sampled = first_call["prompt_token_ids"] + first_call["generation_token_ids"]
    assert second_call["prompt_token_ids"][: len(sampled)] == sampled and sampled[-1] == END_OF_TURN


@pytest.mark.integration
@pytest.mark.long
def test_ng_run_and_ng_collect_rollouts_capture_as_a_user_runs_them(tmp_path):
    """Real processes: `ng_run +token_id_capture.enabled=true` gives its servers the settings (openai_client_agent
    registers them, the model server records), `ng_collect_rollouts` rebuilds. scripted_model returns no token ids,
    so every rollout is kept, masked, with the reason; none is scored silently or lost."""
    from nemo_gym.env.testing import NgRun

    records, out = tmp_path / "records", tmp_path / "rollouts.jsonl"
    agent_yaml = "responses_api_agents/openai_client_agent/configs/openai_client_agent.yaml"
    with NgRun(
        f"+config_paths=[tests/configs/weather_scripted.yaml,{agent_yaml}]",
        "+skip_venv=true",
        "+openai_client_agent.responses_api_agents.openai_client_agent.resources_server.name=weather",
        "+token_id_capture.enabled=true",
        f"+token_id_capture.dir={records}",
    ) as run:
        head = run.wait_ready()
        assert f"Training token capture: the model calls' records go to {records}" in run.output()
        registered = httpx.get(f"{head}/servers/openai_client_agent", headers=run_token_headers(head)).json()
        assert registered["token_id_capture"]["dir"] == str(records)
        command = [
            str(Path(sys.executable).parent / "ng_collect_rollouts"),
            f"+head_server_url={head}",
            "+agent_name=openai_client_agent",
            f"+input_jsonl_fpath={REPO / 'resources_servers/example_single_tool_call/data/example.jsonl'}",
            f"+output_jsonl_fpath={out}",
            "+progress=false",
        ]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rollouts = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rollouts) == 5 and all(r["reward"] == 1.0 and r["mask_sample"] is True for r in rollouts)
    assert all("return_token_id_information" in r["_ng_token_capture"]["incomplete_calls"][0] for r in rollouts)
    assert sorted(p.name for p in records.glob("*.tokens.incomplete")) == [f"{i}-0.tokens.incomplete" for i in range(5)]
