"""Dev check, not a CI test: NeMo Gym 0.4.0's own reasoning_gym server and ours score the same cases alike.

    .venv/bin/python resources_servers/reasoning_gym/tests/nemo_gym/compare_with_nemo_gym.py
    /tmp/ngbench/venv/bin/python

The first argument is the Python of a virtual environment with the `nemo-gym==0.4.0` wheel and
`reasoning-gym==0.1.25` (its server's requirement). Cases: NeMo Gym's recorded rollouts, its example rows
answered with their reference, and for every generator 3 entries in NeMo Gym's row shape answered
`<answer>reference</answer>` (or the right answer the metadata holds, for answer-less entries) and
`<answer>wrong</answer>`: a form both servers read the same way. Each goes to NeMo Gym's server object (its
`verify` with its own request model, built as its own tests build it) and to ours over HTTP. Prints the
cases that differ and a count; the known difference is ARC grids (arc_agi, rearc: NeMo Gym scores the right
answer 0.05 from a JSON row, README).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import reasoning_gym
from reasoning_gym.factory import DATASETS

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify, server_client

SERVER_DIR = Path(__file__).resolve().parents[2]
THEIRS = """
import asyncio, json, sys
from unittest.mock import MagicMock
from nemo_gym.server_utils import ServerClient
from resources_servers.reasoning_gym.app import (ReasoningGymResourcesServer as Server,
    ReasoningGymResourcesServerConfig as Config, ReasoningGymVerifyRequest as Request)
config = Config(host="127.0.0.1", port=0, entrypoint="", name="")
server = Server(config=config, server_client=MagicMock(spec=ServerClient))
print(json.dumps([asyncio.run(server.verify(Request.model_validate(body))).reward for body in json.load(sys.stdin)]))
"""
RIGHT_ANSWER_FIELDS = ("possible_answer", "example_answer", "example_correct_answer")


def row_of(entry: dict) -> dict:
    entry = json.loads(json.dumps(entry, default=str))
    return {"responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]}, **entry}


def cases() -> list[tuple[str, dict]]:
    rows = {r["question"]: r for r in read_jsonl(SERVER_DIR / "tests/nemo_gym/example.jsonl")}
    todo = []
    for rollout in read_jsonl(SERVER_DIR / "tests/nemo_gym/example_rollouts.jsonl"):
        todo.append(
            (
                "rollout",
                {**rows[rollout["responses_create_params"]["input"][0]["content"]], "response": rollout["response"]},
            )
        )
    todo += [("example row", {**row, "response": assistant_response(row["answer"])}) for row in rows.values()]
    for name in sorted(set(DATASETS) - {"composite"}):
        dataset = reasoning_gym.create_dataset(name, size=3, seed=0)
        for index in range(3):
            row = row_of(dataset[index])
            right = (
                row["answer"]
                if row["answer"] is not None
                else next((row["metadata"][f] for f in RIGHT_ANSWER_FIELDS if f in row["metadata"]), "none")
            )
            right = right if isinstance(right, str) else json.dumps(right)
            todo.append((name, {**row, "response": assistant_response(f"Thinking.\n<answer>{right}</answer>")}))
            todo.append((name, {**row, "response": assistant_response("<answer>certainly wrong</answer>")}))
    return todo


def main(nemo_gym_python: str) -> int:
    todo = cases()
    # Run outside this repository, so `resources_servers` is the wheel's package, not ours.
    answer = subprocess.run(
        [nemo_gym_python, "-c", THEIRS],
        input=json.dumps([body for _, body in todo]),
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    if answer.returncode:
        sys.exit(f"NeMo Gym's side failed:\n{answer.stderr}")
    theirs = json.loads(answer.stdout.strip().splitlines()[-1])
    differ: dict[str, int] = {}
    with server_client(SERVER_DIR) as client:
        for (name, body), their_reward in zip(todo, theirs):
            ours = post_verify(client, body)["reward"]
            if abs(ours - their_reward) > 1e-9:
                differ[name] = differ.get(name, 0) + 1
                print(f"DIFF {name}: ours {ours:.4f}, NeMo Gym {their_reward:.4f}")
    print(f"{len(todo) - sum(differ.values())} of {len(todo)} cases agree; differing: {differ or 'none'}")
    return 0 if set(differ) <= {"arc_agi", "rearc"} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
