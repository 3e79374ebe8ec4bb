"""vf_reverse_text: a small environment package written against verifiers' classic `load_environment()` API.

It is what `prime env init` scaffolds, reduced: `load_environment(**args)` returns a single-turn environment
with a dataset of `question` / `answer` rows, a system prompt and a rubric of one reward function. Reward:
how close the answer is to the reversed text (difflib's similarity ratio, in [0, 1]).

`verifiers` itself is not a dependency: `_classic.py` holds the few classes of its classic API this package
uses (`Parser`, `Rubric`, `SingleTurnEnv`), with the same constructor arguments and methods, so the package
runs where verifiers cannot be installed (verifiers 0.1 pins datasets and huggingface-hub versions that
conflict with this project's; 0.4 dropped the classic API). With verifiers installed, replace the import by
`import verifiers as vf` and use `vf.Parser`, `vf.Rubric`, `vf.SingleTurnEnv`: nothing else changes.
"""

from __future__ import annotations

import difflib
import random

from ._classic import Parser, Rubric, SingleTurnEnv

__all__ = ["load_environment"]

SYSTEM_PROMPT = "Reverse the text you are given, character by character. Answer with the reversed text only."
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "table",
    "light",
    "music",
    "ocean",
    "tiger",
    "paper",
    "house",
    "bread",
    "chair",
    "dream",
    "earth",
    "flame",
    "grape",
    "heart",
    "lemon",
    "mouse",
    "night",
    "plant",
    "queen",
    "sugar",
    "train",
    "water",
    "youth",
    "zebra",
    "honey",
]


def lcs_reward(completion, answer, parser) -> float:
    """Similarity of the parsed answer to the reversed text, in [0, 1] (1.0: exact)."""
    guess = (parser.parse_answer(completion) or "").strip()
    return difflib.SequenceMatcher(None, guess, answer).ratio()


def load_environment(
    num_train_examples: int = 24, num_eval_examples: int = 6, seed: int = 0, system_prompt: str = SYSTEM_PROMPT
) -> SingleTurnEnv:
    """Texts of two words from a fixed list; the first `num_train_examples` rows train, the next evaluate."""
    rng = random.Random(seed)
    texts = [f"{rng.choice(WORDS)} {rng.choice(WORDS)}" for _ in range(num_train_examples + num_eval_examples)]
    rows = [
        {"question": f"Reverse this text: {text}", "answer": text[::-1], "task": "reverse-text", "info": {"text": text}}
        for text in texts
    ]
    parser = Parser()
    return SingleTurnEnv(
        dataset=rows[:num_train_examples],
        eval_dataset=rows[num_train_examples:],
        system_prompt=system_prompt,
        parser=parser,
        rubric=Rubric(funcs=[lcs_reward], weights=[1.0], parser=parser),
    )
