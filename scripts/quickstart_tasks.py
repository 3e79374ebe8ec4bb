"""The main job's task file: reasoning_gym's prepared tasks and mcqa's example rows, each routed to its agent.

    .venv/bin/python scripts/quickstart_tasks.py <reasoning_gym_tasks.jsonl> <tasks.jsonl>

mcqa's rows are NeMo Gym's (`resources_servers/mcqa/data/example.jsonl`): the question, ten lettered options and
the instruction to put the answer letter inside `\\boxed{}`. From that instruction alone SmolLM2-135M-Instruct
never writes a box (it repeats options such as "A: Karyotyping"), so mcqa's default grading,
`strict_single_letter_boxed`, reads no answer and every rollout scores 0. Here each mcqa row gets one worked
example before its question (few-shot prompting): a user turn with the same instruction and a four-option
question, and the assistant's answer `\\boxed{B}`. With it SmolLM2 answers inside the box in most rollouts and
is right about as often as chance over ten options, so rewards vary within a task: something GRPO can learn
from. The grading is untouched: same mode, same gold letters, no credit without the right letter in the box.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nemo_gym.common.jsonl import iter_jsonl, write_jsonl  # noqa: E402

__all__ = ["MCQA_EXAMPLE", "MCQA_INSTRUCTION", "MCQA_ROWS", "mcqa_with_worked_example", "main_job_tasks", "main"]

MCQA_ROWS = REPO / "resources_servers/mcqa/data/example.jsonl"
# the instruction that opens every NeMo Gym mcqa row of MCQA_ROWS (their text, typos included)
MCQA_INSTRUCTION = (
    "You should output your final response letter inside \\boxed{} and nothing else You can first think step-by-step. "
)
# one worked example: (user turn, assistant turn); its gold letter is B
MCQA_EXAMPLE = (
    MCQA_INSTRUCTION
    + "Which gas do plants take in from the air for photosynthesis?\nA: Oxygen\nB: Carbon dioxide\nC: Nitrogen\nD:"
    " Helium",
    "\\boxed{B}",
)


def mcqa_with_worked_example(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with MCQA_EXAMPLE's two turns before its own input; every other field (options, gold letter,
    grading mode) as it was."""
    params = row["responses_create_params"]
    messages = params["input"] if isinstance(params["input"], list) else [{"role": "user", "content": params["input"]}]
    example = [{"role": "user", "content": MCQA_EXAMPLE[0]}, {"role": "assistant", "content": MCQA_EXAMPLE[1]}]
    return {**row, "responses_create_params": {**params, "input": example + messages}}


def main_job_tasks(reasoning_gym_tasks: str | Path) -> list[dict[str, Any]]:
    """reasoning_gym's rows (agent reasoning_gym_simple_agent), then mcqa's with their worked example
    (mcqa_simple_agent)."""
    rows = [{**row, "agent_ref": {"name": "reasoning_gym_simple_agent"}} for _, row in iter_jsonl(reasoning_gym_tasks)]
    rows += [
        {**mcqa_with_worked_example(row), "agent_ref": {"name": "mcqa_simple_agent"}}
        for _, row in iter_jsonl(MCQA_ROWS)
    ]
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    rows = main_job_tasks(argv[0])
    write_jsonl(argv[1], rows)
    print(f"{len(rows)} tasks -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
