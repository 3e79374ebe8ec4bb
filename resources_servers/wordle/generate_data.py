"""Generate Wordle's bundled data, deterministically.

    python resources_servers/wordle/generate_data.py               # data/tasks.jsonl + data/example.jsonl (stdlib only)
    python resources_servers/wordle/generate_data.py --word-lists # first rebuild the word lists (needs the packages
    below)

Word lists (`--word-lists`; `pip install wordfreq==3.1.1 english-words==2.0.2`):
- `data/target_words.txt`: the 1,000 most frequent English 5-letter words (wordfreq's `top_n_list("en")`) that are
  lower-case headwords of Webster's Second (english-words' `web2`, so no proper nouns), minus plurals and
  past forms (`-s` not `-ss`/`-us`/`-is`; `-ed` not `-eed`) and a small blocklist (slurs, vulgar words, names).
- `data/allowed_words.txt`: accepted guesses: the targets, every 5-letter word among wordfreq's 60,000 most
  frequent English words, and every lower-case 5-letter `web2` headword.

Tasks: `data/tasks.jsonl` holds 100 target words drawn with `random.Random(20250301)` from the targets;
`data/example.jsonl` holds the first 5 of them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
NUM_TARGETS = 1000
NUM_TASKS = 100
SEED = 20250301
BLOCKLIST = {  # slurs, vulgar or charged words, contractions without apostrophes, brands
    "penis",
    "negro",
    "nigga",
    "bitch",
    "whore",
    "pussy",
    "dildo",
    "horny",
    "sperm",
    "porno",
    "boobs",
    "titty",
    "moron",
    "faggy",
    "singh",
    "pedro",
    "chang",
    "blair",
    "chile",
    "allah",
    "jesus",
    "kinky",
    "booty",
    "semen",
    "crack",
    "vodka",
    "weedy",
    "tramp",
    "wench",
    "idiot",
    "dummy",
    "loser",
    "dumbo",
    "nazis",
    "islam",
    "bible",
    "satan",
    "demon",
    "rapes",
    "raped",
    "inter",
    "queer",
    "lynch",
    "slave",
    "didnt",
    "wasnt",
    "covid",
    "yahoo",
    "honda",
}
# Given names and surnames that web2 also lists as lower-case words (jimmy, kelly, ...): no Wordle answer is one.
NAMES = set(
    "trump china japan smith peter frank henry harry lewis jimmy kelly roger clark maria billy larry barry jerry laura "
    "terry bobby perry blake tommy costa nancy ralph colin betty marco randy riley homer jenny burke walsh donna cyrus "
    "pablo silva irene brent brett kerry allan sally welsh brock monte stein".split()
)
RULES = (
    "Let's play Wordle. Guess the secret 5-letter English word in at most 6 guesses. "
    "After each guess you get one feedback mark per letter: G = right letter in the right spot, "
    "Y = the letter is in the word but in another spot, _ = the letter is not in the word (or not that many times). "
    "Each guess must be a real 5-letter English word. Think briefly, then end your reply with your guess "
    "in capital letters, for example: CRANE"
)


def build_word_lists() -> tuple[list[str], list[str]]:
    """(targets in frequency order, allowed guesses sorted). Needs wordfreq and english-words."""
    from english_words import get_english_words_set
    from wordfreq import top_n_list

    web2 = {
        w
        for w in get_english_words_set(["web2"], lower=False, alpha=True)
        if len(w) == 5 and w.islower() and w.isascii()
    }
    frequent = [w for w in top_n_list("en", 60000) if len(w) == 5 and w.isascii() and w.isalpha() and w.islower()]

    def is_target(word: str) -> bool:
        plural = word.endswith("s") and not word.endswith(("ss", "us", "is"))
        past = word.endswith("ed") and not word.endswith("eed")
        return word in web2 and not plural and not past and word not in BLOCKLIST | NAMES

    targets = [w for w in frequent if is_target(w)][:NUM_TARGETS]
    allowed = sorted(set(frequent) | web2 | set(targets))
    return targets, allowed


def task_rows(targets: list[str]) -> list[dict]:
    """One dataset row per drawn target word: the rules as the system prompt, the target as the task field."""
    words = random.Random(SEED).sample(targets, NUM_TASKS)
    return [
        {
            "responses_create_params": {"input": [{"role": "system", "content": RULES}]},
            "target_word": word,
            "task_id": f"wordle-{i:03d}",
        }
        for i, word in enumerate(words)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--word-lists", action="store_true", help="rebuild data/target_words.txt and data/allowed_words.txt first"
    )
    args = parser.parse_args()
    if args.word_lists:
        targets, allowed = build_word_lists()
        (DATA / "target_words.txt").write_text("\n".join(targets) + "\n")
        (DATA / "allowed_words.txt").write_text("\n".join(allowed) + "\n")
    targets = (DATA / "target_words.txt").read_text().split()
    rows = task_rows(targets)
    write_jsonl(DATA / "tasks.jsonl", rows)
    write_jsonl(DATA / "example.jsonl", rows[:5])
    print(f"{len(targets)} targets; wrote {len(rows)} tasks and 5 examples to {DATA}")


if __name__ == "__main__":
    main()
