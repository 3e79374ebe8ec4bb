"""Yes/no questions ("Is 91 a prime number?"): the smallest complete RL environment, with one binary reward.

The whole environment is `verify`: the agent sends the model's answer, and the reward says whether its
last "yes" or "no" is the row's `expected_answer`. Add tools with `@tool` methods (see the rl-tools template).
"""

from __future__ import annotations

import re
from typing import Literal

from nemo_gym.env.answers import last_assistant_text  # the final answer's text; never raises on malformed output
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import Session

YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


class YesNoTask(VerifyRequest):
    """A dataset row as /verify receives it: the prompt, the model's `response`, and the right answer."""

    expected_answer: Literal["yes", "no"]


class YesNoServer(ResourcesServer):
    """Yes/no questions. Reward range: [0.0, 1.0], binary."""

    verify_request_type = YesNoTask  # rows without a valid expected_answer get a 422, not a silent 0

    async def verify(self, request: YesNoTask, session: Session) -> VerifyResult:
        """1.0 when the last yes/no word of the final answer is the row's `expected_answer`, else 0.0."""
        words = YES_NO.findall(last_assistant_text(request.response))
        return VerifyResult(reward=float(bool(words) and words[-1].lower() == request.expected_answer))
