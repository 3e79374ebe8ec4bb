"""Write the bundled instruction-following tasks (IFEval-style rows) from a seed, deterministically.

    python resources_servers/instruction_following/generate_data.py            # data/example.jsonl + data/train.jsonl
    python resources_servers/instruction_following/generate_data.py --seed 3 --num-tasks 200 --out-dir /tmp/if

Each task is a simple request on a simple topic ("Write a short poem about the moon.") followed by the
descriptions of 1 to 3 verifiable instructions. Task i's first instruction cycles through every registered
instruction type, so each type appears in the data; 0 to 2 more are drawn at random among those that can be
followed together (no "all lowercase" with "all capitals", no end phrase with a postscript, ...). The same
arguments give a byte-identical file: everything is drawn from one `random.Random(seed)`.

Row: `responses_create_params` (one user message, the prompt), `key`, `prompt`, `instruction_id_list`,
`kwargs` (IFEval's format). The first `--num-examples` tasks go to `example.jsonl`, the next `--num-tasks` to
`train.jsonl`.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_gym.common.jsonl import write_jsonl
from nemo_gym.serving.module_loading import script_package

if (
    not __package__
):  # run as a script (`python generate_data.py`): its relative imports resolve in this folder's package (PEP 366)
    __package__ = script_package(__file__)

from . import instructions  # noqa: E402  # the module object app.py uses

HERE = Path(__file__).resolve().parent

TOPICS = [
    "the moon",
    "the water cycle",
    "honey bees",
    "rainy days",
    "riding a bicycle",
    "a healthy breakfast",
    "the ocean",
    "friendship",
    "autumn leaves",
    "a small garden",
    "city parks",
    "volcanoes",
    "the night sky",
    "playing chess",
    "kindness",
    "trains",
    "learning to swim",
    "a visit to the library",
    "recycling",
    "snow",
]
REQUESTS = [
    "Write a short paragraph about {topic}.",
    "Write a short poem about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "Write a short story about {topic}.",
    "Describe {topic} in a few sentences.",
    "Give some simple advice about {topic}.",
]
QUESTION = "Is {topic} worth learning about?"  # the request of a constrained_response task (a yes/no question)
KEYWORDS = ["happy", "bright", "water", "friend", "green", "morning", "quiet", "light", "simple", "warm"]
FORBIDDEN = ["very", "really", "nice", "good", "thing", "big"]
FIRST_WORDS = ["today", "first", "also", "finally", "sometimes"]
RELATIONS = ["less than", "at most", "exactly", "at least"]

Sampler = Callable[[random.Random], dict[str, Any]]
SAMPLERS: dict[str, Sampler] = {
    "keywords:existence": lambda r: {"keywords": r.sample(KEYWORDS, r.randint(1, 2))},
    "keywords:frequency": lambda r: {
        "keyword": r.choice(KEYWORDS),
        "frequency": r.randint(2, 3),
        "relation": r.choice(["at least", "at most"]),
    },
    "keywords:forbidden_words": lambda r: {"forbidden_words": r.sample(FORBIDDEN, 2)},
    "keywords:letter_frequency": lambda r: r.choice(
        [
            {"letter": r.choice("aeost"), "let_frequency": r.randint(5, 12), "let_relation": "at least"},
            {"letter": r.choice("qxz"), "let_frequency": r.randint(1, 3), "let_relation": "less than"},
        ]
    ),
    "language:response_language": lambda r: {"language": r.choice(["fr", "es", "de", "it"])},
    "length_constraints:number_sentences": lambda r: {
        "num_sentences": r.randint(2, 6),
        "relation": r.choice(RELATIONS),
    },
    "length_constraints:number_paragraphs": lambda r: {"num_paragraphs": r.randint(2, 4)},
    "length_constraints:number_words": lambda r: {
        "num_words": r.choice([20, 40, 60, 100, 150]),
        "relation": r.choice(["less than", "at most", "at least"]),
    },
    "length_constraints:nth_paragraph_first_word": lambda r: (
        lambda n: {"num_paragraphs": n, "nth_paragraph": r.randint(1, n), "first_word": r.choice(FIRST_WORDS)}
    )(r.randint(2, 3)),
    "detectable_content:number_placeholders": lambda r: {"num_placeholders": r.randint(1, 3)},
    "detectable_content:postscript": lambda r: {"postscript_marker": r.choice(["P.S.", "P.P.S"])},
    "detectable_format:number_bullet_lists": lambda r: {"num_bullets": r.randint(2, 5)},
    "detectable_format:constrained_response": lambda r: {},
    "detectable_format:number_highlighted_sections": lambda r: {"num_highlights": r.randint(1, 3)},
    "detectable_format:multiple_sections": lambda r: {
        "section_spliter": r.choice(["SECTION", "Section", "PART"]),
        "num_sections": r.randint(2, 3),
    },
    "detectable_format:json_format": lambda r: {},
    "detectable_format:title": lambda r: {},
    "combination:two_responses": lambda r: {},
    "combination:repeat_prompt": lambda r: {},  # prompt_to_repeat is set once the prompt is known
    "startend:end_checker": lambda r: {
        "end_phrase": r.choice(["Is there anything else I can help with?", "Any other questions?", "That is all."])
    },
    "startend:start_checker": lambda r: {"start_phrase": r.choice(["Here is my answer", "Sure", "In short"])},
    "startend:quotation": lambda r: {},
    "change_case:capital_word_frequency": lambda r: {
        "capital_frequency": r.randint(2, 5),
        "capital_relation": r.choice(["at least", "less than"]),
    },
    "change_case:english_capital": lambda r: {},
    "change_case:english_lowercase": lambda r: {},
    "punctuation:no_comma": lambda r: {},
}
# The only instruction of its task: each fixes the whole shape of the answer.
SOLO = {"detectable_format:json_format", "detectable_format:constrained_response", "combination:two_responses"}
# At most one instruction of each group in a task (they contradict each other, or nearly).
CONFLICTS = [
    {
        "change_case:english_capital",
        "change_case:english_lowercase",
        "change_case:capital_word_frequency",
        "language:response_language",
    },
    {
        "language:response_language",
        "keywords:existence",
        "keywords:frequency",
        "keywords:letter_frequency",
        "startend:end_checker",
        "startend:start_checker",
        "combination:repeat_prompt",
        "detectable_content:postscript",
        "detectable_format:multiple_sections",
        "length_constraints:nth_paragraph_first_word",
    },
    {"combination:repeat_prompt", "startend:start_checker", "startend:quotation"},
    {"startend:end_checker", "detectable_content:postscript", "startend:quotation"},
    {
        "length_constraints:number_paragraphs",
        "length_constraints:nth_paragraph_first_word",
        "detectable_format:multiple_sections",
    },
    {"change_case:english_lowercase", "detectable_content:postscript"},
    {"change_case:english_lowercase", "startend:end_checker"},
    {"change_case:english_lowercase", "startend:start_checker"},
    {"change_case:english_lowercase", "detectable_format:multiple_sections"},
]


def compatible(candidate: str, chosen: list[str]) -> bool:
    """Whether `candidate` can join the instructions `chosen` so far."""
    if candidate in chosen or candidate in SOLO:
        return False
    return not any(candidate in group and group.intersection(chosen) for group in CONFLICTS)


def build_task(rng: random.Random, key: int, primary: str) -> dict[str, Any]:
    """One row whose first instruction is `primary` (with 0 to 2 compatible ones drawn from `rng`)."""
    topic = rng.choice(TOPICS)
    template = QUESTION if primary == "detectable_format:constrained_response" else rng.choice(REQUESTS)
    chosen = [primary]
    if primary not in SOLO:
        for _ in range(rng.choice([0, 1, 2])):
            options = [i for i in SAMPLERS if compatible(i, chosen)]
            if options:
                chosen.append(rng.choice(options))
    if "combination:repeat_prompt" in chosen:  # described last: the request to repeat is everything before it
        chosen.remove("combination:repeat_prompt")
        chosen.append("combination:repeat_prompt")
    kwargs = [SAMPLERS[i](rng) for i in chosen]
    request = template.format(topic=topic)
    sentences = [request] + [b.describe() for b in instructions.bind_instructions(chosen[:-1], kwargs[:-1])]
    if chosen[-1] == "combination:repeat_prompt":
        kwargs[-1] = {"prompt_to_repeat": " ".join(sentences)}
    bound = instructions.bind_instructions(chosen, kwargs)  # every generated row validates
    prompt = " ".join([request] + [b.describe() for b in bound])
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "key": key,
        "prompt": prompt,
        "instruction_id_list": chosen,
        "kwargs": kwargs,
    }


def build_tasks(seed: int, count: int) -> list[dict[str, Any]]:
    """`count` rows from `seed`; task i's first instruction is the (7i mod N)-th registered type."""
    missing = set(instructions.INSTRUCTIONS) ^ set(SAMPLERS)
    if missing:
        raise RuntimeError(f"instructions without a sampler (or samplers without an instruction): {sorted(missing)}")
    rng = random.Random(seed)
    ids = list(SAMPLERS)
    return [build_task(rng, key, ids[(7 * key) % len(ids)]) for key in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the one random generator (default 0)")
    parser.add_argument("--num-examples", type=int, default=5, help="rows of example.jsonl (default 5)")
    parser.add_argument("--num-tasks", type=int, default=60, help="rows of train.jsonl (default 60)")
    parser.add_argument("--out-dir", type=Path, default=HERE / "data", help="folder of example.jsonl and train.jsonl")
    args = parser.parse_args(argv)
    rows = build_tasks(args.seed, args.num_examples + args.num_tasks)
    write_jsonl(args.out_dir / "example.jsonl", rows[: args.num_examples])
    write_jsonl(args.out_dir / "train.jsonl", rows[args.num_examples :])
    print(
        f"wrote {args.num_examples} rows to {args.out_dir / 'example.jsonl'} and {args.num_tasks} to"
        f" {args.out_dir / 'train.jsonl'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
