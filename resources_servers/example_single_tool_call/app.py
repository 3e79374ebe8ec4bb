"""example_single_tool_call: one `get_weather` tool; the reward says whether the policy called it.

Matches NeMo Gym's `example_single_tool_call` server (0.7.0): same tool name, arguments and output, and the
0.7.0 verifier (reward 1.0 iff the trajectory holds a `get_weather` function call). No per-rollout state.
"""

from __future__ import annotations

from typing import Any

from nemo_gym.server import ResourcesServer, Session, VerifyRequest, VerifyResult, tool


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The `function_call` items of a Responses `Response` dict's `output`, in order (others skipped; an
    `output` that is not a list has none)."""
    output = response.get("output")
    return [item for item in output if isinstance(item, dict) and item.get("type") == "function_call"] if isinstance(output, list) else []


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
        called = any(call.get("name") == "get_weather" for call in function_calls(request.response))
        return VerifyResult(reward=float(called))
