"""llm_judge: answer equivalence judged by a model server of the run, and a RULER-style group judge.

`/verify` asks the judge model server (`judge_model_server`, the policy itself by default) whether the
final answer means the same as `expected_answer` (prompt and verdict regexes configurable, optional
position-swap check; `judge.py`). `POST /verify_group` scores all rollouts of one task in one judge call,
relative to each other (`group_judge.py`); `ng_group_verify` applies it to a rollouts file.
A judge that cannot be reached, answers an HTTP error or gives no verdict is a failure (a typed 502 the
collector writes to the failures file), never reward 0.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nemo_gym.env.answers import strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import ServerConfig, ServerRef, Session

from . import group_judge as group
from . import judge


class JudgeRequest(VerifyRequest):
    """A `/verify` body: the row's task fields plus the rollout's `response`."""

    expected_answer: str = Field(min_length=1, description="the reference answer")
    question: str | None = Field(
        None, description="the question shown to the judge (default: the last user message of the prompt)"
    )


class GroupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, Any]] = Field(
        min_length=1, description="verify bodies (row + response) of rollouts of ONE task"
    )


class LLMJudgeConfig(ServerConfig):
    judge_model_server: ServerRef = Field(
        ServerRef(type="responses_api_models", name="policy_model"),
        description="model server that judges (any of the run's)",
    )
    judge_responses_create_params: dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 0.0, "max_output_tokens": 1024},
        description="fields of each judge call's Responses create body (input is set by the server)",
    )
    judge_system_message: str | None = Field(
        None, description="system message of the pointwise judge call (none when null)"
    )
    judge_prompt_template: str = Field(
        judge.DEFAULT_PROMPT_TEMPLATE,
        description="user message; {question}, {expected_answer}, {generated_answer} are filled in",
    )
    judge_equal_regex: str = Field(
        judge.DEFAULT_EQUAL_REGEX, description="regex of the 'equivalent' label in the judge's reply"
    )
    judge_not_equal_regex: str = Field(judge.DEFAULT_NOT_EQUAL_REGEX, description="regex of the 'not equivalent' label")
    constrain_judge_output: bool = Field(
        False,
        description=(
            "ask the judge for structured output (a JSON verdict from judge_verdict_labels; group scores as JSON) so"
            " that small judges always answer in form; the judge model server must support it (vllm_model, OpenAI)"
        ),
    )
    judge_verdict_labels: tuple[str, str] = Field(
        judge.DEFAULT_VERDICT_LABELS,
        description="[equal, not equal] labels offered to a constrained judge; each must match its regex",
    )
    max_judge_attempts: int = Field(
        2, ge=1, le=10, description="judge calls per verdict when replies have no label; then the rollout fails"
    )
    check_twice_swap: bool = Field(
        False, description="after an 'equal' verdict, judge again with the two answers swapped; both must agree"
    )
    reward_if_swap_fails: float = Field(0.0, ge=0.0, le=1.0, description="reward when the swapped call disagrees")
    skip_judge_on_exact_match: bool = Field(
        True,
        description=(
            "reward 1 without a judge call when the answer equals the reference (case, spaces, final period ignored)"
        ),
    )
    answer_regex: str | None = Field(
        None,
        description=(
            "regex whose last match (group 1 if any) is the answer in the final message; null: the whole message"
        ),
    )
    max_answer_chars: int = Field(2000, gt=0, description="longest answer judged; longer scores 0 (too_long)")
    group_rubric: str = Field(group.DEFAULT_RUBRIC, description="rubric of the group judge (/verify_group)")
    group_max_attempts: int = Field(
        2, ge=1, le=10, description="group judge calls when the reply is not valid scores JSON; then the group fails"
    )
    group_cache_size: int = Field(
        1024, ge=0, description="groups kept in the in-memory LRU cache of group scores (0: no cache)"
    )
    max_group_size: int = Field(64, ge=1, description="most rollouts in one /verify_group request")

    @field_validator("judge_equal_regex", "judge_not_equal_regex", "answer_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)  # re.error is a ValueError: pydantic reports it on the field
        return value

    @model_validator(mode="after")
    def _labels_match_regexes(self) -> LLMJudgeConfig:
        if not self.constrain_judge_output:
            return self
        equal, not_equal = self.judge_verdict_labels
        verdicts = [
            judge.parse_verdict(label, self.judge_equal_regex, self.judge_not_equal_regex)
            for label in (equal, not_equal)
        ]
        if verdicts != [True, False]:
            raise ValueError(
                f"judge_verdict_labels {list(self.judge_verdict_labels)!r} must match judge_equal_regex and"
                " judge_not_equal_regex (in that order)"
            )
        return self

    @field_validator("judge_prompt_template")
    @classmethod
    def _has_answers(cls, value: str) -> str:
        missing = [p for p in ("{expected_answer}", "{generated_answer}") if p not in value]
        if missing:
            raise ValueError(f"the template must contain {' and '.join(missing)}")
        return value


def normalized(text: str) -> str:
    """Case-folded, NFKC, whitespace collapsed, one final period removed: for the exact-match shortcut."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).removesuffix(".").strip()


def last_user_text(responses_create_params: dict[str, Any]) -> str:
    given = responses_create_params.get("input")
    if isinstance(given, str):
        return given
    users = [m for m in given or [] if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return (
        content
        if isinstance(content, str)
        else "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    )


class LLMJudgeServer(ResourcesServer):
    """Answers judged equivalent to the reference by a model server. Reward [0.0, 1.0] (binary unless
    `reward_if_swap_fails` is set; /verify_group gives graded relative scores in [0, 1])."""

    Config = LLMJudgeConfig
    config: LLMJudgeConfig
    verify_request_type = JudgeRequest

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.group_cache = group.GroupCache(self.config.group_cache_size)

    @property
    def judge_name(self) -> str:
        return self.config.judge_model_server.name

    def judge_create_params(self, text_format: dict[str, Any]) -> dict[str, Any]:
        """`judge_responses_create_params`, with the structured-output `text_format` when `constrain_judge_output`."""
        params = dict(self.config.judge_responses_create_params)
        if self.config.constrain_judge_output:
            params["text"] = text_format
        return params

    def extract_answer(self, response: dict[str, Any]) -> str:
        """The answer in the final assistant message (`Trajectory.final_text`, `<think>` blocks dropped, then
        `answer_regex`); '' if none."""
        text = strip_thinking(
            Trajectory.of(response).final_text
        ).strip()  # linear in the text, however many `<think>` it opens
        if self.config.answer_regex is None or not text:
            return text
        matches = list(re.finditer(self.config.answer_regex, text))
        if not matches:
            return ""
        last = matches[-1]
        return (last.group(1) if last.re.groups else last.group(0)).strip()

    async def judge_once(self, question: str, expected: str, generated: str) -> tuple[bool, str]:
        """One verdict (`(equal, reply)`); see `judge.judge_equivalence` for the errors raised."""
        prompt = judge.render_prompt(self.config.judge_prompt_template, question, expected, generated)
        system = (
            [{"role": "system", "content": self.config.judge_system_message}]
            if self.config.judge_system_message
            else []
        )
        return await judge.judge_equivalence(
            self.client,
            self.judge_name,
            system + [{"role": "user", "content": prompt}],
            create_params=self.judge_create_params(judge.verdict_text_format(self.config.judge_verdict_labels)),
            equal_regex=self.config.judge_equal_regex,
            not_equal_regex=self.config.judge_not_equal_regex,
            max_attempts=self.config.max_judge_attempts,
        )

    async def verify(self, request: JudgeRequest, session: Session) -> VerifyResult:
        """1.0 when the judge says the answer equals the reference, else 0.0 with a `failure_reason`.

        Raises:
            ServerError: the judge is unreachable, answers an HTTP error, or gives no verdict (typed 502).
        """
        answer = self.extract_answer(request.response)
        fields: dict[str, Any] = {
            "extracted_answer": answer,
            "judge_verdict": None,
            "judge_swap_verdict": None,
            "judge_replies": [],
        }
        if not answer:
            return VerifyResult(reward=0.0, failure_reason="no_answer", **fields)
        if len(answer) > self.config.max_answer_chars:
            return VerifyResult(reward=0.0, failure_reason="too_long", **fields)
        if self.config.skip_judge_on_exact_match and normalized(answer) == normalized(request.expected_answer):
            return VerifyResult(reward=1.0, failure_reason=None, **{**fields, "judge_verdict": "exact_match"})
        question = request.question or last_user_text(request.responses_create_params)
        equal, reply = await self.judge_once(question, request.expected_answer, answer)
        fields.update(judge_verdict="equal" if equal else "not_equal", judge_replies=[reply])
        if not equal:
            return VerifyResult(reward=0.0, failure_reason="judged_not_equal", **fields)
        if self.config.check_twice_swap:
            swapped_equal, swapped_reply = await self.judge_once(question, answer, request.expected_answer)
            fields.update(
                judge_swap_verdict="equal" if swapped_equal else "not_equal", judge_replies=[reply, swapped_reply]
            )
            if not swapped_equal:
                return VerifyResult(reward=self.config.reward_if_swap_fails, failure_reason="swap_disagrees", **fields)
        return VerifyResult(reward=1.0, failure_reason=None, **fields)

    async def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """The base metrics plus `failure_reasons` (count per reason) and `judge_verdicts` (count per verdict)."""
        metrics = await super().aggregate_metrics(verify_responses)
        for key, name in (("failure_reason", "failure_reasons"), ("judge_verdict", "judge_verdicts")):
            values = [r.get(key) for r in verify_responses if isinstance(r, dict) and r.get(key)]
            metrics[name] = {v: values.count(v) for v in sorted(set(map(str, values)))}
        return metrics

    # -- group judge -------------------------------------------------------------------------------
    async def verify_group(self, rows: list[JudgeRequest]) -> dict[str, Any]:
        """Scores in [0, 1] for the rollouts of one task, from one judge call (or the cache).

        Returns `{"rewards": [float per row], "explanations": [str per row], "cached": bool}`.

        Raises:
            JudgeVerdictError: `group_max_attempts` replies that are not valid scores.
            ServerError: the judge could not be called.
        """
        trajectories = [group.trajectory_messages(r.responses_create_params, r.response) for r in rows]
        length = group.shared_prefix_length(trajectories)
        prefix = trajectories[0][:length]
        suffixes = [json.dumps(t[length:], ensure_ascii=False, sort_keys=True) for t in trajectories]
        distinct = list(dict.fromkeys(suffixes))
        key = group.group_key(prefix, rows[0].expected_answer, distinct)
        scored = self.group_cache.get(key)
        cached = scored is not None
        if scored is None:
            messages = group.render_group_prompt(self.config.group_rubric, prefix, distinct, rows[0].expected_answer)
            scores = await self.judge_group(messages, len(distinct))
            scored = {suffix: (s.score, s.explanation) for suffix, s in zip(distinct, scores)}
            self.group_cache.put(key, scored)
        return {
            "rewards": [scored[s][0] for s in suffixes],
            "explanations": [scored[s][1] for s in suffixes],
            "cached": cached,
        }

    async def judge_group(self, messages: list[dict[str, str]], num_trajectories: int) -> list[Any]:
        problem = ""
        for _ in range(self.config.group_max_attempts):
            create_params = self.judge_create_params(group.scores_text_format(num_trajectories))
            text = await judge.ask_judge(self.client, self.judge_name, messages, create_params)
            try:
                return group.parse_group_scores(text, num_trajectories)
            except ValueError as exc:
                problem = f"{exc}; reply: {text[:300]!r}"
        raise judge.JudgeVerdictError(
            f"group judge {self.judge_name!r}: no valid scores in {self.config.group_max_attempts} replies: {problem}",
            server=self.judge_name,
            path="/v1/responses",
        )

    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)

        @app.post("/verify_group")
        async def verify_group(request: Request) -> Any:
            """`{"rows": [verify bodies of one task]}` → `{"rewards", "explanations", "cached"}`; 422 for bad rows."""
            try:
                body = GroupRequest.model_validate_json(await request.body() or b"{}")
                rows = [self.verify_request_type.model_validate(row) for row in body.rows]
            except ValidationError as exc:
                return JSONResponse({"detail": json.loads(exc.json(include_url=False))}, status_code=422)
            if len(rows) > self.config.max_group_size:
                return JSONResponse(
                    {"detail": f"{len(rows)} rows; at most max_group_size={self.config.max_group_size}"},
                    status_code=422,
                )
            tasks = {
                json.dumps([r.responses_create_params.get("input"), r.expected_answer], sort_keys=True) for r in rows
            }
            if len(tasks) > 1:
                return JSONResponse(
                    {
                        "detail": (
                            "rows must be rollouts of one task (same responses_create_params.input and expected_answer)"
                        )
                    },
                    status_code=422,
                )
            return await self.verify_group(rows)
