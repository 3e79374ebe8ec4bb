"""The pieces of benchmarks/learning_tool_agent.py, fast (the 60-minute run itself is the benchmark's):

- the scripted expert's rollouts, collected through the real servers (ng_run of tool_calculator + simple_agent +
  scripted_model, ng_collect_rollouts), solve their tasks in the expected turns;
- the SFT tokens of such a rollout are the served ones: turn by turn, the SFT sequence is exactly the prompt ids
  vllm_model builds (its own `prompt_ids`, first turn and spliced later turns) followed by the ids of a Hermes
  `<tool_call>` block that vllm_model parses back into the expert's call (SmolLM2's real tokenizer);
- the report's helpers: paired bootstrap comparison (a worked example), turns and tool calls per rollout, and
  `--report-only` on a synthetic run folder.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from ng_process import BIN, REPO, NgRun

sys.path.insert(0, str(REPO / "benchmarks"))

import learning_common  # noqa: E402
import learning_tool_agent as bench  # noqa: E402

from nemo_gym.common.jsonl import read_jsonl  # noqa: E402
from nemo_gym.model_servers import tool_calls  # noqa: E402
from nemo_gym.serving import openai_convert
from nemo_gym.serving.entrypoint import load_server_class  # noqa: E402
from nemo_gym.serving.module_loading import import_file  # noqa: E402

ENV = REPO / "resources_servers/tool_calculator"
tasks = import_file(ENV / "tasks.py")
CONFIGS = ",".join(
    str(p)
    for p in [
        ENV / "configs/tool_calculator_expert.yaml",
        REPO / "responses_api_models/scripted_model/configs/scripted_model.yaml",
    ]
)


def expert_rollout(row: dict) -> dict:
    """The rollout row simple_agent + tool_calculator make of the expert's script (what the collector writes)."""
    output = []
    for n, turn in enumerate(tasks.expert_script(row)):
        if "text" in turn:
            output.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": turn["text"], "annotations": []}],
                }
            )
            continue
        (call,) = turn["tool_calls"]
        arguments = call["arguments"]
        result = arguments["a"] * arguments["b"] if call["name"] == "multiply" else arguments["a"] + arguments["b"]
        output += [
            {
                "type": "function_call",
                "call_id": f"c{n}",
                "name": call["name"],
                "arguments": json.dumps(arguments),
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": f"c{n}", "output": str(result)},
        ]
    return {**tasks.expert_row(row), "response": {"output": output}, "reward": 1.0}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.long
def test_expert_rollouts_through_the_real_servers(tmp_path):
    rows = tmp_path / "expert_tasks.jsonl"
    examples = read_jsonl(ENV / "data/example.jsonl")
    rows.write_text("".join(json.dumps(tasks.expert_row(row)) + "\n" for row in examples))
    out = tmp_path / "expert.jsonl"
    with NgRun(f"+config_paths=[{CONFIGS}]", timeout_s=300) as run:
        head = run.wait_ready()
        result = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+head_server_url={head}",
                "+agent_name=tool_calculator_expert_agent",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={out}",
                "+progress=false",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    rollouts = sorted(read_jsonl(out), key=lambda r: r["_ng_task_index"])
    assert [r["reward"] for r in rollouts] == [1.0] * 5
    for rollout, row in zip(rollouts, examples):
        calls = [
            (i["name"], json.loads(i["arguments"]))
            for i in rollout["response"]["output"]
            if i["type"] == "function_call"
        ]
        assert calls == [(c["name"], c["arguments"]) for c in row["expected_calls"]]
        assert bench.model_turns(rollout["response"]["output"]) == len(row["expected_calls"]) + 1
        assert rollout["stop_reason"] == "completed"
    # The collected rows render as the hand-built ones (the SFT check below uses those).
    from nemo_gym.train.supervised import row_conversation

    for rollout, row in zip(rollouts, examples):
        strip = lambda messages: [
            {k: v for k, v in m.items() if k not in ("tool_call_id", "id")}
            | ({"tool_calls": [{**c, "id": None} for c in m["tool_calls"]]} if m.get("tool_calls") else {})
            for m in messages
        ]  # noqa: E731
        assert strip(row_conversation(rollout)[0]) == strip(row_conversation(expert_rollout(row))[0])


def served_prompt_ids(tokenizer, items: list[dict], tools: list[dict]) -> list[int]:
    """vllm_model's own `prompt_ids` for a Responses input, its vLLM `/tokenize` done by the HF tokenizer (as vLLM
    does: the chat template rendered to text, then tokenized without special tokens added)."""
    model = load_server_class(REPO / "responses_api_models/vllm_model/app.py")({"base_url": "http://127.0.0.1:9"})

    async def tokenize(messages, template_tools, *, add_generation_prompt=False, continue_final_message=False):
        text = tokenizer.apply_chat_template(
            messages,
            tools=template_tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    model.tokenize = tokenize
    chat = openai_convert.responses_to_chat({"input": items, "tools": tools}, keep_token_info=True)
    return asyncio.run(model.prompt_ids(chat["messages"], chat.get("tools")))


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("calls", [1, 2])
def test_sft_tokens_are_what_vllm_model_serves_and_parses(smollm2_tokenizer, calls):
    from nemo_gym.train.config import SupervisedOptions
    from nemo_gym.train.supervised import chat_sequence, row_conversation

    tok = smollm2_tokenizer
    row = tasks.make_task(347, 29, 518 if calls == 2 else None)
    rollout = expert_rollout(row)
    sequence = chat_sequence(
        tok, *row_conversation(rollout), render_tools_in_prompt=SupervisedOptions().render_tools_in_prompt
    )
    ids, mask = sequence.input_ids, sequence.loss_mask
    runs, start = [], None  # (start, end) of each trained span: one per model turn
    for i, on in enumerate(mask + [0]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    assert len(runs) == calls + 1
    items, tools = list(row["responses_create_params"]["input"]), row["responses_create_params"]["tools"]
    output = rollout["response"]["output"]
    for turn, (lo, hi) in enumerate(runs):
        prompt = served_prompt_ids(tok, items, tools)
        assert ids[:lo] == prompt, f"turn {turn}: the SFT prompt differs from vllm_model's"
        generation = ids[lo:hi]
        assert generation[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        text = tok.decode(generation, skip_special_tokens=True)  # as vllm_model gets it from vLLM
        content, parsed = tool_calls.parse_tool_calls(text)
        if turn < calls:  # a Hermes block that vllm_model parses back into exactly the expert's call
            expected = row["expected_calls"][turn]
            assert content is None and [
                (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed
            ] == [(expected["name"], expected["arguments"])]
            assert text == tool_calls.format_tool_call(
                {"function": {"name": expected["name"], "arguments": json.dumps(expected["arguments"])}}
            )
            call_item = next(i for i in output if i["type"] == "function_call" and i["name"] == expected["name"])
            result_item = next(
                i for i in output if i["type"] == "function_call_output" and i["call_id"] == call_item["call_id"]
            )
            items += [
                {
                    **call_item,
                    "prompt_token_ids": prompt,
                    "generation_token_ids": generation,
                    "generation_log_probs": [0.0] * len(generation),
                },
                result_item,
            ]
        else:
            assert parsed == [] and content == f"The answer is {row['expected_answer']}."
    assert runs[-1][1] == len(ids) or ids[runs[-1][1] :] == tok("\n", add_special_tokens=False)["input_ids"]


def write_rollouts(path: Path, rewards: list[list[float]], output: list[dict] | None = None) -> None:
    rows = [
        {"_ng_task_index": t, "reward": r, "response": {"output": output or []}, "stop_reason": "completed"}
        for t, rs in enumerate(rewards)
        for r in rs
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_compare_worked_example(tmp_path):
    # 3 tasks × 2 samples. before: task means 0, 0.5, 1 (mean 0.5); after: 0.5, 1, 1 (mean 5/6); paired
    # differences 0.5, 0.5, 0 (mean 1/3). pass@1 equals the reward here (rewards are 0 or 1).
    write_rollouts(tmp_path / "b.jsonl", [[0, 0], [0, 1], [1, 1]])
    write_rollouts(tmp_path / "a.jsonl", [[1, 0], [1, 1], [1, 1]])
    summary = learning_common.compare(tmp_path / "b.jsonl", tmp_path / "a.jsonl", random.Random(0))
    s = summary["mean_reward"]
    assert (s["before"], s["after"], s["difference"], s["tasks"]) == pytest.approx((0.5, 5 / 6, 1 / 3, 3))
    assert 0 <= s["difference_ci95"][0] <= 1 / 3 <= s["difference_ci95"][1] <= 0.5  # resampled means of {0.5, 0.5, 0}
    assert summary["pass_at_1"]["difference"] == pytest.approx(1 / 3)


def test_turns_and_tool_calls_per_rollout(tmp_path):
    rollout = expert_rollout(tasks.make_task(347, 29, 518))["response"]["output"]
    assert bench.model_turns(rollout) == 3 and bench.model_turns([]) == 0
    write_rollouts(tmp_path / "r.jsonl", [[1.0]], rollout)
    b = bench.behaviour(tmp_path / "r.jsonl")
    assert (b["tool_calls_per_rollout"], b["turns_per_rollout"], b["share_with_tool_call"], b["stop_reasons"]) == (
        2,
        3,
        1.0,
        {"completed": 1},
    )


def test_report_only_on_a_synthetic_run(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "OUT", tmp_path)
    output = expert_rollout(tasks.make_task(347, 29))["response"]["output"]
    write_rollouts(tmp_path / "baseline.jsonl", [[0, 0]] * 4)
    write_rollouts(tmp_path / "expert.jsonl", [[1]] * 4, output)
    (tmp_path / "rl/rollouts").mkdir(parents=True)
    for step, rewards in ((0, [[0, 1], [0, 0], [1, 0], [0, 0]]), (2, [[1, 1], [1, 0], [1, 1], [0, 1]])):
        (tmp_path / f"rl/rollouts/eval_step_{step:06d}_tasks.jsonl").write_text("")
        write_rollouts(tmp_path / f"rl/rollouts/eval_step_{step:06d}.jsonl", rewards, output)
    metrics = [
        {"step": 0, "eval_reward_mean": 0.25},
        {
            "step": 1,
            "reward_mean": 0.4,
            "time_generation_s": 10.0,
            "time_training_s": 20.0,
            "time_sync_s": 2.0,
            "trained": True,
        },
        {
            "step": 2,
            "reward_mean": 0.6,
            "time_generation_s": 10.0,
            "time_training_s": 20.0,
            "time_sync_s": 2.0,
            "trained": True,
            "eval_reward_mean": 0.75,
        },
    ]
    (tmp_path / "rl/metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (tmp_path / "timings.json").write_text(json.dumps({"baseline_eval": 60.0, "sft": 120.0, "rl": 300.0}))
    summary = bench.report()
    assert (
        summary["rl_over_sft"]["mean_reward"]["before"] == 0.25
        and summary["rl_over_sft"]["mean_reward"]["after"] == 0.75
    )
    assert (
        summary["sft_over_base"]["mean_reward"]["before"] == 0.0
        and summary["steps"] == 2
        and summary["trained_steps"] == 2
    )
    assert (
        summary["behaviour"]["after_rl"]["tool_calls_per_rollout"] == 1
        and summary["behaviour"]["base"]["tool_calls_per_rollout"] == 0
    )
    minutes = summary["minutes"]
    assert minutes["RL training"] == pytest.approx(40 / 60) and minutes["total"] == pytest.approx(8.0)
    assert (tmp_path / "reward_curve.png").stat().st_size > 0 and json.loads((tmp_path / "summary.json").read_text())[
        "steps"
    ] == 2


def test_readme_commands_fit_the_configs():
    """The "Train an agent" commands (docs/training.md): the files they name exist, the two trainer configs validate,
    and they chain (the expert's rollouts are SFT's input, SFT's final model is what GRPO serves and trains)."""
    import re

    import yaml

    from nemo_gym.train.config import TrainerConfig

    guide = (REPO / "docs/training.md").read_text()
    block = guide.split("\n## Train an agent", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    for path in re.findall(
        r"(?:resources_servers|configs|responses_api_models|benchmarks)/[\w/.]+\.(?:yaml|py|jsonl)", block
    ):
        assert (REPO / path).is_file(), path
    sft = TrainerConfig.model_validate(
        yaml.safe_load((REPO / "configs/train/tool_agent_sft.yaml").read_text())["trainer"]
    )
    grpo_yaml = yaml.safe_load((REPO / "configs/train/tool_agent_grpo.yaml").read_text())
    grpo = TrainerConfig.model_validate(grpo_yaml["trainer"])
    assert (
        f"+output_jsonl_fpath={sft.input_jsonl_fpath}" in block
        and sft.algorithm == "sft"
        and sft.supervised.min_reward == 1.0
    )
    assert (
        grpo.engine.model_path
        == grpo_yaml["policy_model"]["responses_api_models"]["vllm_model"]["model"]
        == f"{sft.output_dir}/final"
    )
    assert grpo.agent_name == "tool_calculator_simple_agent" and "tool_choice" not in grpo.responses_create_params
    expert_rows = re.search(r"tasks\.py --expert-rows \d+", block)
    assert expert_rows and "+input_jsonl_fpath=results/train/tool_agent_expert_tasks.jsonl" in block


def test_committed_figures_back_the_readme():
    """The committed run (benchmarks/figures/tool_agent_summary.json, written by the benchmark's report) meets the
    issue's bar, and "Train an agent" (docs/training.md) and benchmarks/README.md quote its numbers: within 60
    minutes, the RL gain's 95 % interval above 0, tool calls and turns per rollout as written."""
    summary = json.loads((REPO / "benchmarks/figures/tool_agent_summary.json").read_text())
    assert (REPO / "benchmarks/figures/tool_agent_reward_curve.png").stat().st_size > 10_000
    assert summary["minutes"]["total"] <= 60
    gain = summary["rl_over_sft"]["mean_reward"]
    assert gain["difference_ci95"][0] > 0 and gain["tasks"] == 74
    guide = " ".join(
        (REPO / "docs/training.md").read_text().split("\n## Train an agent", 1)[1].split("\n## ", 1)[0].split()
    )
    bench_readme = " ".join(
        (REPO / "benchmarks/README.md").read_text().split("## Learning to use tools", 1)[1].split("\n## ", 1)[0].split()
    )
    sft, rl = summary["sft_over_base"]["mean_reward"], summary["rl_over_sft"]["mean_reward"]
    quoted = [
        f"{sft['after']:.3f} [{sft['after_ci95'][0]:.3f}, {sft['after_ci95'][1]:.3f}]",
        f"{rl['after']:.3f} [{rl['after_ci95'][0]:.3f}, {rl['after_ci95'][1]:.3f}]",
        f"+{rl['difference']:.3f} [+{rl['difference_ci95'][0]:.3f}, +{rl['difference_ci95'][1]:.3f}]",
        f"{summary['minutes']['total']:.1f} minutes",
    ]
    for text in quoted:
        assert text in guide and text in bench_readme, text
    behaviour = summary["behaviour"]
    calls = " → ".join(
        f"{behaviour[stage]['tool_calls_per_rollout']:.2f}" for stage in ("base", "after_sft", "after_rl")
    )
    turns = " → ".join(f"{behaviour[stage]['turns_per_rollout']:.2f}" for stage in ("base", "after_sft", "after_rl"))
    assert f"tool calls per rollout {calls}" in guide and f"model turns {turns}" in guide


def test_report_only_without_a_run_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "OUT", tmp_path / "tool_agent")
    with pytest.raises(SystemExit, match="no finished run in .*run the benchmark without --report-only first"):
        bench.report()
