"""Checks of a resources server's data and verifier fixtures, with no model: `python -m nemo_gym.env.validation`.

`ng_test` runs this module inside the server's own environment (its imports may need the server's
requirements). The server is built from `<folder>/app.py` with its default config and driven over HTTP with
FastAPI's TestClient. Every problem names the file, the line (1-based; 0 = the whole file) and the rule:

| rule | what is checked |
|---|---|
| `json` | each line of a JSONL file is a JSON object |
| `example-count` | `data/example.jsonl` has exactly 5 rows |
| `responses-create-params` | each row has a `responses_create_params` object with an `input` (text or a list), and no key that is not a Responses API create parameter (`nemo_gym.serving.responses_params`) |
| `tool-exists` | each function tool a row advertises is a tool (route) of the server |
| `row-schema` | each row has the task fields the server's verify (and seed) request needs: its row schema (`GET /row_schema`, JSON Schema), as `ng_collect_rollouts` checks rows before any rollout (NeMo Gym 0.7.0's task-data validation) |
| `example-metrics` | `data/example_metrics.json` (when present) holds what `ng_prepare_data` computes for the rows |
| `rollout-reverifies` | each `data/example_rollouts.jsonl` row, verified again, gets its stored `reward` |
| `verifier-case` | each `tests/verifier_cases.jsonl` row is well formed and gets its expected reward or 4xx error |
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator, ValidationError

from nemo_gym.common.jsonl import iter_lines
from nemo_gym.env.dataset_metrics import dataset_metrics, metrics_path
from nemo_gym.env.resources_server import ResourcesServer
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.responses_params import unknown_keys

__all__ = ["Problem", "CaseResults", "validate_data", "run_verifier_cases", "main", "EXAMPLE_ROWS"]

EXAMPLE_ROWS = 5
CASE_KINDS = ("full_reward", "zero_reward", "malformed")


@dataclass(frozen=True)
class Problem:
    """One failed check: `file:line: [rule] message` (line 0 = the file as a whole)."""

    file: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: [{self.rule}] {self.message}"


@dataclass
class CaseResults:
    passed: int
    problems: list[Problem]


def read_jsonl(path: Path, shown: str) -> Iterator[tuple[int, dict[str, Any] | Problem]]:
    """(line number, row) per non-blank line, or a `json` Problem for a line that is not a JSON object."""
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            yield number, Problem(shown, number, "json", f"not valid JSON: {exc}")
            continue
        yield (
            number,
            (
                row
                if isinstance(row, dict)
                else Problem(shown, number, "json", f"a JSON {type(row).__name__}, not an object")
            ),
        )


def build_client(folder: Path) -> tuple[TestClient, ResourcesServer]:
    """A TestClient (not yet started) over the server of `folder/app.py` with its default config."""
    cls = load_server_class(folder / "app.py")
    if not issubclass(cls, ResourcesServer):
        raise TypeError(f"{folder}/app.py defines {cls.__name__}, not a ResourcesServer")
    server = cls(name=folder.name)
    return TestClient(server.build_app()), server


def advertised_tools(row: dict[str, Any]) -> list[str]:
    """Names of the function tools in a row's `responses_create_params.tools`."""
    tools = (row.get("responses_create_params") or {}).get("tools") or []
    return [
        t.get("name") or (t.get("function") or {}).get("name")
        for t in tools
        if isinstance(t, dict) and t.get("type", "function") == "function"
    ]


def check_row(
    row: dict[str, Any], shown: str, number: int, tool_names: set[str], schema: Draft202012Validator | None = None
) -> list[Problem]:
    """The `responses-create-params`, `tool-exists` and (with the server's row `schema`) `row-schema` rules for one
    row."""
    problems = [
        Problem(shown, number, "row-schema", f"task field {'.'.join(map(str, e.absolute_path)) or 'row'}: {e.message}")
        for e in (schema.iter_errors(row) if schema is not None else ())
        if not _about_params(e)
    ]
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return problems + [
            Problem(
                shown,
                number,
                "responses-create-params",
                "no responses_create_params object (the Responses create body: input, tools, ...)",
            )
        ]
    if not isinstance(params.get("input"), (str, list)):
        problems.append(
            Problem(
                shown,
                number,
                "responses-create-params",
                "responses_create_params.input must be a text or a list of messages",
            )
        )
    problems += [
        Problem(shown, number, "responses-create-params", f"responses_create_params: {problem}")
        for problem in unknown_keys(params)
    ]
    for name in advertised_tools(row):
        if name not in tool_names:
            known = ", ".join(sorted(tool_names)) or "none"
            problems.append(
                Problem(shown, number, "tool-exists", f"tool {name!r} is not a tool of the server (its tools: {known})")
            )
    return problems


def _about_params(error: ValidationError) -> bool:
    """Whether a row-schema error is about `responses_create_params`, which the `responses-create-params` rule checks
    more closely."""
    path = list(error.absolute_path)
    return path[:1] == ["responses_create_params"] or (
        not path and error.validator == "required" and "'responses_create_params'" in error.message
    )


def validate_data(folder: Path) -> list[Problem]:
    """Problems of `data/example.jsonl` and `data/example_rollouts.jsonl` (when present); [] when all pass."""
    examples = folder / "data" / "example.jsonl"
    shown = _shown(folder, examples)
    if not examples.is_file():
        return [
            Problem(
                shown, 0, "example-count", f"missing: a server ships {EXAMPLE_ROWS} example rows in data/example.jsonl"
            )
        ]
    client, server = build_client(folder)
    tool_names = {schema["name"] for schema in server.tool_schemas()}
    row_schema = Draft202012Validator(server.row_schema())
    problems: list[Problem] = []
    rows = []
    for number, row in read_jsonl(examples, shown):
        if isinstance(row, Problem):
            problems.append(row)
            continue
        rows.append(row)
        problems += check_row(row, shown, number, tool_names, row_schema)
    if len(rows) != EXAMPLE_ROWS:
        problems.append(Problem(shown, 0, "example-count", f"{len(rows)} rows; exactly {EXAMPLE_ROWS} are expected"))
    stored_metrics = metrics_path(examples)
    if stored_metrics.is_file() and not any(p.rule in {"json", "responses-create-params"} for p in problems):
        problems += check_metrics(stored_metrics, _shown(folder, stored_metrics), rows, folder)
    rollouts = folder / "data" / "example_rollouts.jsonl"
    if rollouts.is_file():
        with client:
            problems += reverify_rollouts(
                client, rollouts, _shown(folder, rollouts), {prompt_key(row): row for row in rows}
            )
    return problems


def check_metrics(path: Path, shown: str, rows: list[dict[str, Any]], folder: Path) -> list[Problem]:
    """The `example-metrics` rule: each metric `ng_prepare_data` computes equals the stored one."""
    try:
        stored = json.loads(path.read_text())
    except ValueError as exc:
        return [Problem(shown, 0, "json", f"not valid JSON: {exc}")]
    fix = (
        f'rerun ng_prepare_data "+config_paths=[{_shown(folder, folder / "configs" / (folder.name + ".yaml"))}]"'
        " +output_dirpath=<dir> +mode=example_validation"
    )
    return [
        Problem(
            shown, 0, "example-metrics", f"{key!r} is {stored.get(key)!r} in the file but {value!r} for the rows; {fix}"
        )
        for key, value in dataset_metrics(rows).items()
        if stored.get(key) != value
    ]


def prompt_key(row: dict[str, Any]) -> str:
    """A row's prompt (role and content of each input message), to join a rollout with its task row."""
    messages = (row.get("responses_create_params") or {}).get("input")
    if not isinstance(messages, list):
        return json.dumps(messages)
    return json.dumps([(m.get("role"), m.get("content")) if isinstance(m, dict) else m for m in messages])


def reverify_rollouts(client: TestClient, path: Path, shown: str, tasks: dict[str, dict[str, Any]]) -> list[Problem]:
    """The `rollout-reverifies` rule. Each rollout is joined with its task row of `tasks` by prompt (NeMo Gym's
    rollout rows keep only the verify answer, which may drop task fields), a session is seeded with it, the
    trajectory's tool calls are replayed in that session (so stateful servers reach the same state), and
    `/verify` must give the stored reward."""
    problems = []
    for number, row in read_jsonl(path, shown):
        if isinstance(row, Problem):
            problems.append(row)
            continue
        if not isinstance(row.get("reward"), (int, float)) or not isinstance(row.get("response"), dict):
            problems.append(
                Problem(
                    shown, number, "rollout-reverifies", "a rollout row needs a numeric reward and a response object"
                )
            )
            continue
        headers = {"X-Session-Id": f"reverify-{number}"}
        task = tasks.get(prompt_key(row)) or {k: v for k, v in row.items() if k not in {"response", "reward"}}
        client.post("/seed_session", json=task, headers=headers)
        for item in row["response"].get("output") or []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                arguments = str(item.get("arguments") or "{}")
                client.post(
                    f"/{item.get('name')}", content=arguments, headers={**headers, "Content-Type": "application/json"}
                )
        body = {
            **task,
            "responses_create_params": row.get("responses_create_params", task.get("responses_create_params")),
            "response": row["response"],
        }
        answer = client.post("/verify", json=body, headers=headers)
        if answer.status_code != 200:
            problems.append(
                Problem(
                    shown, number, "rollout-reverifies", f"/verify answered {answer.status_code}: {answer.text[:200]}"
                )
            )
        elif not math.isclose(answer.json()["reward"], row["reward"], abs_tol=1e-6):
            problems.append(
                Problem(
                    shown, number, "rollout-reverifies", f"reward {answer.json()['reward']} now, {row['reward']} stored"
                )
            )
    return problems


def check_case(case: dict[str, Any], shown: str, number: int) -> Problem | None:
    """Whether a verifier case row is well formed (None when it is)."""
    if (
        not isinstance(case.get("name"), str)
        or case.get("kind") not in CASE_KINDS
        or not isinstance(case.get("request"), dict)
    ):
        return Problem(
            shown,
            number,
            "verifier-case",
            f"a case needs name (text), kind ({' | '.join(CASE_KINDS)}) and request (object)",
        )
    if case["kind"] != "malformed" and not isinstance(case.get("expected_reward"), (int, float)):
        return Problem(
            shown, number, "verifier-case", f"case {case['name']!r} ({case['kind']}) needs a numeric expected_reward"
        )
    return None


def run_case(client: TestClient, case: dict[str, Any], shown: str, number: int) -> Problem | None:
    """POST the case's request to /verify; None when the answer is the expected one."""
    answer = client.post("/verify", json=case["request"], headers={"X-Session-Id": f"case-{number}"})
    name, kind = case["name"], case["kind"]
    if kind == "malformed":
        expected = str(case.get("expected_error") or "")
        if not 400 <= answer.status_code < 500:
            return Problem(
                shown, number, "verifier-case", f"{name!r} (malformed): expected a 4xx answer, got {answer.status_code}"
            )
        if expected not in answer.text:
            return Problem(
                shown,
                number,
                "verifier-case",
                f"{name!r} (malformed): error does not mention {expected!r}: {answer.text[:200]}",
            )
        return None
    if answer.status_code != 200:
        return Problem(
            shown,
            number,
            "verifier-case",
            f"{name!r} ({kind}): /verify answered {answer.status_code}: {answer.text[:200]}",
        )
    reward = answer.json().get("reward")
    if not isinstance(reward, (int, float)) or not math.isclose(reward, case["expected_reward"], abs_tol=1e-6):
        return Problem(
            shown, number, "verifier-case", f"{name!r} ({kind}): reward {reward}, expected {case['expected_reward']}"
        )
    return None


def run_verifier_cases(folder: Path) -> CaseResults:
    """Run `tests/verifier_cases.jsonl` against the server (no cases: nothing passed, no problem)."""
    path = folder / "tests" / "verifier_cases.jsonl"
    if not path.is_file():
        return CaseResults(0, [])
    shown = _shown(folder, path)
    client, _ = build_client(folder)
    results = CaseResults(0, [])
    with client:
        for number, case in read_jsonl(path, shown):
            problem = (
                case
                if isinstance(case, Problem)
                else check_case(case, shown, number) or run_case(client, case, shown, number)
            )
            if problem:
                results.problems.append(problem)
            else:
                results.passed += 1
    return results


def _shown(folder: Path, path: Path) -> str:
    """`path` as written in messages: relative to the folder's repository (two levels up)."""
    try:
        return str(path.resolve().relative_to(folder.resolve().parent.parent))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemo_gym.env.validation", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the resources server folder")
    parser.add_argument(
        "--data", action="store_true", help="also validate data/example.jsonl and data/example_rollouts.jsonl"
    )
    parser.add_argument("--json-out", type=Path, help="write {verifier_cases_passed, problems} here")
    parser.add_argument("--schema", action="store_true", help="print the server's row schema (JSON Schema) only")
    args = parser.parse_args(argv)
    if args.schema:
        print(json.dumps(build_client(args.folder)[1].row_schema(), indent=2))
        return 0
    cases = run_verifier_cases(args.folder)
    problems = cases.problems + (validate_data(args.folder) if args.data else [])
    for problem in problems:
        print(problem)
    if (args.folder / "tests" / "verifier_cases.jsonl").is_file():
        print(f"verifier cases: {cases.passed} passed, {len(cases.problems)} failed")
    if args.data:
        print(f"data: {'ok' if not problems[len(cases.problems) :] else 'problems above'}")
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "verifier_cases_passed": cases.passed,
                    "verifier_cases_failed": len(cases.problems),
                    "problems": [asdict(p) for p in problems],
                }
            )
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
