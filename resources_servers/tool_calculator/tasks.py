"""tool_calculator's tasks and its scripted expert, deterministic: `python resources_servers/tool_calculator/tasks.py`.

A task is a 3-digit × 2-digit product ("What is 347 * 29?", one `multiply` call) or that product plus a 3-digit
number ("What is 347 * 29 + 518?", `multiply` then `add` on its result). Rows carry the tool schemas (as
`GET /tools` gives them, without `strict`/`additionalProperties`, to keep the prompt short), `expected_answer` and
`expected_calls`. The distinct questions drawn from `random.Random(SEED)` are split by the SHA-256 of their text
into `data/train.jsonl` and `data/heldout.jsonl` (no question in common); `data/example.jsonl` is 5 training rows.

`python resources_servers/tool_calculator/tasks.py --expert-rows 64` writes the first 64 training rows with their
expert script to results/train/tool_agent_expert_tasks.jsonl: `expert_row(row)` adds the expert's script to a row
(`responses_create_params.metadata.script`, read by
`scripted_model`): the expected calls, one model turn each, then "The answer is N.". Collected through the real
agent and this server, those rollouts are the SFT data of `benchmarks/learning_tool_agent.py`.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from nemo_gym.common.jsonl import read_jsonl

FOLDER = Path(__file__).resolve().parent
SEED = 2111
NUM_DRAWN = 400
HELDOUT_SHARE = 0.2
TWO_CALL_SHARE = 0.5


def _tool(name: str, description: str) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }
    return {"type": "function", "name": name, "description": description, "parameters": parameters}


TOOLS = [_tool("multiply", "Multiply two integers."), _tool("add", "Add two integers.")]


def make_task(a: int, b: int, c: int | None = None) -> dict[str, Any]:
    """The row asking for a * b (c None) or a * b + c."""
    question = f"What is {a} * {b}?" if c is None else f"What is {a} * {b} + {c}?"
    calls = [{"name": "multiply", "arguments": {"a": a, "b": b}}]
    if c is not None:
        calls.append({"name": "add", "arguments": {"a": a * b, "b": c}})
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"{question} Use the tools."}],
            "tools": TOOLS,
        },
        "question": question,
        "expected_answer": a * b + (c or 0),
        "expected_calls": calls,
    }


def draw_tasks(num: int = NUM_DRAWN, seed: int = SEED, two_call_share: float = TWO_CALL_SHARE) -> list[dict[str, Any]]:
    """`num` draws, distinct questions only (first occurrence kept)."""
    rng, rows = random.Random(seed), {}
    for _ in range(num):
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        c = rng.randint(100, 999) if rng.random() < two_call_share else None
        row = make_task(a, b, c)
        rows.setdefault(row["question"], row)
    return list(rows.values())


def split(
    rows: list[dict[str, Any]], heldout_share: float = HELDOUT_SHARE
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out): each question goes where the SHA-256 of its text falls (stable across runs)."""
    train, heldout = [], []
    for row in rows:
        bucket = int(hashlib.sha256(row["question"].encode()).hexdigest()[:8], 16) / 16**8
        (heldout if bucket < heldout_share else train).append(row)
    return train, heldout


def expert_script(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The expert's model turns: each expected call, then the answer (scripted_model's `script` format)."""
    return [{"tool_calls": [call]} for call in row["expected_calls"]] + [
        {"text": f"The answer is {row['expected_answer']}."}
    ]


def expert_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its expert script in `responses_create_params.metadata.script` (a JSON string, as metadata holds)."""
    params = {**row["responses_create_params"], "metadata": {"script": json.dumps(expert_script(row))}}
    return {**row, "responses_create_params": params}


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="write tool_calculator's data files, or expert rows")
    parser.add_argument(
        "--expert-rows",
        type=int,
        metavar="N",
        help="instead: the first N training rows with their expert script, to --output",
    )
    parser.add_argument("--output", type=Path, default=Path("results/train/tool_agent_expert_tasks.jsonl"))
    args = parser.parse_args()
    if args.expert_rows:
        rows = read_jsonl(FOLDER / "data" / "train.jsonl", limit=args.expert_rows)
        write(args.output, [expert_row(row) for row in rows])
        print(f"{len(rows)} expert rows -> {args.output}")
        return
    train, heldout = split(draw_tasks())
    write(FOLDER / "data" / "train.jsonl", train)
    write(FOLDER / "data" / "heldout.jsonl", heldout)
    write(FOLDER / "data" / "example.jsonl", train[:5])
    print(f"{len(train)} training tasks, {len(heldout)} held-out tasks")


if __name__ == "__main__":
    main()
