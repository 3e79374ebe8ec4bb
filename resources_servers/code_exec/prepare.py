"""Write the bundled code_exec tasks (deterministic: the same task bank gives byte-identical files).

    python resources_servers/code_exec/prepare.py [--data-dir resources_servers/code_exec/data]

Writes `code_tasks.jsonl` (every task of `task_bank.py`) and `example.jsonl` (the 5 tasks of
`EXAMPLE_TASKS`). Expected values are computed by running each task's reference solution here (trusted code
written for this project); the rows keep it as `reference_solution` (never shown to the policy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nemo_gym.serving.module_loading import script_package

if (
    not __package__
):  # run as a script (`python prepare.py`): its relative imports resolve in this folder's package (PEP 366)
    __package__ = script_package(__file__)

from . import task_bank  # noqa: E402

FOLDER = Path(__file__).resolve().parent
EXAMPLE_TASKS = ("add", "reverse_string", "is_palindrome", "fizzbuzz", "balanced_parentheses")
INSTRUCTION = "Answer with the complete function in a ```python code block."


def call_text(name: str, args: list[Any]) -> str:
    return f"{name}({', '.join(map(repr, args))})"


def build_row(task: Any) -> dict[str, Any]:
    """The JSONL row of a `task_bank.TaskSpec`.

    Raises:
        ValueError: the reference solution does not define the function, or returns a non-JSON value.
    """
    namespace: dict[str, Any] = {}
    exec(compile(task.reference, f"<reference {task.name}>", "exec"), namespace)
    function = namespace.get(task.name)
    if not callable(function):
        raise ValueError(f"task {task.name}: the reference solution defines no function {task.name!r}")
    tests = []
    for args in task.tests:
        expected = function(*json.loads(json.dumps(args)))
        tests.append({"args": args, "expected": json.loads(json.dumps(expected, allow_nan=False))})
    example = f"For example, `{call_text(task.name, task.tests[0])}` returns `{function(*task.tests[0])!r}`."
    prompt = f"Write a Python function `{task.signature}` that {task.description}\n\n{example}\n\n{INSTRUCTION}"
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "task_id": f"code_exec-{task.name}",
        "entry_point": task.name,
        "tests": tests,
        "reference_solution": task.reference,
    }


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def prepare(data_dir: Path) -> int:
    """Write both files into `data_dir`; returns the number of tasks."""
    rows = [build_row(task) for task in task_bank.TASKS]
    names = [row["entry_point"] for row in rows]
    if len(set(names)) != len(names):
        raise ValueError("task_bank.py: two tasks share a function name")
    write_jsonl(rows, data_dir / "code_tasks.jsonl")
    write_jsonl(
        [row for name in EXAMPLE_TASKS for row in rows if row["entry_point"] == name], data_dir / "example.jsonl"
    )
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=FOLDER / "data", help="where to write the JSONL files")
    args = parser.parse_args(argv)
    print(f"wrote {prepare(args.data_dir)} tasks to {args.data_dir}/code_tasks.jsonl and 5 to example.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
