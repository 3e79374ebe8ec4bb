"""Pointwise answer-equivalence judging: the prompt, the call to the judge model server, the verdict.

The judge is any model server of the run (`POST /v1/responses`). Its reply is searched for the equal and
the not-equal label (regexes, `[[A=B]]` / `[[A!=B]]` by default, as NeMo Gym's equivalence_llm_judge asks
for); when both occur, the last one wins (a judge that reasons first often quotes both labels). A reply with
neither is asked again, up to `max_attempts` calls, then the rollout fails with `JudgeVerdictError`.
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym.common.errors import ServerError
from nemo_gym.serving.client import ServerClient

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "DEFAULT_EQUAL_REGEX",
    "DEFAULT_NOT_EQUAL_REGEX",
    "JudgeVerdictError",
    "DEFAULT_VERDICT_LABELS",
    "verdict_text_format",
    "render_prompt",
    "parse_verdict",
    "output_text",
    "ask_judge",
    "judge_equivalence",
]

DEFAULT_EQUAL_REGEX = r"\[\[A=B\]\]"
DEFAULT_NOT_EQUAL_REGEX = r"\[\[A!=B\]\]"
DEFAULT_VERDICT_LABELS = ("[[A=B]]", "[[A!=B]]")
PLACEHOLDERS = ("{question}", "{expected_answer}", "{generated_answer}")
DEFAULT_PROMPT_TEMPLATE = """\
Decide whether two answers to the same question mean the same thing.

<question>
{question}
</question>

<answer_a>
{expected_answer}
</answer_a>

<answer_b>
{generated_answer}
</answer_b>

Answer A is the reference. The answers are equivalent when a person who knows the subject would accept \
answer B as giving the same answer as A to this question: ignore wording, word order, capitalisation, \
abbreviations, spelled-out or written numbers, equivalent units and extra explanation that does not \
contradict A. They are not equivalent when B gives a different answer, several candidate answers, only \
part of what A says, or no answer.

Think briefly, then end your reply with exactly one verdict: [[A=B]] if they are equivalent, [[A!=B]] if not."""


class JudgeVerdictError(ServerError):
    """The judge model answered, but no reply had a verdict (or valid scores) after the allowed attempts."""

    failure_class = "judge_unparsable"


def render_prompt(template: str, question: str, expected_answer: str, generated_answer: str) -> str:
    """`template` with `{question}`, `{expected_answer}`, `{generated_answer}` replaced.

    Plain replacement, not `str.format`: a template may contain other braces (JSON examples, LaTeX)."""
    values = dict(zip(PLACEHOLDERS, (question, expected_answer, generated_answer)))
    return re.sub("|".join(map(re.escape, PLACEHOLDERS)), lambda m: values[m.group(0)], template)


def verdict_text_format(labels: tuple[str, str] | list[str]) -> dict[str, Any]:
    """A Responses `text` field that constrains the judge's reply to `{"verdict": <one of labels>}`.

    A model server that honours structured output (vllm_model: vLLM structured outputs; OpenAI: strict JSON
    schema) then always writes a parsable verdict, which small judges otherwise rarely do."""
    schema = {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": list(labels)}},
        "required": ["verdict"],
        "additionalProperties": False,
    }
    return {"format": {"type": "json_schema", "name": "verdict", "strict": True, "schema": schema}}


def parse_verdict(text: str, equal_regex: str, not_equal_regex: str) -> bool | None:
    """True (equal), False (not equal) or None (no label) from a judge reply; the last label found wins."""
    last: tuple[int, bool] | None = None
    for pattern, verdict in ((equal_regex, True), (not_equal_regex, False)):
        for match in re.finditer(pattern, text):
            if last is None or match.start() > last[0]:
                last = (match.start(), verdict)
    return None if last is None else last[1]


def output_text(response: Any) -> str:
    """The text of the last assistant message with text in the judge model's reply, a Responses `Response`
    dict ('' when none).

    Read more leniently than a policy's trajectory (`nemo_gym.env.trajectory.Trajectory.final_text`): an item
    without `type`, a string `content` and text parts of any type count too, so that a judge server that
    answers in a looser shape still gives a verdict."""
    output = response.get("output") if isinstance(response, dict) else None
    for item in reversed(output if isinstance(output, list) else []):
        if (
            not isinstance(item, dict)
            or item.get("type", "message") != "message"
            or item.get("role", "assistant") != "assistant"
        ):
            continue
        content = item.get("content")
        if isinstance(content, str):
            text = content
        else:
            parts = content if isinstance(content, list) else []
            text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
        if text.strip():
            return text
    return ""


async def ask_judge(
    client: ServerClient, judge: str, messages: list[dict[str, str]], create_params: dict[str, Any]
) -> str:
    """One call of model server `judge` (`POST /v1/responses`); returns its reply text.

    Raises:
        ServerError: the client's typed errors (unreachable, timeout, HTTP error status).
    """
    body = {**create_params, "input": messages}
    return output_text(await client.post(judge, "/v1/responses", body))


async def judge_equivalence(
    client: ServerClient,
    judge: str,
    messages: list[dict[str, str]],
    *,
    create_params: dict[str, Any],
    equal_regex: str,
    not_equal_regex: str,
    max_attempts: int,
) -> tuple[bool, str]:
    """Ask `judge` until a reply has a verdict: `(equal, reply text)`.

    Raises:
        JudgeVerdictError: `max_attempts` replies without a label.
        ServerError: the judge could not be called (see `ask_judge`).
    """
    text = ""
    for _ in range(max_attempts):
        text = await ask_judge(client, judge, messages, create_params)
        verdict = parse_verdict(text, equal_regex, not_equal_regex)
        if verdict is not None:
            return verdict, text
    raise JudgeVerdictError(
        f"judge {judge!r} gave no verdict ({equal_regex} or {not_equal_regex}) in {max_attempts} replies; last reply:"
        f" {text[:500]!r}",
        server=judge,
        path="/v1/responses",
    )
