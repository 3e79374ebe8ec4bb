"""Write the bundled llm_judge tasks: `python resources_servers/llm_judge/generate_data.py`.

Writes `data/llm_judge_tasks.jsonl` (60 short questions) and `data/example.jsonl` (5 of them, one per
topic) from the table below, in table order: running it again gives byte-identical files. Each question has
answers people write in several ways (Shakespeare / William Shakespeare, 100 °C / one hundred degrees
Celsius, H2O / water, the Pacific / the Pacific Ocean), which string matching misses and a judge accepts.
Facts and wording written for this project (Apache 2.0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
INSTRUCTION = "Answer in one short sentence."

# (topic, question, expected answer)
FACTS: list[tuple[str, str, str]] = [
    ("geography", "What is the largest ocean on Earth?", "The Pacific Ocean"),
    ("geography", "What is the longest river in South America?", "The Amazon River"),
    ("geography", "Which continent is Egypt in?", "Africa"),
    ("geography", "What is the capital city of Japan?", "Tokyo"),
    ("geography", "Which country has the largest population in South America?", "Brazil"),
    ("geography", "What is the highest mountain above sea level?", "Mount Everest"),
    ("geography", "Which desert is the largest hot desert in the world?", "The Sahara"),
    ("geography", "What is the capital of Australia?", "Canberra"),
    ("geography", "Which ocean lies between Africa and Australia?", "The Indian Ocean"),
    ("geography", "What is the smallest country in the world by area?", "Vatican City"),
    ("geography", "Which river flows through Paris?", "The Seine"),
    ("geography", "On which continent is the Atacama Desert?", "South America"),
    ("science", "What is the chemical formula of water?", "H2O"),
    ("science", "At what temperature does water boil at sea level, in Celsius?", "100 degrees Celsius"),
    ("science", "What gas do plants take in from the air for photosynthesis?", "Carbon dioxide (CO2)"),
    ("science", "What is the closest star to the Earth?", "The Sun"),
    ("science", "Which planet is known as the Red Planet?", "Mars"),
    ("science", "What is the largest planet in the solar system?", "Jupiter"),
    ("science", "What part of the cell contains its genetic material in plants and animals?", "The nucleus"),
    ("science", "What force keeps the planets in orbit around the Sun?", "Gravity"),
    ("science", "What is the hardest natural substance?", "Diamond"),
    ("science", "How many bones does an adult human body have?", "206"),
    ("science", "What is the chemical symbol for gold?", "Au"),
    ("science", "What is the speed of light in a vacuum, approximately?", "About 300,000 kilometres per second"),
    ("history", "Who was the first person to walk on the Moon?", "Neil Armstrong"),
    ("history", "In which year did the Second World War end?", "1945"),
    ("history", "Who was the first President of the United States?", "George Washington"),
    ("history", "Which ancient civilisation built the pyramids of Giza?", "The ancient Egyptians"),
    ("history", "In which year did the Berlin Wall fall?", "1989"),
    ("history", "Which ship sank on its first voyage in April 1912 after hitting an iceberg?", "The Titanic"),
    ("history", "Who painted the Mona Lisa?", "Leonardo da Vinci"),
    ("history", "Which empire was ruled by Julius Caesar's successors from Rome?", "The Roman Empire"),
    ("history", "Who developed the theory of general relativity?", "Albert Einstein"),
    ("history", "In which century did the French Revolution begin?", "The 18th century"),
    ("history", "Who invented the telephone, according to most accounts?", "Alexander Graham Bell"),
    ("history", "Which country gave the Statue of Liberty to the United States?", "France"),
    ("literature", "Who wrote Romeo and Juliet?", "William Shakespeare"),
    ("literature", "Who wrote the novel Nineteen Eighty-Four?", "George Orwell"),
    ("literature", "In which language was Don Quixote first written?", "Spanish"),
    ("literature", "Who is the author of Pride and Prejudice?", "Jane Austen"),
    ("literature", "What is the name of Sherlock Holmes's friend who narrates most of his stories?", "Dr John Watson"),
    ("literature", "Who wrote The Odyssey, according to tradition?", "Homer"),
    ("literature", "What kind of animal is Moby-Dick?", "A sperm whale"),
    ("literature", "Who wrote the play Hamlet?", "William Shakespeare"),
    ("literature", "Which author created Harry Potter?", "J. K. Rowling"),
    (
        "literature",
        "In The Lord of the Rings, what is the name of the hobbit who carries the ring to Mordor?",
        "Frodo Baggins",
    ),
    ("literature", "Who wrote War and Peace?", "Leo Tolstoy"),
    ("literature", "What is the first book of the Bible?", "Genesis"),
    ("everyday", "How many days are there in a leap year?", "366"),
    ("everyday", "How many minutes are there in an hour and a half?", "90 minutes"),
    ("everyday", "What colour do you get by mixing blue and yellow paint?", "Green"),
    ("everyday", "How many sides does a hexagon have?", "Six"),
    ("everyday", "What is the freezing point of water in Fahrenheit?", "32 degrees Fahrenheit"),
    ("everyday", "How many continents are there on Earth, in the usual count?", "Seven"),
    ("everyday", "What is half of one hundred?", "Fifty"),
    ("everyday", "Which month comes after March?", "April"),
    ("everyday", "How many hours are there in two days?", "48 hours"),
    ("everyday", "What is the plural of mouse, the animal?", "Mice"),
    ("everyday", "How many legs does a spider have?", "Eight"),
    ("everyday", "What is the main ingredient of guacamole?", "Avocado"),
]


def task_row(index: int, topic: str, question: str, expected: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"{question} {INSTRUCTION}"}]},
        "question": question,
        "expected_answer": expected,
        "task_id": f"{topic}-{index}",
    }


def all_rows() -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    rows = []
    for topic, question, expected in FACTS:
        counts[topic] = counts.get(topic, -1) + 1
        rows.append(task_row(counts[topic], topic, question, expected))
    return rows


def example_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first task of each of the five topics."""
    firsts: dict[str, dict[str, Any]] = {}
    for row in rows:
        firsts.setdefault(row["task_id"].split("-")[0], row)
    return list(firsts.values())


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    rows = all_rows()
    write(DATA_DIR / "llm_judge_tasks.jsonl", rows)
    write(DATA_DIR / "example.jsonl", example_rows(rows))


if __name__ == "__main__":
    main()
