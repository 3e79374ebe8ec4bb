"""Write the bundled math_verify tasks: `python resources_servers/math_verify/prepare.py`.

Generates `data/math_tasks.jsonl` (60 tasks) and `data/example.jsonl` (5 tasks) with the arithmetic and
algebra generators of the PyPI library `reasoning-gym` (0.1.25, Apache 2.0), offline and deterministically:
running it again gives byte-identical files. The difficulties are low on purpose, so that
SmolLM2-135M-Instruct solves some tasks (a reward signal from the first step of training).
Needs `reasoning-gym==0.1.25` (not a requirement of the server itself).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
ANSWER_INSTRUCTION = "Put your final answer inside \\boxed{}."

# (generator name, number of tasks, seed, config: the keyword arguments of its config class = its difficulty)
GENERATORS: list[tuple[str, int, int, dict[str, Any]]] = [
    # "Calculate 4 - 1."
    (
        "basic_arithmetic",
        15,
        1,
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ("+", "-"),
            "allow_parentheses": False,
            "allow_negation": False,
        },
    ),
    # "State the final answer to the following arithmetic problem: 12 + 7 - 3 ="
    ("chain_sum", 10, 1, {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    # "Solve the following multiplication: 4 * 1."
    ("products", 10, 1, {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    # "Find the value of e in the equation: e + 5 = 12"
    (
        "simple_equations",
        15,
        1,
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_value": 1,
            "max_value": 10,
            "operators": ("+", "-"),
            "operators_weights": [0.5, 0.5],
        },
    ),
    # "Find the Greatest Common Divisor (GCD) of these numbers: 12, 18."
    ("gcd", 10, 1, {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 20}),
]
EXAMPLE_GENERATORS = [(name, 1, 0, config) for name, _, _, config in GENERATORS]


def build_rows(generators: list[tuple[str, int, int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per generated task: the prompt, `expected_answer` (the generator's answer), provenance."""
    import reasoning_gym

    rows = []
    for name, size, seed, config in generators:
        for index, entry in enumerate(reasoning_gym.create_dataset(name, size=size, seed=seed, **config)):
            question = entry["question"].rstrip()
            rows.append(
                {
                    "responses_create_params": {
                        "input": [{"role": "user", "content": f"{question}\n\n{ANSWER_INSTRUCTION}"}]
                    },
                    "expected_answer": str(entry["answer"]),
                    "question": question,
                    "dataset": name,
                    "task_id": f"{name}-{seed}-{index}",
                }
            )
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def main() -> None:
    write_rows(DATA_DIR / "math_tasks.jsonl", build_rows(GENERATORS))
    write_rows(DATA_DIR / "example.jsonl", build_rows(EXAMPLE_GENERATORS))


if __name__ == "__main__":
    main()
