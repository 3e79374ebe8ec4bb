"""blackjack: one hand of Blackjack as a Gymnasium-style environment (`POST /reset`, `POST /step`), driven by
`responses_api_agents/gymnasium_agent`.

`/reset` deals from a shoe shuffled by the row's `seed`; each `/step` plays the model's reply text (the last
`hit` or `stand` in it) and answers `{observation, reward, terminated, truncated, info}`. `/verify` gives the
hand's reward kept in the session; a session with no hand of that seed (a rollout scored again offline) is
scored by replaying the trajectory's assistant messages, one action per model turn. Rules: `blackjack_game.py`; routes,
sessions and replay: `nemo_gym.env.gymnasium`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nemo_gym.env.gymnasium import GymnasiumEnv, StepResult
from nemo_gym.env.resources_server import VerifyRequest, VerifyResult
from nemo_gym.serving.server import ServerConfig

from . import blackjack_game as game


class BlackjackConfig(ServerConfig):
    num_decks: int = Field(1, ge=1, le=8, description="52-card decks in the shoe")
    dealer_hits_soft_17: bool = Field(
        False, description="the dealer draws on a soft 17 (H17); default: stands on every 17 (S17)"
    )
    max_steps: int = Field(
        10, ge=1, le=100, description="turns before an undecided hand is forfeited (reward -1, truncated)"
    )


class BlackjackVerifyRequest(VerifyRequest):
    seed: int = Field(description="shuffles the shoe: the same seed deals the same hand")


class BlackjackServer(GymnasiumEnv):
    """Blackjack. Reward range: [-1.0, 1.0]: win +1, push 0, loss, bust or forfeit -1."""

    Config = BlackjackConfig
    config: BlackjackConfig
    verify_request_type = BlackjackVerifyRequest
    reward_range = (-1.0, 1.0)
    reset_description = "Deal a hand from the shoe shuffled by `seed`. Returns `{observation, info}`."

    def new_episode(self, task: Any) -> Any:
        return game.BlackjackEpisode.deal(
            task.seed,
            num_decks=self.config.num_decks,
            dealer_hits_soft_17=self.config.dealer_hits_soft_17,
            max_steps=self.config.max_steps,
        )

    def reset_observation(self, episode: Any) -> tuple[str, dict[str, Any]]:
        return episode.observation(), {"seed": episode.seed, "max_steps": episode.max_steps}

    def play(self, episode: Any, action: str) -> StepResult:
        """The move is the reply's last `hit` or `stand` (`blackjack_game.parse_action`)."""
        reward, observation = episode.step(action)
        info = {"turns": episode.turns, "outcome": episode.outcome, "player_total": game.hand_value(episode.player)[0]}
        return StepResult(
            observation=observation,
            reward=reward,
            terminated=episode.terminated,
            truncated=episode.truncated,
            info=info,
        )

    def score(self, episode: Any, finished: bool) -> VerifyResult:
        """The hand's reward; an unfinished hand is forfeited (-1). A hand that ended without a decision has a
        `failure_reason`: `no_decision` (forfeited after max_steps turns) or `episode_unfinished`."""
        failure = "episode_unfinished" if not finished else "no_decision" if episode.outcome == "forfeit" else None
        return VerifyResult(
            reward=float(episode.total_reward if finished else -1.0),
            outcome=episode.outcome or "unfinished",
            turns=episode.turns,
            player_total=game.hand_value(episode.player)[0],
            failure_reason=failure,
        )
