"""Writes data/train.jsonl (40 documents) and data/validation.jsonl (8), one `text` field a row: deterministic
facts about numbers, no download. Run: python make_data.py"""

import json
from pathlib import Path


def factors(n: int) -> list[int]:
    out, d = [], 2
    while n > 1:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1
    return out


def document(n: int) -> dict:
    parity = "even" if n % 2 == 0 else "odd"
    primes = " × ".join(map(str, factors(n))) or str(n)
    return {
        "text": (
            f"The number {n} is {parity}. Its prime factorisation is {n} = {primes}. "
            f"Its square is {n * n} and its double is {2 * n}. The number after it is {n + 1}."
        )
    }


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    write(here / "data" / "train.jsonl", [document(n) for n in range(2, 42)])
    write(here / "data" / "validation.jsonl", [document(n) for n in range(60, 68)])
