"""ReinforceNow projects in nemo_gym: the `@reward` / `@tool` decorators, and `+rnow_project=DIR` for ng_run and
ng_train (translation in `nemo_gym.rnow.project`, the environment in `resources_servers/rnow_project`)."""

from nemo_gym.rnow.decorators import RewardArgs, ToolArgs, get_response, reward, tool

__all__ = ["reward", "tool", "RewardArgs", "ToolArgs", "get_response"]
