"""example_multi_step: look up the value of each relevant synonym, then submit them all in order.

Matches NeMo Gym's `example_multi_step` server (0.7.0): tools `get_synonym_value` (value = sum of the
code points of the synonym) and `extract_synonym_values` (the submission), and the same verifier fields
(`parsed_synonym_values`, `accuracy`, `set_overlap`, `original_term_minefield_hit`,
`order_instruction_following_failure`). Departures, both where NeMo Gym answers 500: a task whose
`expected_synonym_values` is empty is a 422, and a submission whose arguments are not
`{"synonym_values": [int, ...]}` counts as submitting nothing.
"""

from __future__ import annotations

from pydantic import Field

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import Session


class MultiStepRequest(VerifyRequest):
    """A `/verify` body: the row's task fields (all required, as in NeMo Gym) plus the rollout's `response`."""

    id: int
    expected_synonyms: list[str]
    expected_synonym_values: list[int] = Field(min_length=1, description="values to submit, in order")
    minefield_label: str = Field(description="the original term: submitting it is a trap")
    minefield_label_value: int


class MultiStepResult(VerifyResult):
    parsed_synonym_values: list[int] = Field(description="the last submission (empty when none)")
    accuracy: bool = Field(description="submission equals the expected list, order included")
    set_overlap: float = Field(description="|submitted ∩ expected| / |expected|, in [0, 1]")
    original_term_minefield_hit: bool
    order_instruction_following_failure: bool = Field(description="right values, wrong order or repeats")


def last_submission(trajectory: Trajectory) -> list[int]:
    """`synonym_values` of the last `extract_synonym_values` call; [] when there is none or its arguments are
    not `{"synonym_values": [int, ...]}`."""
    call = trajectory.last_call("extract_synonym_values")
    values = call.arguments.get("synonym_values") if call is not None and call.arguments is not None else None
    ok = isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return values if ok else []


class ExampleMultiStepServer(ResourcesServer):
    """Synonym-value extraction over several tool calls. Reward range: [0.0, 1.0], binary (= accuracy)."""

    verify_request_type = MultiStepRequest

    @tool
    async def get_synonym_value(self, synonym: str) -> dict[str, int]:
        """Get the value of a synonym."""
        return {"synonym_value": sum(map(ord, synonym))}

    @tool
    async def extract_synonym_values(self, synonym_values: list[int]) -> dict[str, bool]:
        """Submit the synonym values, in the order the synonyms are listed."""
        return {"success": True}

    async def verify(self, request: MultiStepRequest, session: Session) -> MultiStepResult:
        """1.0 when the last submission equals `expected_synonym_values`, in order, else 0.0."""
        expected, actual = request.expected_synonym_values, last_submission(Trajectory.of(request.response))
        accuracy = actual == expected
        set_overlap = len(set(actual) & set(expected)) / len(expected)
        return MultiStepResult(
            reward=float(accuracy),
            parsed_synonym_values=actual,
            accuracy=accuracy,
            set_overlap=set_overlap,
            # NeMo Gym also tests the label string, which can never be among integer values.
            original_term_minefield_hit=request.minefield_label_value in actual,
            order_instruction_following_failure=not accuracy and set_overlap == 1.0,
        )
