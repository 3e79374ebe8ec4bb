"""example_single_tool_call: one `get_weather` tool; the reward says whether the policy called it.

Matches NeMo Gym's `example_single_tool_call` server (0.7.0): same tool name, arguments and output, and the
0.7.0 verifier (reward 1.0 iff the trajectory holds a `get_weather` function call). No per-rollout state.
"""

from __future__ import annotations

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import Session


class ExampleSingleToolCallServer(ResourcesServer):
    """Weather assistant: the task is to look the weather up with the tool rather than guess.

    Reward range: [0.0, 1.0], binary.
    """

    @tool
    async def get_weather(self, city: str) -> dict[str, str]:
        """Get the current weather in a city."""
        return {"city": city, "weather_description": f"The weather in {city} is cold."}

    async def verify(self, request: VerifyRequest, session: Session) -> VerifyResult:
        """1.0 when any `get_weather` function call appears in the trajectory, else 0.0."""
        called = bool(Trajectory.of(request.response).calls_named("get_weather"))
        return VerifyResult(reward=float(called))
