"""The ART-style Python API (nemo_gym.art): trajectories, gather, iterate_dataset, retry, groups → batch, train.

Choices are made by the real `openai.AsyncOpenAI` client from answers shaped exactly like vllm_model's
(`chat_completion` in responses_api_models/vllm_model/completions.py), served through httpx's MockTransport (the
transport seam; vLLM itself runs in the e2e test). Training runs the real DeepSpeed engine on a tiny random
Llama built from a config (no downloads), without an inference server.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import ValidationError

import nemo_gym.art as art
from nemo_gym.art.ruler import RulerError, judge_messages
from nemo_gym.art.tokens import groups_to_batch, trajectory_sequences
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import read_jsonl

torch = pytest.importorskip("torch")


# -- vllm_model-shaped choices ------------------------------------------------------------------------------
def vllm_answer(
    prompt_ids: list[int], generation_ids: list[int], log_probs: list[float], content: str
) -> dict[str, Any]:
    """A chat completion as vllm_model returns it: token information on the assistant message."""
    message = {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt_ids,
        "generation_token_ids": generation_ids,
        "generation_log_probs": log_probs,
    }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "usage": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
    }


def choice_of(
    answer: dict[str, Any], sent: list[dict[str, Any]] | None = None, messages: list[dict[str, Any]] | None = None
) -> Any:
    """The `Choice` the real openai client makes of `answer` when it sends `messages` (its request body goes to
    `sent`)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append(json.loads(request.content))
        return httpx.Response(200, json=answer)

    async def call() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            client = AsyncOpenAI(base_url="http://policy.test/v1", api_key="token", http_client=http)
            completion = await client.chat.completions.create(
                model="policy", messages=messages or [{"role": "user", "content": "hi"}]
            )
        return completion.choices[0]

    return asyncio.run(call())


PROMPT = [1, 2, 3]


def single_turn(generation: list[int], reward: float, **fields: Any) -> art.Trajectory:
    choice = choice_of(vllm_answer(PROMPT, generation, [-0.5] * len(generation), "x"))
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, choice], reward=reward, **fields)


def two_turn(reward: float, *, chained: bool = True) -> art.Trajectory:
    """Turn 1: prompt [1 2 3] → [10 11]; turn 2 prompt [1 2 3 10 11 20 21 4] → [12 13 14] (chained), or a
    re-tokenized turn 2 prompt [1 2 3 99 20 21 4] (not chained)."""
    first = choice_of(vllm_answer([1, 2, 3], [10, 11], [-0.1, -0.2], "a"))
    second_prompt = [1, 2, 3, 10, 11, 20, 21, 4] if chained else [1, 2, 3, 99, 20, 21, 4]
    second = choice_of(vllm_answer(second_prompt, [12, 13, 14], [-0.3, -0.4, -0.5], "b"))
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "q"}, first, {"role": "user", "content": "more"}, second],
        reward=reward,
    )


# -- Trajectory ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["0.5", None, [1], {"a": 1}])
def test_trajectory_rejects_non_numeric_metrics(bad):
    with pytest.raises(ValidationError, match="metrics"):
        art.Trajectory(reward=0.0, metrics={"m": bad})


def test_trajectory_accepts_numbers_and_bools_and_checks_later_changes():
    trajectory = art.Trajectory(reward=1, metrics={"a": 1, "b": 0.5, "c": True})
    assert trajectory.metrics == {"a": 1, "b": 0.5, "c": True} and trajectory.reward == 1.0
    with pytest.raises(ValidationError):
        trajectory.reward = "high"  # assignments are validated
    trajectory.metrics["late"] = "text"  # an in-place change is caught when the trajectory is used
    with pytest.raises(ValueError, match="'late'"):
        trajectory.check_metrics()


@pytest.mark.parametrize("reward", [math.nan, math.inf])
def test_trajectory_rejects_non_finite_rewards(reward):
    with pytest.raises(ValidationError, match="reward"):
        art.Trajectory(reward=reward)


def test_trajectory_rejects_a_message_without_a_role():
    with pytest.raises(ValidationError, match=r"messages_and_choices\[1\]"):
        art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, {"content": "no role"}], reward=0)


def test_choices_keep_token_ids_through_json_and_into_the_next_request():
    trajectory = single_turn([10, 11], 1.0, metadata={"task": "t1"})
    restored = art.Trajectory.model_validate_json(trajectory.model_dump_json())
    assert [type(item).__name__ for item in restored.messages_and_choices] == ["dict", "Choice"]
    assert trajectory_sequences(restored) == trajectory_sequences(trajectory)
    # messages() passes the assistant turn back with its token ids, so vllm_model splices instead of re-tokenizing
    sent: list[dict[str, Any]] = []
    follow_up = trajectory.messages() + [{"role": "user", "content": "and then?"}]
    choice_of(vllm_answer([1], [2], [-1.0], "y"), sent, messages=follow_up)
    assistant = sent[0]["messages"][1]  # what the policy server receives
    assert assistant["role"] == "assistant" and assistant["content"] == "x"
    assert (assistant["prompt_token_ids"], assistant["generation_token_ids"], assistant["generation_log_probs"]) == (
        PROMPT,
        [10, 11],
        [-0.5, -0.5],
    )


def test_group_from_a_generator_of_trajectories_and_exceptions():
    group = art.TrajectoryGroup(t for t in [art.Trajectory(reward=1), ValueError("bad"), art.Trajectory(reward=0)])
    assert group.rewards == [1.0, 0.0]
    assert [(e.type, e.message) for e in group.exceptions] == [("ValueError", "bad")]
    assert art.TrajectoryGroup.model_validate_json(group.model_dump_json()).rewards == [1.0, 0.0]


# -- gather -------------------------------------------------------------------------------------------------
async def rollout(reward: float, fail: bool = False) -> art.Trajectory:
    await asyncio.sleep(0)
    if fail:
        raise RuntimeError(f"rollout {reward} failed")
    return art.Trajectory(reward=reward, metrics={"correct": reward > 0.5})


def test_gather_keeps_failed_rollouts_as_exceptions_within_the_limit():
    async def main() -> list[art.TrajectoryGroup]:
        pending = [
            art.TrajectoryGroup(rollout(r, fail=(task == 1 and r == 0.0)) for r in (0.0, 1.0)) for task in range(3)
        ]
        return await art.gather_trajectory_groups(pending, pbar_desc=None, max_exceptions=1)

    groups = asyncio.run(main())
    assert [sorted(g.rewards) for g in groups] == [[0.0, 1.0], [1.0], [0.0, 1.0]]
    assert [len(g.exceptions) for g in groups] == [0, 1, 0] and groups[1].exceptions[0].message == "rollout 0.0 failed"


def test_gather_raises_past_max_exceptions_count_or_share():
    def pending() -> list[Any]:
        return [art.TrajectoryGroup(rollout(1.0, fail=(i < 2)) for i in range(4))]

    with pytest.raises(RuntimeError, match="failed"):
        asyncio.run(art.gather_trajectory_groups(pending(), pbar_desc=None, max_exceptions=1))
    with pytest.raises(RuntimeError, match="failed"):
        asyncio.run(art.gather_trajectory_groups(pending(), pbar_desc=None, max_exceptions=0.25))  # 2 of 4 > 25 %
    groups = asyncio.run(art.gather_trajectory_groups(pending(), pbar_desc=None, max_exceptions=0.5))
    assert len(groups[0]) == 2 and len(groups[0].exceptions) == 2


def test_gather_drops_a_failed_plain_group_and_applies_after_each():
    async def whole_group(fail: bool) -> art.TrajectoryGroup:
        if fail:
            raise ConnectionError("environment down")
        return art.TrajectoryGroup([await rollout(0.0), await rollout(1.0)])

    async def rescore(group: art.TrajectoryGroup) -> art.TrajectoryGroup:
        return art.TrajectoryGroup([t.model_copy(update={"reward": t.reward + 10}) for t in group])

    groups = asyncio.run(
        art.gather_trajectory_groups(
            [whole_group(False), whole_group(True)], pbar_desc="test", max_exceptions=1, after_each=rescore
        )
    )
    assert [g.rewards for g in groups] == [[10.0, 11.0]]


def test_gather_rejects_a_metric_mutated_into_text():
    async def sneaky() -> art.Trajectory:
        trajectory = art.Trajectory(reward=1.0)
        trajectory.metrics["note"] = "not a number"
        return trajectory

    with pytest.raises(ValueError, match="'note'"):
        asyncio.run(art.gather_trajectory_groups([art.TrajectoryGroup([sneaky(), sneaky()])], pbar_desc=None))


# -- the judge's view of a trajectory (ruler_score_group; the judge itself: tests/test_art_integration.py) --
def test_judge_messages_reduce_tool_calls_like_the_group_judge():
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ],
        reward=1.0,
    )
    assert judge_messages(trajectory) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_call": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]


# -- iterate_dataset ----------------------------------------------------------------------------------------
def test_iterate_dataset_covers_each_epoch_once_in_a_fixed_order():
    items = list(range(10))
    batches = list(art.iterate_dataset(items, groups_per_step=4, num_epochs=2, use_tqdm=False))
    assert [(b.step, b.epoch, b.epoch_step, len(b.items)) for b in batches] == [
        (0, 0, 0, 4),
        (1, 0, 1, 4),
        (2, 0, 2, 2),
        (3, 1, 0, 4),
        (4, 1, 1, 4),
        (5, 1, 2, 2),
    ]  # fmt: skip  (ceil(10 / 4) = 3 steps per epoch, the last one shorter)
    for epoch in (0, 1):
        assert sorted(i for b in batches if b.epoch == epoch for i in b.items) == items
    epoch_orders = [[i for b in batches if b.epoch == e for i in b.items] for e in (0, 1)]
    assert epoch_orders[0] != epoch_orders[1] != items  # shuffled, differently per epoch
    again = list(art.iterate_dataset(items, groups_per_step=4, num_epochs=2, use_tqdm=False))
    assert [b.items for b in again] == [b.items for b in batches]
    other_seed = list(art.iterate_dataset(items, groups_per_step=4, num_epochs=2, seed=1, use_tqdm=False))
    assert [b.items for b in other_seed] != [b.items for b in batches]


def test_iterate_dataset_resumes_at_initial_step():
    items = [f"task{i}" for i in range(7)]
    full = list(art.iterate_dataset(items, groups_per_step=3, num_epochs=3, use_tqdm=False))
    resumed = list(art.iterate_dataset(items, groups_per_step=3, num_epochs=3, initial_step=4))
    assert resumed == full[4:] and resumed[0].epoch == 1 and resumed[0].epoch_step == 1
    assert list(art.iterate_dataset(items, groups_per_step=3, num_epochs=3, initial_step=99, use_tqdm=False)) == []
    with pytest.raises(ValueError):
        list(art.iterate_dataset(items, groups_per_step=0))


# -- retry --------------------------------------------------------------------------------------------------
def test_retry_sync_retries_listed_exceptions_then_succeeds():
    calls, retries = [], []

    @art.retry(
        max_attempts=3,
        delay_s=0,
        exceptions=(ConnectionError,),
        on_retry=lambda exc, attempt: retries.append((str(exc), attempt)),
    )
    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError(f"try {len(calls)}")
        return x * 2

    assert flaky(21) == 42 and len(calls) == 3
    assert retries == [("try 1", 1), ("try 2", 2)]
    assert flaky.__name__ == "flaky"


def test_retry_gives_up_after_max_attempts_and_ignores_other_exceptions():
    attempts = []

    @art.retry(max_attempts=2, delay_s=0, exceptions=(TimeoutError,))
    async def always(kind: type[Exception]) -> None:
        attempts.append(kind)
        raise kind("no")

    with pytest.raises(TimeoutError):
        asyncio.run(always(TimeoutError))
    assert len(attempts) == 2
    with pytest.raises(KeyError):
        asyncio.run(always(KeyError))
    assert len(attempts) == 3  # not retried


def test_retry_async_waits_with_exponential_backoff(monkeypatch):
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:  # the clock is the seam: record instead of waiting
        waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)

    @art.retry(max_attempts=4, delay_s=0.5, backoff=3.0, max_delay_s=2.0)
    async def broken() -> None:
        raise RuntimeError

    with pytest.raises(RuntimeError):
        asyncio.run(broken())
    assert waits == [0.5, 1.5, 2.0]  # 0.5, 0.5 * 3, min(0.5 * 9, 2.0)


# -- groups → training batch --------------------------------------------------------------------------------
def test_chained_two_turn_trajectory_is_one_sequence_with_both_generations_masked_in():
    (sequence,) = trajectory_sequences(two_turn(1.0))
    assert sequence.input_ids == [1, 2, 3, 10, 11, 20, 21, 4, 12, 13, 14]
    assert sequence.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert sequence.rollout_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3, -0.4, -0.5]


def test_retokenized_turns_become_one_sequence_per_call():
    first, second = trajectory_sequences(two_turn(1.0, chained=False))
    assert (first.input_ids, first.loss_mask) == ([1, 2, 3, 10, 11], [0, 0, 0, 1, 1])
    assert (second.input_ids, second.loss_mask) == ([1, 2, 3, 99, 20, 21, 4, 12, 13, 14], [0] * 7 + [1, 1, 1])


def test_a_choice_without_token_ids_is_an_error_that_says_how_to_sample():
    plain = choice_of(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
        }
    )
    with pytest.raises(DataError, match="openai_client"):
        trajectory_sequences(art.Trajectory(messages_and_choices=[plain], reward=1))


def test_groups_to_batch_advantages_and_dropped_groups():
    learn = art.TrajectoryGroup([single_turn([10, 11, 12], 1.0), single_turn([20, 21], 0.0), two_turn(0.0)])
    flat = art.TrajectoryGroup([single_turn([30], 1.0), single_turn([31], 1.0)])
    alone = art.TrajectoryGroup([single_turn([40], 0.0)])
    grouped = groups_to_batch([learn, flat, alone])
    # rewards [1, 0, 0]: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    # → (1 - 1/3) / 0.57735 = 1.1547 and (0 - 1/3) / 0.57735 = -0.57735 (eps 1e-6 aside)
    assert grouped.batch is not None
    assert grouped.advantages.tolist() == pytest.approx([1.1547, -0.57735, -0.57735], abs=1e-4)
    assert (grouped.num_groups, grouped.groups_zero_variance, grouped.groups_too_small) == (3, 1, 1)
    assert grouped.rewards == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    batch = grouped.batch
    assert batch.input_ids.shape == (3, 11)  # the two-turn trajectory is the longest
    assert batch.input_ids[0].tolist()[:6] == [1, 2, 3, 10, 11, 12]
    # targets-aligned: entry t is about token t + 1
    assert batch.loss_mask[0].tolist()[:5] == [0, 0, 1, 1, 1] and batch.num_generated_tokens == 3 + 2 + 5
    assert batch.rollout_logprobs[1].tolist()[:4] == [0, 0, -0.5, -0.5]


def test_groups_to_batch_with_nothing_to_learn():
    grouped = groups_to_batch([art.TrajectoryGroup([single_turn([5], 1.0), single_turn([6], 1.0)])])
    assert grouped.batch is None and grouped.groups_zero_variance == 1


# -- TrainableModel.train on a tiny model, no inference server ----------------------------------------------
def make_tiny_model(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def mean_logprob(model_dir: Path, ids: list[int], generated_from: int) -> float:
    """Mean log-prob of ids[generated_from:] under the model in `model_dir`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return float(logprobs[generated_from - 1 :].mean())


def training_groups() -> list[art.TrajectoryGroup]:
    return [
        art.TrajectoryGroup(
            [
                single_turn([10, 11, 12], 1.0, metrics={"correct": True}),
                single_turn([20, 21], 0.0, metrics={"correct": False}),
            ]
        )
    ]


@pytest.mark.long
@pytest.mark.slow
def test_trainable_model_trains_saves_and_resumes(tmp_path):
    pytest.importorskip("deepspeed")
    base = make_tiny_model(tmp_path / "tiny")
    project_dir = tmp_path / "art"

    def new_model() -> art.TrainableModel:
        return art.TrainableModel(
            name="tiny-policy",
            project="unit",
            base_model=str(base),
            engine={"micro_batch_size": 2},
            loss={"tis_cap": None},
        )

    groups = training_groups()  # (choice_of runs its own event loop: build them outside)

    async def first_process() -> tuple[int, dict[str, Any], int]:
        backend = art.LocalBackend(project_dir, start_server=False)
        model = new_model()
        await model.register(backend)
        before = await model.get_step()
        with pytest.raises(RuntimeError, match="no inference server"):
            model.openai_client()
        metrics = await model.train(groups, config=art.TrainConfig(learning_rate=1e-2))
        await backend.close()
        return before, metrics, await model.get_step()

    before, metrics, after = asyncio.run(first_process())
    assert (before, after) == (0, 1)
    assert metrics["trained"] is True and metrics["learning_rate"] == 1e-2 and metrics["num_sequences"] == 2
    assert metrics["reward_mean"] == 0.5 and metrics["metric_correct"] == 0.5 and metrics["num_tokens"] == 5
    folder = project_dir / "unit" / "models" / "tiny-policy"
    state = json.loads((folder / "state.json").read_text())
    assert state == {"step": 1, "checkpoint": "step_000001", "weights": "step_000001"}
    weights = folder / "weights" / "step_000001"
    # the rewarded generation got likelier, the other one less likely
    assert mean_logprob(weights, PROMPT + [10, 11, 12], 3) > mean_logprob(base, PROMPT + [10, 11, 12], 3)
    assert mean_logprob(weights, PROMPT + [20, 21], 3) < mean_logprob(base, PROMPT + [20, 21], 3)
    logged = read_jsonl(folder / "trajectories" / "train" / "000001.jsonl")
    assert [row["reward"] for row in logged] == [1.0, 0.0]

    async def second_process() -> tuple[int, int]:
        async with art.LocalBackend(project_dir, start_server=False) as backend:
            model = new_model()
            await model.register(backend)
            resumed = await model.get_step()
            await model.train(groups, learning_rate=1e-2)
            return resumed, await model.get_step()

    assert asyncio.run(second_process()) == (1, 2)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir() if p.is_dir()) == [
        "step_000002"
    ]  # keep_checkpoints=1
    history = read_jsonl(folder / "history.jsonl")
    assert [row["step"] for row in history] == [1, 2] and all(row["trained"] for row in history)


@pytest.mark.slow
@pytest.mark.long
def test_a_step_with_nothing_to_learn_still_counts(tmp_path):
    pytest.importorskip("deepspeed")
    base = make_tiny_model(tmp_path / "tiny")

    flat = [art.TrajectoryGroup([single_turn([5], 1.0), single_turn([6], 1.0)])]

    async def main() -> tuple[dict[str, Any], int]:
        async with art.LocalBackend(tmp_path / "art", start_server=False) as backend:
            model = art.TrainableModel(name="m", project="p", base_model=str(base))
            await model.register(backend)
            return await model.train(flat), await model.get_step()

    metrics, step = asyncio.run(main())
    assert step == 1 and metrics["trained"] is False and metrics["groups_zero_variance"] == 1
    state = json.loads((tmp_path / "art" / "p" / "models" / "m" / "state.json").read_text())
    assert state == {"step": 1, "checkpoint": None, "weights": None}


@pytest.mark.parametrize(
    ("text", "reward", "correct"),
    [
        ("so \\boxed{3}", 1.0, True),
        ("\\boxed{2} no, \\boxed{-4.0}", 1.0, True),
        ("\\boxed{5}", 0.1, False),
        ("\\boxed{x}", 0.1, False),
        ("5 - 2 = 3", 0.5, True),
        ("1 + 2 = 3, so -4", 0.5, True),
        ("3 or 7", 0.0, False),
        ("no number", 0.0, False),
    ],
)
def test_example_reward(text, reward, correct):
    from nemo_gym.serving.module_loading import import_file

    example = import_file(Path(__file__).resolve().parents[1] / "examples" / "art_style_train.py")
    answer = "-4" if "-4" in text else "3"
    assert example.score(text, answer) == (reward, {"boxed": "boxed" in text, "correct": correct})


def test_model_names_and_engine_fields_are_validated():
    with pytest.raises(ValueError, match="folder"):
        art.TrainableModel(name="../escape", project="p")
    with pytest.raises(ValidationError, match="micro_batch"):
        art.TrainableModel(name="m", project="p", engine={"micro_batch": 2})
    with pytest.raises(RuntimeError, match="register"):
        asyncio.run(art.TrainableModel(name="m", project="p").get_step())


def test_ruler_says_when_the_judge_reply_was_cut_at_max_tokens():
    """A reply cut by max_tokens is invalid JSON; the error names the cause and the setting to raise."""
    cut = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "judge",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": '{"scores": [{"id": "1", "score": 0.5, "expl'},
                "finish_reason": "length",
            }
        ],
    }
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=cut)

    async def judge() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            client = AsyncOpenAI(base_url="http://judge.test/v1", api_key="token", http_client=http)
            group = art.TrajectoryGroup(
                [
                    art.Trajectory(
                        messages_and_choices=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": t}],
                        reward=0,
                    )
                    for t in "ab"
                ]
            )
            await art.ruler_score_group(group, "judge", judge_client=client, create_params={"max_tokens": 16})

    with pytest.raises(RulerError, match=r"cut at max_tokens=16: raise it"):
        asyncio.run(judge())
    assert len(sent) == 2 and sent[0]["max_tokens"] == 16 and sent[0]["response_format"]["type"] == "json_schema"
