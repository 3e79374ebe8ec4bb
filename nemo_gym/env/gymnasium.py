"""Gymnasium-style environments: a resources server with `POST /reset` and `POST /step`.

`GymnasiumEnv` owns the routes, the per-session episode and the scoring of a finished rollout; a game is a
subclass with its task fields and four small methods:

    class CoinFlipRequest(VerifyRequest):
        seed: int                                   # the task fields = the arguments of /reset

    class CoinFlip(GymnasiumEnv):
        verify_request_type = CoinFlipRequest

        def new_episode(self, task) -> Any:         # a fresh game for the task
            return random.Random(task.seed)
        def reset_observation(self, episode) -> tuple[str, dict]:
            return "Heads or tails?", {}
        def play(self, episode, action: str) -> StepResult:
            won = action.strip().lower() == episode.choice(["heads", "tails"])
            return StepResult(observation="You win." if won else "You lose.", reward=float(won), terminated=True)
        def score(self, episode, finished: bool) -> VerifyResult:
            ...

Routes (on top of the resources server's):

- `POST /reset` body: the task fields (those `verify_request_type` adds to `VerifyRequest`; a missing or
  malformed one is a 422) → `{observation, info}`; starts a new episode in the session.
- `POST /step` body `{action}` (the model's reply text) → `{observation, reward, terminated, truncated,
  info}`; 409 with no episode in the session or after it ended. `terminated`: the game reached an end
  state; `truncated`: it was cut short (a turn limit), as in Gymnasium.
- `POST /verify`: the session's episode when it was started for the row's task, else a fresh episode
  replayed from the trajectory's assistant turns (`assistant_actions`), so a stored rollout can be scored
  again offline; `score()` gives the reward, the result says `replayed`.

`responses_api_agents/gymnasium_agent` drives these environments: it reads the reset fields from the
`reset` tool's schema (`GET /tools`) and sends the model's reply text as the action.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, create_model

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving.openai_convert import content_text
from nemo_gym.serving.server import Session

__all__ = ["GymnasiumEnv", "ResetResult", "StepResult", "assistant_actions", "message_text"]

EPISODE, TASK, DONE = "episode", "task", "done"  # session keys


class ResetResult(BaseModel):
    """The answer of `POST /reset`."""

    observation: str = Field(description="what the model sees first")
    info: dict[str, Any] = Field(default_factory=dict, description="facts about the episode not shown to the model")


class StepResult(BaseModel):
    """The answer of `POST /step` (Gymnasium's `step` return, as an object)."""

    observation: str = Field(description="what the model sees after its action")
    reward: float = Field(description="reward of this step")
    terminated: bool = Field(description="the game reached an end state")
    truncated: bool = Field(False, description="the episode was cut short (e.g. a turn limit)")
    info: dict[str, Any] = Field(default_factory=dict, description="facts about the step not shown to the model")


def message_text(item: Any) -> str:
    """The text of a Responses message item: its string content, or its parts' `text` joined ('' otherwise)."""
    return content_text(item.get("content") if isinstance(item, dict) else None)


def assistant_actions(response: dict[str, Any]) -> list[str]:
    """One action per model turn of a trajectory: the text of the assistant messages between two user
    messages (observations), joined. `response.output` of gymnasium_agent alternates the two; items of
    other types (reasoning, ...) and of unexpected shape are skipped."""
    actions: list[list[str]] = []
    turn: list[str] | None = None
    output = response.get("output")
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        if item.get("role") != "assistant":
            turn = None
            continue
        if turn is None:
            turn = []
            actions.append(turn)
        turn.append(message_text(item))
    return ["".join(parts) for parts in actions]


class GymnasiumEnv(ResourcesServer):
    """Base of a Gymnasium-style environment (module docstring). Subclasses set `verify_request_type` (the
    task fields) and implement `new_episode`, `reset_observation`, `play` and `score`."""

    task_type: ClassVar[type[BaseModel]] = BaseModel  # the task fields alone; derived from verify_request_type
    reset_description: ClassVar[str] = "Start a new episode of the task. Returns `{observation, info}`."

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        task_fields = {
            name: field
            for name, field in cls.verify_request_type.model_fields.items()
            if name not in VerifyRequest.model_fields
        }
        cls.task_type = create_model(
            f"{cls.__name__}Task",
            __config__=ConfigDict(extra="forbid"),
            **{name: (field.annotation, field) for name, field in task_fields.items()},
        )
        if "reset" not in cls.__dict__:  # a game may write its own `@tool reset` (calling `self.start`)
            cls.reset = _reset_tool(task_fields, cls.reset_description)

    # -- the game ------------------------------------------------------------------------------------
    def new_episode(self, task: Any) -> Any:
        """A fresh episode (any object) for `task`, an instance of `task_type` (the row's task fields)."""
        raise NotImplementedError

    def reset_observation(self, episode: Any) -> tuple[str, dict[str, Any]]:
        """The first observation of a fresh episode and its `info`."""
        raise NotImplementedError

    def play(self, episode: Any, action: str) -> StepResult:
        """Play the model's reply text `action` on `episode` (never raises on bad model output)."""
        raise NotImplementedError

    def score(self, episode: Any, finished: bool) -> VerifyResult:
        """The verify result of `episode`; `finished`: a step said terminated or truncated."""
        raise NotImplementedError

    # -- the framework -------------------------------------------------------------------------------
    def start(self, task: BaseModel, session: Session) -> ResetResult:
        """Start an episode of `task` in `session` (what `POST /reset` does)."""
        episode = self.new_episode(task)
        session.update({EPISODE: episode, TASK: task.model_dump(), DONE: False})
        observation, info = self.reset_observation(episode)
        return ResetResult(observation=observation, info=info)

    @tool
    async def step(self, action: str, session: Session) -> dict[str, Any]:
        """Play one turn: `action` is the model's reply text. Returns `{observation, reward, terminated,
        truncated, info}`; 409 with no episode in the session (POST /reset first) or after it ended."""
        if session.get(EPISODE) is None:
            raise HTTPException(409, "no episode in this session: POST /reset first")
        if session[DONE]:
            raise HTTPException(409, "this episode is over: POST /reset to start another")
        result = self.play(session[EPISODE], action)
        session[DONE] = result.terminated or result.truncated
        return result.model_dump()

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        """Score the session's episode of the row's task, else the trajectory replayed on a fresh one."""
        task = self.task_type.model_validate(request.model_dump(include=set(self.task_type.model_fields)))
        replayed = session.get(EPISODE) is None or session.get(TASK) != task.model_dump()
        if replayed:
            episode, finished = self.new_episode(task), False
            for action in assistant_actions(request.response):
                if finished:
                    break
                step = self.play(episode, action)
                finished = step.terminated or step.truncated
        else:
            episode, finished = session[EPISODE], session[DONE]
        result = self.score(episode, finished)
        return result.model_copy(update={"replayed": replayed})


def _reset_tool(task_fields: dict[str, Any], description: str) -> Callable:
    """The `reset` tool of a game: its arguments are the task fields (schema, validation and 422 from the
    tool machinery of `nemo_gym.serving.server`), plus the session."""

    async def reset(self: GymnasiumEnv, session: Session, **task: Any) -> dict[str, Any]:
        return self.start(self.task_type(**task), session).model_dump()

    reset.__doc__ = description

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"session": Session, "return": dict[str, Any]}
    for name, field in task_fields.items():
        annotations[name] = Annotated[(field.annotation, *field.metadata, Field(description=field.description))]
        default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[name], default=default)
        )
    params.append(inspect.Parameter("session", inspect.Parameter.KEYWORD_ONLY, annotation=Session))
    reset.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    reset.__annotations__ = annotations
    return tool(reset)
