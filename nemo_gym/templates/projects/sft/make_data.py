"""Writes data/train.jsonl (48 conversations) and data/validation.jsonl (8): deterministic, no download.

Arithmetic with a worked answer; every fourth conversation calls the `add` tool (OpenAI chat format: the call's
`arguments` is a JSON string, then a `tool` message with the result) before answering. Run: python make_data.py
"""

import json
from pathlib import Path

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def conversation(index: int) -> dict:
    a, b = 3 + (index * 7) % 40, 2 + (index * 11) % 30
    question = {"role": "user", "content": f"What is {a} + {b}?"}
    if index % 4 == 3:
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})},
        }
        return {
            "messages": [
                question,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{index}", "content": str(a + b)},
                {"role": "assistant", "content": f"{a} + {b} = {a + b}."},
            ],
            "tools": [ADD_TOOL],
        }
    return {"messages": [question, {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    write(here / "data" / "train.jsonl", [conversation(i) for i in range(48)])
    write(here / "data" / "validation.jsonl", [conversation(i) for i in range(100, 108)])
