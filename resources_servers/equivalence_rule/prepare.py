"""Write the bundled equivalence_rule tasks: `python resources_servers/equivalence_rule/prepare.py`.

Generates `data/equivalence_rule_tasks.jsonl` (60 tasks) and `data/example.jsonl` (the first task of the
first five kinds) from the templates below with a seeded `random.Random`: running it again gives
byte-identical files. Each kind has answers that come in several equivalent forms:

| kind | n | reference | also accepted (rule) |
|---|---|---|---|
| fraction | 10 | `3/4` | `0.75`, `\\frac{3}{4}`, `6/8` (fraction_decimal) |
| percent | 10 | `20%` | `0.2`, `20`, `20 percent` (percentage) |
| distance | 10 | `120 km` | `120000 m`, `120 kilometers` (units) |
| parity | 10 | `yes` | `True`, `correct` (boolean) |
| evens | 10 | `4, 6, 8` | `8, 4, 6`, `[6; 4; 8]` (unordered_list) |
| division | 10 | `0.43` | `0.428`, `3/7` (numeric or fraction_decimal, abs_tol 0.005) |
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20240602
ANSWER_INSTRUCTION = "Put your final answer inside \\boxed{}."


def row(
    kind: str, index: int, question: str, expected: str, equivalence: dict[str, Any] | None = None
) -> dict[str, Any]:
    task: dict[str, Any] = {
        "responses_create_params": {"input": [{"role": "user", "content": f"{question}\n\n{ANSWER_INSTRUCTION}"}]},
        "expected_answer": expected,
    }
    if equivalence:
        task["equivalence"] = equivalence
    return {**task, "question": question, "task_id": f"{kind}-{index}"}


def fraction_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        d = rng.choice([2, 4, 5, 8, 10])
        a, b = rng.randint(1, d - 1), rng.randint(1, d)
        total = Fraction(a + b, d)
        rows.append(row("fraction", i, f"What is {a}/{d} + {b}/{d}? Give a fraction or a decimal.", str(total)))
    return rows


def percent_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        whole = rng.choice([10, 20, 25, 50, 100, 200])
        step = 10 if whole % 10 == 0 else 5  # a whole percentage
        part = whole * rng.randint(1, step - 1) // step
        pct = Fraction(part * 100, whole)
        rows.append(row("percent", i, f"What percent of {whole} is {part}?", f"{pct}%"))
    return rows


def distance_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        speed, hours = rng.choice([20, 30, 40, 50, 60, 80]), rng.randint(1, 4)
        question = (
            f"A car drives at {speed} km/h for {hours} hours. How far does it go? Give the distance with its unit."
        )
        rows.append(row("distance", i, question, f"{speed * hours} km"))
    return rows


def parity_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    numbers = rng.sample(range(2, 40), n)
    return [
        row("parity", i, f"Is {k} an even number? Answer yes or no.", "yes" if k % 2 == 0 else "no")
        for i, k in enumerate(numbers)
    ]


def evens_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        low = rng.randint(1, 10)
        high = low + rng.randint(4, 7)
        evens = [k for k in range(low + 1, high) if k % 2 == 0]
        question = f"List the even numbers greater than {low} and less than {high}, separated by commas."
        rows.append(row("evens", i, question, ", ".join(map(str, evens))))
    return rows


def division_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.choice([3, 6, 7, 9])
        rows.append(
            row(
                "division",
                i,
                f"What is {a} divided by {b}, rounded to two decimal places?",
                f"{a / b:.2f}",
                {"abs_tol": 0.005},
            )
        )
    return rows


KINDS = [fraction_rows, percent_rows, distance_rows, parity_rows, evens_rows, division_rows]


def build_rows() -> list[dict[str, Any]]:
    """All 60 tasks, kind by kind (one seeded generator for the whole file)."""
    rng = random.Random(SEED)
    return [task for kind in KINDS for task in kind(rng)]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    rows = build_rows()
    write_rows(DATA_DIR / "equivalence_rule_tasks.jsonl", rows)
    write_rows(DATA_DIR / "example.jsonl", [rows[10 * k] for k in range(5)])


if __name__ == "__main__":
    main()
