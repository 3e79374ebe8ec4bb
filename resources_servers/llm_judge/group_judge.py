"""Group judging in the style of OpenPipe ART's RULER: one judge call scores all rollouts of one task.

RULER (Relative Universal LLM-Elicited Rewards, ART `art.rewards.ruler`) sends the trajectories of a group
together, the messages they share sent once as context, and asks for a score in [0, 1] per trajectory,
relative to the others (GRPO only needs scores that order the group). What we do the same: shared prefix
once, a default rubric, JSON output `{"scores": [{"id", "score", "explanation"}]}` validated with pydantic.
Where we depart from it:
- identical trajectories (after the shared prefix; for single-turn tasks: identical final answers) are
  sent once and get the same score, so a group of eight with three distinct answers is a prompt of three;
- a group with the same task, reference and set of distinct trajectories is answered from an in-memory
  LRU cache (order of the rollouts does not matter);
- a bad reply (not JSON, wrong ids, a score outside [0, 1]) is asked again (`max_attempts` calls in all),
  then the group fails with `JudgeVerdictError` (a typed 502), never scores 0;
- the trajectory is the task's input messages plus the Responses `output` items, reduced to what the judge
  needs (role and text, tool calls with their arguments, tool outputs), ids and statuses dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "DEFAULT_RUBRIC",
    "TrajectoryScore",
    "GroupScores",
    "GroupCache",
    "trajectory_messages",
    "shared_prefix_length",
    "render_group_prompt",
    "parse_group_scores",
    "scores_text_format",
    "group_key",
]

DEFAULT_RUBRIC = """\
- A trajectory that reaches the task's goal scores higher than one that does not.
- When a reference answer is given, a final answer that means the same as the reference is correct, \
whatever its wording; a different answer is wrong however well written.
- Among correct trajectories, prefer the clearer and more concise ones; among wrong ones, prefer those \
closer to the goal.
- Use the whole range: the best trajectory near 1, a trajectory with no useful answer near 0."""

OUTPUT_INSTRUCTIONS = """\
You score several trajectories of an AI assistant on the same task, relative to each other, with a \
number from 0 to 1 each. Grading rubric:
{rubric}

Reply with only a JSON object, no other text: {{"scores": [{{"id": "<trajectory id>", "score": <0..1>, \
"explanation": "<one short sentence>"}}, ...]}} with exactly one entry per trajectory id."""

FENCE = re.compile(r"```(?:json)?\s*(.*?)```", flags=re.DOTALL)


class TrajectoryScore(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | int = Field(description="the trajectory id shown to the judge")
    score: float = Field(ge=0.0, le=1.0, description="relative quality, 0 (worst) to 1 (best)")
    explanation: str = Field("", description="the judge's reason, one sentence")


class GroupScores(BaseModel):
    model_config = ConfigDict(extra="ignore")
    scores: list[TrajectoryScore]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def _message(item: Any) -> dict[str, Any] | None:
    """One input or output item reduced to what the judge reads (None for items it does not need)."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type", "message")
    if kind == "message":
        return {"role": str(item.get("role", "assistant")), "content": _text(item.get("content"))}
    if kind == "function_call":
        return {"role": "assistant", "tool_call": {"name": item.get("name"), "arguments": item.get("arguments")}}
    if kind == "function_call_output":
        return {"role": "tool", "content": str(item.get("output", ""))}
    return None  # reasoning items and the like: not part of what is judged


def trajectory_messages(responses_create_params: dict[str, Any], response: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's input messages then the rollout's output items, reduced by `_message`."""
    given = responses_create_params.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given if isinstance(given, list) else []
    instructions = responses_create_params.get("instructions")
    head = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    output = response.get("output") if isinstance(response.get("output"), list) else []
    return [m for m in map(_message, head + items + output) if m is not None]


def shared_prefix_length(trajectories: list[list[dict[str, Any]]]) -> int:
    """Length of the messages all trajectories start with, leaving each at least its last message."""
    shortest = min(len(t) for t in trajectories)
    length = 0
    while length < shortest - 1 and all(t[length] == trajectories[0][length] for t in trajectories):
        length += 1
    return length


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render_group_prompt(
    rubric: str, prefix: list[dict[str, Any]], suffixes: list[str], reference: str | None
) -> list[dict[str, str]]:
    """The judge's messages: the rubric and output format (system), then the shared context once and each
    distinct trajectory (user). `suffixes[i]` is trajectory id `i + 1`, as JSON text."""
    context = f"<context>\n{_dumps(prefix)}\n</context>\n"
    if reference is not None:  # RULER needs none; our rows always have one (expected_answer)
        context += f"\n<reference_answer>\n{reference}\n</reference_answer>\n"
    blocks = "".join(
        f'\n<trajectory id="{i}">\n{suffix}\n</trajectory>\n' for i, suffix in enumerate(suffixes, start=1)
    )
    user = (
        f"All trajectories start with the messages in <context>; each <trajectory> holds the rest.\n\n{context}{blocks}"
    )
    return [{"role": "system", "content": OUTPUT_INSTRUCTIONS.format(rubric=rubric)}, {"role": "user", "content": user}]


def scores_text_format(num_trajectories: int) -> dict[str, Any]:
    """A Responses `text` field constraining the reply to `GroupScores` JSON with exactly `num_trajectories` scores
    (ids "1".."n"; explanations at most 200 characters)."""
    score = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "enum": [str(i) for i in range(1, num_trajectories + 1)]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "explanation": {"type": "string", "maxLength": 200},
        },
        "required": ["id", "score", "explanation"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {
            "scores": {"type": "array", "items": score, "minItems": num_trajectories, "maxItems": num_trajectories}
        },
        "required": ["scores"],
        "additionalProperties": False,
    }
    return {"format": {"type": "json_schema", "name": "group_scores", "strict": True, "schema": schema}}


def parse_group_scores(text: str, num_trajectories: int) -> list[TrajectoryScore]:
    """The judge's scores in trajectory order (ids "1".."n").

    Raises:
        ValueError: no JSON object, not the expected shape (pydantic), or ids not exactly 1..n.
    """
    fenced = FENCE.search(text)
    body = fenced.group(1) if fenced else text
    start, end = body.find("{"), body.rfind("}")
    if start == -1 or end < start:
        raise ValueError("the reply holds no JSON object")
    try:
        parsed = GroupScores.model_validate_json(body[start : end + 1])
    except ValidationError as exc:
        raise ValueError(
            f"the reply is not {{'scores': [...]}} with scores in [0, 1]: {exc.errors()[0]['msg']}"
        ) from exc
    by_id = {str(s.id).strip(): s for s in parsed.scores}
    expected = [str(i) for i in range(1, num_trajectories + 1)]
    if sorted(by_id) != sorted(expected) or len(parsed.scores) != num_trajectories:
        raise ValueError(f"the reply scores ids {sorted(by_id)}, expected exactly {expected}")
    return [by_id[i] for i in expected]


def group_key(prefix: list[dict[str, Any]], reference: str | None, suffixes: list[str]) -> str:
    """Cache key of a group: its task (shared prefix and reference) and its set of distinct trajectories."""
    return hashlib.sha256(_dumps([prefix, reference, sorted(set(suffixes))]).encode()).hexdigest()


class GroupCache:
    """Bounded LRU map: group key → `{trajectory text: (score, explanation)}`. `max_size` 0 disables it."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, dict[str, tuple[float, str]]] = OrderedDict()

    def get(self, key: str) -> dict[str, tuple[float, str]] | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, entry: dict[str, tuple[float, str]]) -> None:
        if self.max_size <= 0:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
