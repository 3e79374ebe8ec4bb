"""Write the bundled string_match tasks: `python resources_servers/string_match/prepare.py`.

Generates `data/string_match_tasks.jsonl` (60 tasks) and `data/example.jsonl` (5 tasks, one per kind)
from the tables and templates below, with a seeded `random.Random`: running it again gives byte-identical
files. Each kind exercises one match mode (the row's `match`):

| kind | n | match | example |
|---|---|---|---|
| capital | 15 | normalized, several references | "What is the capital of China?" → Beijing / Peking |
| arithmetic | 15 | numeric (exact value) | "What is 7 + 5?" → 12 |
| uppercase | 10 | exact (case matters) | "Write the word 'river' in capital letters." → RIVER |
| pattern | 10 | regex | "Write any word that begins with the letter b." → `b[a-z]*` |
| division | 10 | numeric, abs_tol 0.005 | "What is 2 divided by 3, to two decimal places?" → 0.67 |
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20240601
ANSWER_INSTRUCTION = "Put your final answer inside \\boxed{}."
CAPITALS: list[tuple[str, list[str]]] = [
    ("France", ["Paris"]),
    ("Japan", ["Tokyo"]),
    ("Italy", ["Rome"]),
    ("Germany", ["Berlin"]),
    ("Spain", ["Madrid"]),
    ("Egypt", ["Cairo"]),
    ("Canada", ["Ottawa"]),
    ("Russia", ["Moscow"]),
    ("China", ["Beijing", "Peking"]),
    ("India", ["New Delhi"]),
    ("Kenya", ["Nairobi"]),
    ("Greece", ["Athens"]),
    ("Portugal", ["Lisbon"]),
    ("Norway", ["Oslo"]),
    ("the United States", ["Washington, D.C.", "Washington", "Washington DC"]),
]
WORDS = ["river", "apple", "cloud", "green", "house", "light", "stone", "tiger", "bread", "music", "chair", "ocean"]
PATTERNS: list[tuple[str, str]] = [
    ("Write any word that begins with the letter {letter}.", "{letter}[a-z]*"),
    ("Write any whole number between 10 and 99 that ends in {digit}.", "[1-9]{digit}"),
]


def row(kind: str, index: int, question: str, expected: str | list[str], match: dict[str, Any]) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"{question}\n\n{ANSWER_INSTRUCTION}"}]},
        "expected_answer": expected,
        "match": match,
        "question": question,
        "task_id": f"{kind}-{index}",
    }


def capital_rows(rng: random.Random) -> list[dict[str, Any]]:
    return [
        row(
            "capital",
            i,
            f"What is the capital of {country}?",
            refs if len(refs) > 1 else refs[0],
            {"mode": "normalized"},
        )
        for i, (country, refs) in enumerate(CAPITALS)
    ]


def arithmetic_rows(rng: random.Random, n: int = 15) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+-*")
        rows.append(row("arithmetic", i, f"What is {a} {op} {b}?", str(eval(f"{a}{op}{b}")), {"mode": "numeric"}))  # noqa: S307 digits and an operator
    return rows


def uppercase_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    return [
        row("uppercase", i, f"Write the word '{word}' in capital letters.", word.upper(), {"mode": "exact"})
        for i, word in enumerate(rng.sample(WORDS, n))
    ]


def pattern_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        template, pattern = PATTERNS[i % len(PATTERNS)]
        values = {"letter": rng.choice("bcdfghlmprst"), "digit": rng.choice("0123456789")}
        rows.append(row("pattern", i, template.format(**values), pattern.format(**values), {"mode": "regex"}))
    return rows


def division_rows(rng: random.Random, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.choice([3, 6, 7, 9])
        rows.append(
            row(
                "division",
                i,
                f"What is {a} divided by {b}, to two decimal places?",
                f"{a / b:.2f}",
                {"mode": "numeric", "abs_tol": 0.005},
            )
        )
    return rows


def build_rows() -> list[dict[str, Any]]:
    """All 60 tasks, kind by kind (one seeded generator for the whole file)."""
    rng = random.Random(SEED)
    return capital_rows(rng) + arithmetic_rows(rng) + uppercase_rows(rng) + pattern_rows(rng) + division_rows(rng)


def example_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first task of each kind."""
    firsts: dict[str, dict[str, Any]] = {}
    for task in rows:
        firsts.setdefault(task["task_id"].split("-")[0], task)
    return list(firsts.values())


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    rows = build_rows()
    write_rows(DATA_DIR / "string_match_tasks.jsonl", rows)
    write_rows(DATA_DIR / "example.jsonl", example_rows(rows))


if __name__ == "__main__":
    main()
