"""GRPO's dynamic sampling (`trainer.dynamic_sampling`, DAPO §3.2; `nemo_gym.train.grpo.fill_step`): a step whose groups
have equal rewards is refilled from further tasks of the task order, none twice in a step, within `max_sampling_rounds`.

Fast: the task order's draws (`TaskSampler.draw`), the refill loop on a fake collection, and the GRPO recipe's
`prepare_step` with a fake gym at the collection seam (metrics, collection names, data position, resume, a stop
during a refill, the option off). Integration (`long`): the real `ng_train` attached to a real `ng_run` of the weather
environment, whose policy scores three of the five tasks 0 in every rollout, the first two of the order among them:
the step that would have had no group left trains, and a resumed run reads on from the checkpoint's data position.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ng_process import weather_config  # noqa: E402
from test_train_loop import rollout_row  # noqa: E402

from nemo_gym.train.config import EngineConfig, TrainerConfig, check_algorithm  # noqa: E402
from nemo_gym.train.grpo import GRPORecipe, fill_step  # noqa: E402
from nemo_gym.train.loop import TaskSampler  # noqa: E402
from nemo_gym.train.stopping import StopRequested, StopSignal  # noqa: E402

# -- the task order: distinct draws ----------------------------------------------------------------------------------
# TaskSampler(5 tasks, seed 7) orders epoch 0 as [4, 2, 1, 3, 0] and epoch 1 as [2, 1, 3, 4, 0] (data positions 0-4,
# 5-9)


def test_task_order_of_seed_7_is_the_one_the_examples_use():
    sampler = TaskSampler(num_tasks=5, batch_size=2, seed=7)
    assert [sampler.index(p) for p in range(10)] == [4, 2, 1, 3, 0, 2, 1, 3, 4, 0]
    assert sampler.batch(1) == [1, 3] and sampler.batch(2) == [0, 2]  # positions 2-3; 4-5 across the epoch boundary


def test_draw_reads_on_and_never_takes_a_task_twice():
    sampler = TaskSampler(num_tasks=5, batch_size=2, seed=7)
    assert sampler.draw(0, 2, exclude=set()) == ([4, 2], 2)
    assert sampler.draw(5, 3, exclude={0}) == ([2, 1, 3], 8)
    # positions 5 (task 2, excluded) and 6, 7 (tasks 1, 3): the excluded one is read and passed over
    assert sampler.draw(5, 2, exclude={0, 2}) == ([1, 3], 8)
    # a step holding 4, 2, 1, 3 (positions 0-3) wants 2 more: only task 0 is left, at position 4
    assert sampler.draw(4, 2, exclude={4, 2, 1, 3}) == ([0], 5)
    # across the epoch boundary: position 4 holds task 0, then 2 (excluded), 1 (excluded), 3: 0 and 3 are drawn
    assert sampler.draw(4, 2, exclude={2, 1}) == ([0, 3], 8)
    assert sampler.draw(3, 2, exclude={0, 1, 2, 3, 4}) == ([], 3)  # every task in the step: nothing read


# -- the refill loop -------------------------------------------------------------------------------------------------
def fake_collect(rewards_by_task: dict[str, list[float]], calls: list[tuple[list[str], int]]):
    """`fill_step`'s collect over tasks named by strings: each task's group gets its rewards (a shorter list: a group
    with failed rollouts); rows carry token information so the groups collate. Records (task names, round) per call."""

    def collect(tasks: list[str], sampling_round: int) -> list[dict[str, Any]]:
        calls.append((list(tasks), sampling_round))
        rows = []
        for index, task in enumerate(tasks):
            rows += [
                rollout_row(index, i, [1, 2], [5 + i], [-0.5], reward) for i, reward in enumerate(rewards_by_task[task])
            ]
        return rows

    return collect


def fake_draw(order: list[str], counts: list[int]):
    """`fill_step`'s draw: the next tasks of `order`; records the counts asked."""
    position = 0

    def draw(count: int) -> list[str]:
        nonlocal position
        counts.append(count)
        tasks, position = order[position : position + count], position + count
        return tasks

    return draw


REWARDS = {
    "A": [1.0, 1.0],
    "B": [0.0, 0.0],
    "C": [1.0, 0.0],
    "D": [0.0, 0.0],
    "E": [0.0, 1.0],
    "F": [1.0],
    "G": [1.0, 0.0],
}


def test_fill_step_refills_zero_variance_groups_from_further_tasks():
    # the docstring's example: A and B have equal rewards, C varies, D does not, E varies
    calls, counts = [], []
    groups = fill_step(
        fake_draw(list("ABCDE"), counts), fake_collect(REWARDS, calls), batch_size=2, group_size=2, max_rounds=4
    )
    assert calls == [(["A", "B"], 1), (["C", "D"], 2), (["E"], 3)] and counts == [
        2,
        2,
        1,
    ]  # each refill asks for the missing groups
    assert [[row["reward"] for row in group] for group in groups.kept] == [[1.0, 0.0], [0.0, 1.0]]  # C's and E's
    assert (groups.groups_total, groups.groups_zero_variance, groups.groups_incomplete, groups.rounds) == (5, 3, 0, 3)
    assert groups.rollouts_expected == 10 and len(groups.rewards) == 10
    step = groups.to_step("grpo", pad_token_id=0)
    # each kept group [1, 0]: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711, advantages ±0.5 / 0.70711 =
    # ±0.70711
    assert step.batch is not None and len(step.batch) == 4 and step.sampling_rounds == 3
    assert torch.allclose(step.advantages, torch.tensor([0.70711, -0.70711, -0.70711, 0.70711]), atol=1e-4)


def test_fill_step_stops_at_the_bound_and_when_tasks_run_out():
    calls, counts = [], []
    groups = fill_step(
        fake_draw(list("ABCDE"), counts), fake_collect(REWARDS, calls), batch_size=2, group_size=2, max_rounds=2
    )
    assert [tasks for tasks, _ in calls] == [["A", "B"], ["C", "D"]]  # round 3 would have drawn E
    assert len(groups.kept) == 1 and (groups.groups_total, groups.groups_zero_variance, groups.rounds) == (4, 3, 2)
    calls = []
    groups = fill_step(
        fake_draw(list("ABD"), []), fake_collect(REWARDS, calls), batch_size=2, group_size=2, max_rounds=10
    )
    assert (
        [tasks for tasks, _ in calls] == [["A", "B"], ["D"]] and groups.rounds == 2 and groups.kept == []
    )  # then no task is left
    assert groups.to_step("grpo", pad_token_id=0).batch is None


def test_fill_step_refills_a_group_with_a_failed_rollout():
    calls = []
    groups = fill_step(
        fake_draw(list("FCE"), []), fake_collect(REWARDS, calls), batch_size=2, group_size=2, max_rounds=4
    )
    assert [tasks for tasks, _ in calls] == [["F", "C"], ["E"]]
    assert (groups.groups_total, groups.groups_zero_variance, groups.groups_incomplete, len(groups.kept)) == (
        3,
        0,
        1,
        2,
    )
    assert groups.rollouts_expected - len(groups.rewards) == 1  # the step's rollouts_failed


def test_fill_step_refills_a_group_with_a_masked_rollout():
    """Issue 29: a rollout NeMo Gym 0.7.0 masks (`mask_sample`, e.g. a judge that failed, reward 0.0 that measures
    nothing) leaves its group incomplete: the group is dropped and refilled like one with a failed rollout, its reward
    stays out of the step's rewards, and the reason is counted."""
    calls = []
    collect = fake_collect(REWARDS, calls)

    def collect_masking_c(tasks: list[str], sampling_round: int) -> list[dict[str, Any]]:
        rows = collect(tasks, sampling_round)
        for row in rows:  # C's second rollout: its judge failed
            if tasks[row["_ng_task_index"]] == "C" and row["_ng_rollout_index"] == 1:
                row.update(mask_sample=True, failure_kind="judge_failed")
        return rows

    groups = fill_step(fake_draw(list("CEG"), []), collect_masking_c, batch_size=2, group_size=2, max_rounds=4)
    assert [tasks for tasks, _ in calls] == [["C", "E"], ["G"]]
    assert (groups.groups_total, groups.groups_incomplete, len(groups.kept), dict(groups.masked)) == (
        3,
        1,
        2,
        {"judge_failed": 1},
    )
    assert len(groups.rewards) == 5 and groups.rollouts_expected == 6  # C's masked reward is not among them
    assert groups.to_step("grpo", pad_token_id=0).masked == {"judge_failed": 1}


def test_one_round_is_plain_grpo():
    calls = []
    groups = fill_step(
        fake_draw(list("ABCDE"), []), fake_collect(REWARDS, calls), batch_size=2, group_size=2, max_rounds=1
    )
    assert calls == [(["A", "B"], 1)] and groups.kept == [] and groups.groups_zero_variance == 2


# -- the recipe's step, at the collection seam -----------------------------------------------------------------------
# 5 tasks, seed 0: epoch 0 is [2, 3, 1, 0, 4], epoch 1 [3, 0, 2, 4, 1]. Tasks 0, 2 and 3 get equal rewards, 1 and 4
# vary.
TASK_REWARDS = {0: [0.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 1.0], 3: [0.0, 0.0], 4: [0.0, 1.0]}


class FakeGymRecipe(GRPORecipe):
    """The GRPO recipe on 5 task rows with a fake gym (the real `TaskSampler`) and a collection that gives each task its
    TASK_REWARDS; records (collection name, task ids) per collection. `stop_in` names a collection that a stop abandons.
    """

    def __init__(self, **options: Any):
        cfg = TrainerConfig(
            input_jsonl_fpath="tasks.jsonl",
            engine=EngineConfig(model_path="tiny"),
            batch_size=2,
            group_size=2,
            **options,
        )
        super().__init__(cfg, [])
        tasks = [{"id": i} for i in range(5)]
        sampler = TaskSampler(len(tasks), cfg.batch_size, cfg.seed)
        self.gym = SimpleNamespace(
            tasks=tasks, sampler=sampler, batch=lambda step: [tasks[i] for i in sampler.batch(step)]
        )
        self.loop = SimpleNamespace(stop=StopSignal())
        self.engine = SimpleNamespace(pad_token_id=0)
        self.collections: list[tuple[str, list[int]]] = []
        self.stop_in: str | None = None

    def collect(self, tasks, num_repeats, name, overrides=None):
        if name == self.stop_in:
            raise StopRequested()
        self.collections.append((name, [task["id"] for task in tasks]))
        return [
            rollout_row(index, i, [1, 2], [5 + i], [-0.5], r)
            for index, task in enumerate(tasks)
            for i, r in enumerate(TASK_REWARDS[task["id"]][:num_repeats])
        ]


def test_task_order_of_seed_0_is_the_one_the_recipe_tests_use():
    sampler = TaskSampler(5, 2, seed=0)
    assert [sampler.index(p) for p in range(10)] == [2, 3, 1, 0, 4, 3, 0, 2, 4, 1]


def test_step_with_dynamic_sampling_trains_on_refilled_groups(capsys):
    recipe = FakeGymRecipe(dynamic_sampling=True, max_sampling_rounds=3)
    metrics, batch = recipe.prepare_step(0)
    # round 1: tasks 2, 3 (equal rewards); round 2: 1 (varies), 0; round 3: 4 (varies): positions 0-4 read
    assert recipe.collections == [
        ("step_000001", [2, 3]),
        ("step_000001_round_2", [1, 0]),
        ("step_000001_round_3", [4]),
    ]
    assert batch is not None and len(batch) == 4 and "trained" not in metrics
    assert {
        k: metrics[k]
        for k in (
            "data_position",
            "rollouts",
            "rollouts_failed",
            "groups_total",
            "groups_zero_variance",
            "groups_incomplete",
            "sampling_rounds",
        )
    } == {
        "data_position": 5,
        "rollouts": 10,
        "rollouts_failed": 0,
        "groups_total": 5,
        "groups_zero_variance": 3,
        "groups_incomplete": 0,
        "sampling_rounds": 3,
    }
    assert metrics["rollouts_masked"] == 0 and not [k for k in metrics if k.startswith("rollouts_masked/")]
    # over all rounds, dropped groups included: rewards of 1 are task 2's two, one of 1's and one of 4's: 4 / 10
    assert metrics["reward_mean"] == pytest.approx(0.4) and metrics["pass_rate"] == pytest.approx(0.4)
    assert recipe.state_dict() == {"data_position": 5}
    # step 2 reads on from position 5: tasks 3, 0 (equal), then 2 (equal) and 4, then 1
    recipe.collections.clear()
    metrics, batch = recipe.prepare_step(1)
    assert recipe.collections == [
        ("step_000002", [3, 0]),
        ("step_000002_round_2", [2, 4]),
        ("step_000002_round_3", [1]),
    ]
    assert metrics["data_position"] == 10 and metrics["sampling_rounds"] == 3 and len(batch) == 4
    assert capsys.readouterr().err == ""  # full batches: nothing to say


def test_a_steps_masked_rollouts_are_counted_by_reason_not_as_failed():
    """The step's metrics: masked rollouts (`rollouts_masked`, and by failure_kind) are neither `rollouts` (their
    rewards stay out of reward_mean) nor `rollouts_failed`; their group is refilled."""

    class Masking(FakeGymRecipe):
        def collect(self, tasks, num_repeats, name, overrides=None):
            rows = super().collect(tasks, num_repeats, name, overrides)
            for row in rows:  # task 1's first rollout (reward 1.0): its judge failed
                if tasks[row["_ng_task_index"]]["id"] == 1 and row["_ng_rollout_index"] == 0:
                    row.update(mask_sample=True, failure_kind="judge_failed")
            return rows

    recipe = Masking(dynamic_sampling=True, max_sampling_rounds=3)
    metrics, batch = recipe.prepare_step(0)
    # round 1: 2, 3 (equal); round 2: 1 (masked: incomplete), 0 (equal); round 3: 4 (varies) and 3 more positions
    assert (metrics["rollouts_masked"], metrics["rollouts_masked/judge_failed"], metrics["rollouts_failed"]) == (
        1,
        1,
        0,
    )
    assert metrics["rollouts"] == sum(len(tasks) for _, tasks in recipe.collections) * 2 - 1
    assert metrics["groups_incomplete"] == 1 and batch is not None


def test_step_at_the_bound_trains_on_what_it_has(capsys):
    recipe = FakeGymRecipe(dynamic_sampling=True, max_sampling_rounds=2)
    metrics, batch = recipe.prepare_step(0)
    assert [ids for _, ids in recipe.collections] == [[2, 3], [1, 0]]
    assert len(batch) == 2 and metrics["sampling_rounds"] == 2 and metrics["data_position"] == 4
    assert "dynamic sampling kept 1 of 2 groups in 2 collections" in capsys.readouterr().err


def test_a_resumed_run_reads_on_from_the_checkpoints_data_position():
    whole = FakeGymRecipe(dynamic_sampling=True, max_sampling_rounds=3)
    whole.prepare_step(0)
    state = {"step": 1, "data_position": 2 * 1, **whole.state_dict()}  # as TrainingLoop.save_checkpoint writes it
    whole.collections.clear()
    whole.prepare_step(1)
    resumed = FakeGymRecipe(dynamic_sampling=True, max_sampling_rounds=3)
    resumed.load_state_dict(state)
    resumed.prepare_step(1)
    assert resumed.collections == whole.collections and resumed.data_position == whole.data_position == 10


def test_a_stop_during_a_refill_leaves_the_data_position():
    recipe = FakeGymRecipe(dynamic_sampling=True, max_sampling_rounds=3)
    recipe.stop_in = "step_000001_round_2"
    with pytest.raises(StopRequested):
        recipe.prepare_step(0)
    assert recipe.data_position == 0 and recipe.state_dict() == {"data_position": 0}


def test_without_dynamic_sampling_the_step_is_unchanged(capsys):
    recipe = FakeGymRecipe()
    assert recipe.cfg.dynamic_sampling is False and recipe.cfg.max_sampling_rounds == 4
    metrics, batch = recipe.prepare_step(0)
    assert recipe.collections == [("step_000001", [2, 3])] and batch is None and metrics["trained"] is False
    assert "sampling_rounds" not in metrics and metrics["data_position"] == 2 and metrics["groups_zero_variance"] == 2
    warning = "no group left to train on (2 with equal rewards, 0 with failed or masked rollouts, of 2)"
    assert warning in capsys.readouterr().err
    metrics, batch = recipe.prepare_step(1)  # the batch of step 1 is the sampler's, a function of (seed, step)
    assert recipe.collections[-1] == ("step_000002", [1, 0]) and len(batch) == 2 and metrics["data_position"] == 4
    assert recipe.state_dict() == {"data_position": 4}


def test_dynamic_sampling_is_for_grpo_only():
    cfg = TrainerConfig(
        input_jsonl_fpath="rows.jsonl", engine=EngineConfig(model_path="tiny"), algorithm="sft", dynamic_sampling=True
    )
    assert any(problem.startswith("trainer.dynamic_sampling: only algorithm grpo") for problem in check_algorithm(cfg))
    assert check_algorithm(cfg.model_copy(update={"algorithm": "grpo"})) == []
    with pytest.raises(ValueError, match="max_sampling_rounds"):
        TrainerConfig(input_jsonl_fpath="t.jsonl", engine=EngineConfig(model_path="tiny"), max_sampling_rounds=0)


# -- ng_train through real servers -----------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]
WEATHER_TASKS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
PROMPT_IDS, TOOL_CALL_IDS, TOOL_OUTPUT_IDS, REPLY_IDS = (
    [1, 2, 3],
    [20, 21],
    [40],
    [30, 31],
)  # below the tiny model's 512


def question(body: dict[str, Any]) -> str:
    """The last user message of a Responses request."""
    users = [item for item in body.get("input") or [] if isinstance(item, dict) and item.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content or [])


def weather_policy(flat_questions: set[str]):
    """The scripted model with vllm_model's training token information. A question of `flat_questions` is answered at
    once, without the weather tool (reward 0 for every rollout: a zero-variance group); any other question is answered
    with the tool call (reward 1) every other time it is asked, so its group of 2 gets rewards 1 and 0."""
    from collections import Counter

    from nemo_gym.serving.entrypoint import load_server_class

    asked: Counter[str] = Counter()

    class Policy(load_server_class(REPO / "responses_api_models/scripted_model/app.py")):
        async def responses(self, body: dict) -> dict:
            followup = any(
                isinstance(item, dict) and item.get("type") == "function_call_output"
                for item in body.get("input") or []
            )
            if not followup:
                asked[question(body)] += 1
                if question(body) in flat_questions or asked[question(body)] % 2 == 0:
                    body = {**body, "tools": []}  # no tool offered: the scripted model answers with text
            answer = await super().responses(body)
            generation = TOOL_CALL_IDS if answer["output"][-1]["type"] == "function_call" else REPLY_IDS
            prompt = PROMPT_IDS + TOOL_CALL_IDS + TOOL_OUTPUT_IDS if followup else PROMPT_IDS
            answer["output"][-1].update(
                prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=[-6.0] * len(generation)
            )
            return answer

    return Policy({"default_reply": "It is cold in San Francisco."}).build_app()


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.integration
@pytest.mark.long
def test_ng_train_refills_a_step_that_had_no_group_left(tmp_path, monkeypatch, capsys):
    """ng_train (in this process) attached to a real ng_run; 5 weather tasks in the order [2, 3, 1, 0, 4] (seed 0), then
    [3, 0, 2, 4, 1]; tasks 2, 3 and 0 always score 0. Step 1's first collection (2, 3) has no group with unequal
    rewards:
    without dynamic sampling it would take no optimizer step. With it (and the default bound of 4 collections) it
    collects 1 and 0, then 4, and trains on the groups of 1 and 4. A second run resumes at step 2 from data position 5.
    """
    from live_servers import serve
    from ng_process import LAUNCHER_ENV, NgRun
    from test_train_engine import make_tiny_model

    from nemo_gym.cli import main

    for name in LAUNCHER_ENV:  # set by engines earlier in this process; this trainer sets its own
        monkeypatch.delenv(name, raising=False)
    questions = [question(row["responses_create_params"]) for row in read_rows(WEATHER_TASKS)]
    assert [TaskSampler(5, 2, seed=0).index(p) for p in range(10)] == [2, 3, 1, 0, 4, 3, 0, 2, 4, 1]
    out, model = tmp_path / "out", make_tiny_model(tmp_path / "tiny")
    with serve(weather_policy({questions[2], questions[3], questions[0]})) as policy_url:
        config = weather_config(tmp_path / "weather.yaml", policy_url)
        with NgRun(f"+config_paths=[{config}]", "+skip_venv=true") as servers:
            argv = [
                f"+config_paths=[{config}]",
                f"+trainer.head_server_url={servers.wait_ready()}",
                f"+trainer.input_jsonl_fpath={WEATHER_TASKS}",
                "+trainer.agent_name=weather_agent",
                f"+trainer.output_dir={out}",
                "+trainer.batch_size=2",
                "+trainer.group_size=2",
                f"+trainer.engine.model_path={model}",
                "+trainer.sync_weights=false",
                "+trainer.logging.console=false",
                "+trainer.logging.tensorboard=false",
                "+trainer.dynamic_sampling=true",
            ]
            assert main("train", [*argv, "+trainer.num_steps=1"]) == 0, capsys.readouterr().err[-3000:]
            assert main("train", [*argv, "+trainer.num_steps=2"]) == 0, capsys.readouterr().err[
                -3000:
            ]  # resumes at step 2
    rollouts = out / "rollouts"
    first = read_rows(rollouts / "step_000001.jsonl")
    assert len(first) == 4 and {row["reward"] for row in first} == {
        0.0
    }  # what plain GRPO would have had: no group left
    asked = [
        [
            questions.index(question(row["responses_create_params"]))
            for row in read_rows(rollouts / f"{name}_tasks.jsonl")
        ]
        for name in (
            "step_000001",
            "step_000001_round_2",
            "step_000001_round_3",
            "step_000002",
            "step_000002_round_2",
            "step_000002_round_3",
        )
    ]
    assert asked == [
        [2, 3],
        [1, 0],
        [4],
        [3, 0],
        [2, 4],
        [1],
    ]  # no task twice in a step; step 2 reads on from position 5
    step1, step2 = read_rows(out / "metrics.jsonl")
    for step, position in ((step1, 5), (step2, 10)):
        assert step["trained"] is True and step["num_tokens"] > 0, step
        assert (step["groups_total"], step["groups_zero_variance"], step["sampling_rounds"], step["data_position"]) == (
            5,
            3,
            3,
            position,
        ), step
        assert step["rollouts"] == 10 and step["rollouts_failed"] == 0 and step["reward_mean"] == pytest.approx(0.2), (
            step
        )  # 2 tool calls in 10
    state = json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert (state["step"], state["data_position"]) == (2, 10)
    assert json.loads((out / "checkpoints" / "step_000001" / "trainer_state.json").read_text())["data_position"] == 5
