"""Rollouts → training sequences (nemo_gym.train.batch): masks, alignment, drift, padding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nemo_gym.common.errors import DataError  # noqa: E402
from nemo_gym.train.batch import collate, model_calls, rollout_to_sequence  # noqa: E402


def two_turn_rollout() -> dict:
    """Turn 1: prompt [1 2 3], generates [10 11] (a tool call); the tool output becomes [20 21] plus the
    template's [4]; turn 2: prompt [1 2 3 10 11 20 21 4], generates [12 13 14]."""
    return {
        "_ng_task_index": 0,
        "_ng_rollout_index": 1,
        "response": {
            "output": [
                {
                    "type": "function_call",
                    "name": "f",
                    "arguments": "{}",
                    "call_id": "c1",
                    "prompt_token_ids": [1, 2, 3],
                    "generation_token_ids": [10, 11],
                    "generation_log_probs": [-0.1, -0.2],
                },
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done"}],
                    "prompt_token_ids": [1, 2, 3, 10, 11, 20, 21, 4],
                    "generation_token_ids": [12, 13, 14],
                    "generation_log_probs": [-0.3, -0.4, -0.5],
                },
            ]
        },
        "reward": 1.0,
    }


def test_two_turn_mask_covers_exactly_the_generated_tokens():
    sequence = rollout_to_sequence(two_turn_rollout())
    assert sequence.input_ids == [1, 2, 3, 10, 11, 20, 21, 4, 12, 13, 14]
    assert sequence.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert sequence.rollout_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3, -0.4, -0.5]
    assert sequence.num_generated_tokens == 5


def test_drift_between_turns_is_an_error_naming_the_position():
    rollout = two_turn_rollout()
    rollout["response"]["output"][2]["prompt_token_ids"] = [1, 2, 3, 10, 99, 20, 21, 4]  # re-tokenized
    with pytest.raises(DataError, match=r"drift between model calls 0 and 1.*first difference at token 4"):
        rollout_to_sequence(rollout)


def test_rollout_without_token_information_says_how_to_fix():
    rollout = {"response": {"output": [{"type": "message", "role": "assistant", "content": []}]}}
    with pytest.raises(DataError, match="return_token_id_information"):
        model_calls(rollout)


def test_logprob_length_mismatch_is_an_error():
    rollout = two_turn_rollout()
    rollout["response"]["output"][0]["generation_log_probs"] = [-0.1]
    with pytest.raises(DataError, match="2 generation ids but 1 generation_log_probs"):
        model_calls(rollout)


def test_collate_pads_and_shifts_to_targets():
    long = rollout_to_sequence(two_turn_rollout())
    short = rollout_to_sequence(
        {
            "response": {
                "output": [
                    {
                        "type": "message",
                        "prompt_token_ids": [1, 2],
                        "generation_token_ids": [7],
                        "generation_log_probs": [-0.7],
                    }
                ]
            }
        }
    )
    batch = collate([long, short], [0.5, -0.5], pad_token_id=0)
    assert batch.input_ids.shape == (2, 11)
    assert batch.loss_mask.shape == batch.rollout_logprobs.shape == (2, 10)
    # entry t is about token t + 1: the short rollout generated token index 2 → target entry 1
    assert batch.input_ids[1].tolist() == [1, 2, 7] + [0] * 8
    assert batch.attention_mask[1].tolist() == [1, 1, 1] + [0] * 8
    assert batch.loss_mask[1].tolist() == [0, 1] + [0] * 8
    assert batch.rollout_logprobs[1, 1].item() == pytest.approx(-0.7)
    assert batch.loss_mask[0].tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert batch.num_generated_tokens == 6
    micro = batch.select(slice(1, 2))
    assert micro.input_ids.shape == (1, 3) and micro.loss_mask.shape == (1, 2)
