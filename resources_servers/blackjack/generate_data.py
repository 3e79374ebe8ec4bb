"""Generate Blackjack's bundled tasks, deterministically: `python resources_servers/blackjack/generate_data.py`.

`data/tasks.jsonl`: 100 hands, seeds 1000..1099 (the shoe of each is `random.Random(seed)`'s shuffle);
`data/example.jsonl`: the first 5. Every row carries the rules as the system prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
FIRST_SEED = 1000
NUM_TASKS = 100
RULES = (
    "You are playing one hand of Blackjack against the dealer. Card values: 2-10 their number, Jack, Queen and "
    "King 10, Ace 1 or 11. Get closer to 21 than the dealer without going over. Each turn, reply with one "
    "action: hit (take another card) or stand (keep your hand; the dealer then draws to 17). "
    "End your reply with the single word hit or stand."
)


def task_rows() -> list[dict]:
    return [
        {
            "responses_create_params": {"input": [{"role": "system", "content": RULES}]},
            "seed": seed,
            "task_id": f"blackjack-{seed}",
        }
        for seed in range(FIRST_SEED, FIRST_SEED + NUM_TASKS)
    ]


def main() -> None:
    rows = task_rows()
    (DATA / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (DATA / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    print(f"wrote {len(rows)} tasks and 5 examples to {DATA}")


if __name__ == "__main__":
    main()
