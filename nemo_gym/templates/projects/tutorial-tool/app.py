"""Tutorial: tools and per-rollout state, step by step. The task: find a secret number with a `guess` tool
that answers "higher", "lower" or "correct", then say the number.

Read this file from top to bottom; README.md walks through running it. A multi-turn episode goes like this:
the agent calls `/seed_session` with the task row, then alternates model calls and tool calls (each tool call
is a POST to `/<tool name>` of this server) until the model answers without a tool call, then calls `/verify`
with the whole trajectory. All calls of one rollout carry the same session id, so the tool sees the state
that `seed_session` put there.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from nemo_gym.env.answers import last_assistant_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving.server import Session

INTEGER = re.compile(r"-?\d+")


# Step 1. The task row. The prompt (`responses_create_params`) says the range; the secret is a field of the
# row that only the server reads: the agent sends the model the prompt, never the other fields. The task
# fields are declared once, with their types; the row reaches the server twice (`/seed_session`, then
# `/verify` with the model's `response` added), and the framework checks each body against its model (422
# for a missing field or one of the wrong type) before our code sees it, typed.
class GuessFields(BaseModel):
    """The task fields: the range and the secret number in it."""

    low: int
    high: int
    secret: int


class GuessSeed(GuessFields, SeedRequest):
    """The row, as `seed_session` gets it."""


class GuessTask(GuessFields, VerifyRequest):
    """The row plus the model's `response`, as `verify` gets it."""


class GuessServer(ResourcesServer):
    """Find a secret number with a guess tool. Reward range: [0.0, 1.0], binary."""

    seed_request_type = GuessSeed
    verify_request_type = GuessTask

    # Step 2. Per-rollout state. `seed_session` runs once at the start of every rollout, with the row; the
    # `session` dict belongs to this rollout only (many rollouts run at once, each with its own). Seeding
    # the same session twice must give the same state, so nothing random here: the secret comes from the row.
    async def seed_session(self, row: GuessSeed, session: Session) -> dict[str, Any]:
        session["secret"] = row.secret
        session["guesses"] = 0
        return {}  # anything returned here goes back to the agent; nothing is needed

    # Step 3. A tool: a method marked @tool. Its name is the tool's name, its docstring the description the
    # model reads, its typed parameters the JSON schema of the arguments (`number: int`: the framework answers
    # 422 to anything else before the method runs). A parameter typed `Session` gets the rollout's state and
    # is not shown to the model. What the method returns (JSON) is what the model sees as the tool's output.
    @tool
    async def guess(self, number: int, session: Session) -> dict[str, Any]:
        """Guess the secret number. Answers "higher" (the secret is larger than your guess), "lower" (it is smaller) or "correct"."""  # noqa: E501
        if "secret" not in session:
            return {"error": "no task in this session (the agent seeds it first)"}
        session["guesses"] += 1
        if number < session["secret"]:
            hint = "higher"
        elif number > session["secret"]:
            hint = "lower"
        else:
            hint = "correct"
        return {"guess": number, "hint": hint, "guesses_so_far": session["guesses"]}

    # Step 4. The reward reads the final answer only: the tool calls were the way there. The number of
    # guesses is reported next to the reward (an extra field kept in each rollout row), not folded into it;
    # to reward fewer guesses, use it here, e.g. reward = 1.0 - 0.05 * (guesses - 1).
    async def verify(self, request: GuessTask, session: Session) -> VerifyResult:
        """1.0 when the last integer of the final answer is the secret, else 0.0."""
        numbers = INTEGER.findall(strip_thinking(last_assistant_text(request.response)))
        correct = bool(numbers) and int(numbers[-1]) == request.secret
        return VerifyResult(reward=float(correct), guesses=session.get("guesses", 0))
