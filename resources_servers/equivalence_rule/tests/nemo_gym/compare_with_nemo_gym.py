"""Dev check, not a CI test: NeMo Gym 0.4.0's own equivalence_rule server and ours score the same cases alike.

    .venv/bin/python resources_servers/equivalence_rule/tests/nemo_gym/compare_with_nemo_gym.py
    /tmp/ngbench/venv/bin/python

The first argument is the Python of a virtual environment where the `nemo-gym==0.4.0` wheel is installed.
Each case (NeMo Gym's rollouts, and a few replies, under each of its three grading rules) is sent to NeMo
Gym's server object in that environment (its `verify` called with its own request model, the way its own
tests build it) and to ours over HTTP; every reward must agree to 1e-9. Prints one line per case.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify, server_client

SERVER_DIR = Path(__file__).resolve().parents[2]
THEIRS = """
import asyncio, json, sys
from unittest.mock import MagicMock
from nemo_gym.server_utils import ServerClient
from resources_servers.equivalence_rule.app import (EquivalenceRuleResourcesServer as Server,
    EquivalenceRuleResourcesServerConfig as Config, EquivalenceRuleVerifyRequest as Request)
rewards = []
for case in json.load(sys.stdin):
    config = Config(host="127.0.0.1", port=0, entrypoint="", name="", grading_rule=case["rule"])
    server = Server(config=config, server_client=MagicMock(spec=ServerClient))
    rewards.append(asyncio.run(server.verify(Request.model_validate(case["body"]))).reward)
print(json.dumps(rewards))
"""


def cases() -> list[dict]:
    rollouts = read_jsonl(SERVER_DIR / "tests/nemo_gym/example_rollouts.jsonl")
    bodies = [{k: v for k, v in r.items() if k not in ("reward", "equivalence_score")} for r in rollouts]
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]},
        "expected_answer": "Paris!",
    }
    replies = ["Paris", "  PARIS!\n", "The answer is   Paris!", "", "Paris is the capital.\n\nParis!", "p a r i s !"]
    bodies += [{**row, "response": assistant_response(reply)} for reply in replies]
    return [{"rule": rule, "body": body} for rule in ("exact", "seq_match", "weighted_seq_match") for body in bodies]


def main(nemo_gym_python: str) -> int:
    todo = cases()
    # Run outside this repository, so `resources_servers` is the wheel's package, not ours.
    answer = subprocess.run(
        [nemo_gym_python, "-c", THEIRS],
        input=json.dumps(todo),
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    if answer.returncode:
        sys.exit(f"NeMo Gym's side failed:\n{answer.stderr}")
    theirs = json.loads(answer.stdout.strip().splitlines()[-1])
    failures = 0
    for case, their_reward in zip(todo, theirs):
        with server_client(SERVER_DIR, {"grading_rule": case["rule"]}) as client:
            ours = post_verify(client, case["body"])["reward"]
        same = abs(ours - their_reward) < 1e-9
        failures += not same
        print(f"{'ok  ' if same else 'DIFF'} {case['rule']:<19} ours {ours:.6f} NeMo Gym {their_reward:.6f}")
    print(f"{len(todo) - failures} of {len(todo)} cases agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
