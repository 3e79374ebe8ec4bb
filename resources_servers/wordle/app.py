"""wordle: the word game as a Gymnasium-style environment (`POST /reset`, `POST /step`), driven by
`responses_api_agents/gymnasium_agent`.

`/reset` starts a game on the row's `target_word`; each `/step` plays the model's reply text (the guess is
read leniently, see `wordle_game.parse_guess`) and answers `{observation, reward, terminated, truncated,
info}`. `/verify` gives the episode's total reward kept in the session; a session with no game of that word
(a rollout scored again offline) is scored by replaying the trajectory's assistant messages, one action per
model turn. Rules and marks: `wordle_game.py`; routes, sessions and replay: `nemo_gym.env.gymnasium`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from nemo_gym.env.gymnasium import GymnasiumEnv, StepResult
from nemo_gym.env.resources_server import VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig

from . import wordle_game as game

TargetWord = Annotated[str, StringConstraints(pattern=r"^[A-Za-z]{5}$", to_lower=True)]


class WordleConfig(ServerConfig):
    max_guesses: int = Field(6, ge=1, le=50, description="turns in a game (invalid guesses count)")
    guess_penalty: float = Field(
        0.0, ge=0.0, le=1.0, description="reward of a solve: max(0, 1 - guess_penalty * (turns - 1))"
    )
    dictionary_guesses: bool = Field(True, description="accept only words of data/allowed_words.txt as guesses")


class WordleVerifyRequest(VerifyRequest):
    target_word: TargetWord = Field(description="the secret word: 5 letters A-Z (any case)")


class WordleServer(GymnasiumEnv):
    """Wordle. Reward range: [0.0, 1.0]: 1.0 for a solve (less with `guess_penalty`), else 0.0."""

    Config = WordleConfig
    config: WordleConfig
    verify_request_type = WordleVerifyRequest
    reward_range = (0.0, 1.0)
    reset_description = (
        "Start a game with the secret `target_word` (5 letters; else 422). Returns `{observation, info}`."
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.allowed = game.load_words("allowed_words.txt") if self.config.dictionary_guesses else None

    def new_episode(self, task: Any) -> Any:
        return game.WordleEpisode(
            secret=task.target_word, max_guesses=self.config.max_guesses, guess_penalty=self.config.guess_penalty
        )

    def reset_observation(self, episode: Any) -> tuple[str, dict[str, Any]]:
        observation = (
            f"The secret word has 5 letters. You have {episode.max_guesses} guesses. Reply with your first guess in"
            " capital letters."
        )
        return observation, {"max_guesses": episode.max_guesses}

    def play(self, episode: Any, action: str) -> StepResult:
        """The guess is the reply's last 5-letter word, capitals first (`wordle_game.parse_guess`)."""
        reward, observation = episode.step(action, self.allowed)
        return StepResult(
            observation=observation,
            reward=reward,
            terminated=episode.terminated,
            info={"turns": episode.turns, "solved": episode.solved},
        )

    def score(self, episode: Any, finished: bool) -> VerifyResult:
        failure = None if episode.solved else "out_of_guesses" if finished else "episode_unfinished"
        return VerifyResult(
            reward=float(episode.total_reward),
            reward_components={"solved": float(episode.solved)},
            turns=episode.turns,
            solved=episode.solved,
            failure_reason=failure,
        )
