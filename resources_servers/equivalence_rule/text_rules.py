"""NeMo Gym's `equivalence_rule` grading rules: the whole reply against the reference as text.

NeMo Gym (0.4.0) has a server under the same name that compares the text of every output message, joined,
with `expected_answer` after lower-casing, trimming and collapsing whitespace, by one of three rules picked
by its config's `grading_rule`:

- `exact`: 1.0 when the two normalised texts are equal, else 0.0;
- `seq_match`: `difflib.SequenceMatcher(None, reply, reference).ratio()`, in [0, 1];
- `weighted_seq_match`: 0.85 x that ratio + 0.15 x the ratio between the reference's first 10 characters and
  as many first characters of the reply (a bonus for starting right), in [0, 1].

Ours, written from that description; `app.py` uses them when `grading_rule` is one of these names.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from typing import Literal

TextRule = Literal["exact", "seq_match", "weighted_seq_match"]
WHITESPACE = re.compile(r"\s+")
PREFIX_CHARS = 10  # weighted_seq_match's prefix
FULL_WEIGHT, PREFIX_WEIGHT = 0.85, 0.15


def normalize(text: str) -> str:
    """Lower case, outer whitespace trimmed, every run of whitespace one space."""
    return WHITESPACE.sub(" ", text.strip().lower())


def similarity(a: str, b: str) -> float:
    """difflib's ratio 2M/T: M matched characters, T the two lengths added; in [0, 1]."""
    return float(SequenceMatcher(None, a, b).ratio())


def grade(reply: str, reference: str, rule: TextRule) -> float:
    """The score of `reply` against `reference` under `rule` (module docstring). Range [0, 1]."""
    reply, reference = normalize(reply), normalize(reference)
    if rule == "exact":
        return float(reply == reference)
    if rule == "seq_match":
        return similarity(reply, reference)
    prefix = reference[:PREFIX_CHARS]
    score = FULL_WEIGHT * similarity(reply, reference) + PREFIX_WEIGHT * similarity(reply[: len(prefix)], prefix)
    return min(max(score, 0.0), 1.0)
