"""The classes of verifiers' classic API (0.1.x) that vf_reverse_text uses, with the same interface.

- `Parser.parse_answer(completion)`: the text of the last assistant message (or the completion string).
- `Rubric(funcs, weights, parser)`: `await score_rollout(prompt, completion, answer, state, task, info)` calls
  each reward function with the arguments its signature names (among prompt, completion, answer, state,
  task, info, parser) and answers `RolloutScore(reward=weighted sum, metrics={function name: score})`.
- `SingleTurnEnv(dataset, eval_dataset, system_prompt, few_shot, parser, rubric, message_type)`: formats
  `question` rows into a `prompt` (system prompt, few-shot, user question), `get_dataset(n)`,
  `get_eval_dataset(n)` (falls back to the train rows), `max_turns = 1`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Messages = list[dict[str, Any]] | str


class Parser:
    def parse_answer(self, completion: Messages) -> str | None:
        if isinstance(completion, str):
            return completion
        answers = [m for m in completion if m.get("role") == "assistant"]
        return answers[-1].get("content") if answers else None


@dataclass
class RolloutScore:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)


class Rubric:
    def __init__(
        self,
        funcs: list[Callable[..., Any]] | None = None,
        weights: list[float] | None = None,
        parser: Parser | None = None,
    ):
        self.reward_funcs = list(funcs or [])
        self.reward_weights = list(weights or [1.0] * len(self.reward_funcs))
        self.parser = parser or Parser()

    def get_reward_funcs(self) -> list[Callable[..., Any]]:
        return self.reward_funcs

    def get_reward_weights(self) -> list[float]:
        return self.reward_weights

    async def call_reward_func(self, func: Callable[..., Any], **available: Any) -> float:
        parameters = inspect.signature(func).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        result = func(**{k: v for k, v in available.items() if takes_all or k in parameters})
        return float(await result if inspect.isawaitable(result) else result)

    async def score_rollout(
        self,
        prompt: Messages,
        completion: Messages,
        answer: str,
        state: dict[str, Any],
        task: str = "default",
        info: dict[str, Any] | None = None,
    ) -> RolloutScore:
        available = dict(
            prompt=prompt,
            completion=completion,
            answer=answer,
            state=state,
            task=task,
            info=info or {},
            parser=self.parser,
        )
        scores = await asyncio.gather(*(self.call_reward_func(f, **available) for f in self.reward_funcs))
        metrics = {f.__name__: s for f, s in zip(self.reward_funcs, scores)}
        return RolloutScore(reward=sum(s * w for s, w in zip(scores, self.reward_weights)), metrics=metrics)


class SingleTurnEnv:
    max_turns = 1

    def __init__(
        self,
        dataset: list[dict[str, Any]] | None = None,
        eval_dataset: list[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        few_shot: list[dict[str, Any]] | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        message_type: str = "chat",
    ):
        if dataset is None and eval_dataset is None:
            raise ValueError("Either dataset or eval_dataset must be provided")
        self.system_prompt, self.few_shot, self.message_type = system_prompt, few_shot, message_type
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        self.dataset = self.format_dataset(dataset) if dataset is not None else None
        self.eval_dataset = self.format_dataset(eval_dataset) if eval_dataset is not None else None

    def format_dataset(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        formatted = []
        for index, row in enumerate(rows):
            row = {"id": index, **row}
            if "prompt" not in row:
                system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
                row["prompt"] = system + list(self.few_shot or []) + [{"role": "user", "content": row["question"]}]
            formatted.append(row)
        return formatted

    def get_dataset(self, n: int = -1) -> list[dict[str, Any]]:
        if self.dataset is None:
            raise ValueError("dataset is not set")
        return self.dataset[:n] if n > 0 else self.dataset

    def get_eval_dataset(self, n: int = -1) -> list[dict[str, Any]]:
        if self.eval_dataset is None:
            return self.get_dataset(n)
        return self.eval_dataset[:n] if n > 0 else self.eval_dataset
