"""Writes data/tasks.jsonl (32 string_match tasks) and data/validation.jsonl (8): deterministic, no download.

Each row is a task for resources_servers/string_match: the question, its `expected_answer` and how to match it.
The teacher answers them (ng_collect_rollouts); string_match scores each answer. Run: python make_data.py
"""

import json
from pathlib import Path

CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Germany", "Berlin"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Canada", "Ottawa"),
    ("Norway", "Oslo"),
    ("Greece", "Athens"),
    ("Cuba", "Havana"),
]
SUFFIX = "\n\nPut your final answer inside \\boxed{}."


def task(index: int) -> dict:
    if index % 2 == 0:
        country, capital = CAPITALS[(index // 2) % len(CAPITALS)]
        question, answer, mode = f"What is the capital of {country}?", capital, "normalized"
    else:
        a, b = 2 + (index * 5) % 17, 1 + (index * 3) % 9
        question, answer, mode = f"What is {a} + {b}?", str(a + b), "numeric"
    return {
        "responses_create_params": {"input": [{"role": "user", "content": question + SUFFIX}]},
        "expected_answer": answer,
        "match": {"mode": mode},
    }


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    write(here / "data" / "tasks.jsonl", [task(i) for i in range(32)])
    write(here / "data" / "validation.jsonl", [task(i) for i in range(100, 108)])
