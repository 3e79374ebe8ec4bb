"""`ruler_score_group`: score a group's trajectories relative to each other with one judge call (ART's RULER).

An adapter around the llm_judge environment's group judge (`resources_servers/llm_judge/group_judge.py`:
prompt, rubric, JSON output schema and its parser), called directly through an OpenAI client instead of its
`/verify_group` route. As there: the messages shared by all trajectories are sent once, identical
trajectories are sent once and get the same score, a reply that is not valid scores JSON is asked again
(`max_attempts` calls in all), and the judge's output can be constrained to the scores schema
(`response_format`, which vllm_model and OpenAI honour).

The returned group is a copy whose rewards are the judge's scores in [0, 1]; each trajectory keeps its
previous reward in `metrics["independent_reward"]` and gets `metrics["ruler_score"]` (as ART does).
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

from openai import AsyncOpenAI

from nemo_gym.art.model import Model
from nemo_gym.art.trajectories import Trajectory, TrajectoryGroup
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.serving.module_loading import import_file

__all__ = ["RulerError", "judge_messages", "ruler_score_group"]

GROUP_JUDGE_FILE = REPO_ROOT / "resources_servers" / "llm_judge" / "group_judge.py"


class RulerError(RuntimeError):
    """The judge gave no valid scores in `max_attempts` replies."""


def group_judge() -> ModuleType:
    """The llm_judge environment's `group_judge` module (server folders are not packages: import by path)."""
    return import_file(GROUP_JUDGE_FILE)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict) and isinstance(p.get("text"), str))


def judge_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The trajectory as the group judge reads it: role and text; tool calls with name and arguments; tool outputs.

    Same reduced shape as `group_judge.trajectory_messages` gives for Responses items; token ids are dropped.
    """
    reduced: list[dict[str, Any]] = []
    for message in trajectory.messages():
        role = str(message.get("role", "assistant"))
        if role == "tool":
            reduced.append({"role": "tool", "content": _text(message.get("content"))})
            continue
        text = _text(message.get("content"))
        calls = (message.get("tool_calls") or []) if role == "assistant" else []
        if text or not calls:
            reduced.append({"role": role, "content": text})
        for call in calls:
            function = call.get("function") or {}
            reduced.append(
                {
                    "role": "assistant",
                    "tool_call": {"name": function.get("name"), "arguments": function.get("arguments")},
                }
            )
    return reduced


def _response_format(judge: ModuleType, num_trajectories: int) -> dict[str, Any]:
    """The group judge's Responses `text.format` as a Chat Completions `response_format`."""
    schema = judge.scores_text_format(num_trajectories)["format"]
    return {"type": "json_schema", "json_schema": {"name": schema["name"], "schema": schema["schema"], "strict": True}}


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str | Model,
    *,
    judge_client: AsyncOpenAI | None = None,
    rubric: str | None = None,
    reference: str | None = None,
    constrain_output: bool = True,
    max_attempts: int = 2,
    create_params: dict[str, Any] | None = None,
    swallow_exceptions: bool = False,
) -> TrajectoryGroup | None:
    """Score the group's trajectories relative to each other in [0, 1] with one judge call.

    Args:
        group: the trajectories of one task.
        judge_model: a `Model` (or `TrainableModel`: the policy judging itself), or a model name served by
            `judge_client`.
        judge_client: the client for a model name (default `openai.AsyncOpenAI()`: OPENAI_BASE_URL / OPENAI_API_KEY).
        rubric: the grading rubric (default: the group judge's `DEFAULT_RUBRIC`).
        reference: a reference answer shown to the judge, if the task has one.
        constrain_output: ask for structured output (the scores JSON schema).
        max_attempts: judge calls when a reply is not valid scores JSON.
        create_params: extra `chat.completions.create` fields (default: temperature 0, max_tokens 1024).
        swallow_exceptions: return None instead of raising when the judge fails.

    Returns:
        A new group with the scores as rewards (module docstring); the group itself when it is empty.

    Raises:
        RulerError: no valid scores in `max_attempts` replies.
        openai.OpenAIError: the judge could not be called.
    """
    if len(group) == 0:
        return group
    judge = group_judge()
    try:
        scores = await _scores(
            judge, group, judge_model, judge_client, rubric, reference, constrain_output, max_attempts, create_params
        )
    except Exception:
        if swallow_exceptions:
            return None
        raise
    trajectories = []
    for trajectory, score in zip(group, scores):
        metrics = {**trajectory.metrics, "independent_reward": trajectory.reward, "ruler_score": score}
        trajectories.append(trajectory.model_copy(update={"reward": score, "metrics": metrics}))
    return TrajectoryGroup(trajectories, metadata=dict(group.metadata), exceptions=list(group.exceptions))


async def _scores(
    judge: ModuleType,
    group: TrajectoryGroup,
    judge_model: str | Model,
    judge_client: AsyncOpenAI | None,
    rubric: str | None,
    reference: str | None,
    constrain_output: bool,
    max_attempts: int,
    create_params: dict[str, Any] | None,
) -> list[float]:
    """One score per trajectory, in order (identical trajectories are judged once)."""
    conversations = [judge_messages(t) for t in group]
    length = judge.shared_prefix_length(conversations)
    suffixes = [json.dumps(c[length:], ensure_ascii=False, sort_keys=True) for c in conversations]
    distinct = list(dict.fromkeys(suffixes))
    messages = judge.render_group_prompt(rubric or judge.DEFAULT_RUBRIC, conversations[0][:length], distinct, reference)
    if isinstance(judge_model, Model):
        client, model_name = judge_model.openai_client(), judge_model.inference_model_name
    else:
        client, model_name = judge_client or AsyncOpenAI(), judge_model
    params: dict[str, Any] = {"temperature": 0.0, "max_tokens": 1024, **(create_params or {})}
    if constrain_output:
        params["response_format"] = _response_format(judge, len(distinct))
    problem = ""
    for _ in range(max_attempts):
        completion = await client.chat.completions.create(model=model_name, messages=messages, **params)
        text = (completion.choices[0].message.content or "") if completion.choices else ""
        try:
            parsed = judge.parse_group_scores(text, len(distinct))
        except ValueError as exc:
            cut = completion.choices and completion.choices[0].finish_reason == "length"
            hint = f" (the reply was cut at max_tokens={params.get('max_tokens')}: raise it)" if cut else ""
            problem = f"{exc}{hint}; reply: {text[:300]!r}"
            continue
        by_suffix = {suffix: s.score for suffix, s in zip(distinct, parsed)}
        return [by_suffix[s] for s in suffixes]
    raise RulerError(f"judge {model_name!r}: no valid scores in {max_attempts} replies: {problem}")
