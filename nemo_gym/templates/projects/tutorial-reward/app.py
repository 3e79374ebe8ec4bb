"""Tutorial: a reward function, step by step. The task: count the vowels of a word, answer in <answer> tags.

Read this file from top to bottom; README.md walks through running it. Everything an environment needs for
single-turn RL is here: what a task row holds (`VowelTask`), how the model's answer is read, and how the
answer becomes a number, the reward, that GRPO then compares within each group of rollouts of the same task.
"""

from __future__ import annotations

# Step 1. Imports. `nemo_gym.env.answers` has the helpers to read a model's answer safely: model output is
# untrusted, so they never raise and run in linear time even on a megabyte of garbage. `nemo_gym.serving.server`
# has the base class of an environment (ResourcesServer) and the types of the /verify request and result.
from nemo_gym.env.answers import last_answer_tag, last_assistant_text, strip_thinking
from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.serving.server import Session

# Step 2. The reward's parts, named, so that changing the shaping is a one-line edit. Rewards of one task are
# compared with each other (group-relative advantages), so what matters is the order they put answers in:
#   right count in the asked format      0.2 + 0.8 = 1.0
#   right count, format missing          0.0 + 0.0 = 0.0   (we only read the answer inside the tags)
#   wrong count in the asked format      0.2 + 0.0 = 0.2   (the format alone earns a little)
#   no <answer> tags at all              0.0
FORMAT_WEIGHT = 0.2
CORRECT_WEIGHT = 0.8


# Step 3. The task row. A row of data/train.jsonl is the prompt (`responses_create_params`, sent to the
# model) plus the fields the reward needs; /verify receives the row again with the model's `response`.
# Declaring the fields here makes a row without them a 422 error instead of a silent reward of 0.
class VowelTask(VerifyRequest):
    """A row: the prompt, the model's `response`, the word and its number of vowels."""

    word: str
    expected_answer: int


# Step 4. The environment: a subclass of ResourcesServer. A single-turn environment needs one method,
# `verify`. (Tools are methods marked @tool: see the tutorial-tool template.)
class VowelServer(ResourcesServer):
    """Count the vowels of a word. Reward range: [0.0, 1.0]: 0.2 for the <answer> format, 0.8 for the right count."""

    verify_request_type = VowelTask  # Step 3's type: the framework validates every /verify body with it

    async def verify(self, request: VowelTask, session: Session) -> VerifyResult:
        """0.2 when the final answer has an <answer>integer</answer>, plus 0.8 when that integer is right."""
        # Step 5. Read the answer: the text of the model's last message, without <think>...</think> blocks,
        # then what is inside the last <answer>...</answer> (None when there is none).
        text = strip_thinking(last_assistant_text(request.response))
        answer = last_answer_tag(text)

        # Step 6. Score each part. An ASCII-digits check accepts "3" and refuses "three", "3 vowels" or "³".
        well_formed = answer is not None and answer.isascii() and answer.isdigit()
        correct = well_formed and int(answer) == request.expected_answer

        # Step 7. Return the reward, and the parts as `reward_components`: ng_profile and the rollouts file
        # keep them, so you can see which part the policy gets wrong. Extra fields (here `extracted_answer`)
        # are kept in each rollout row too.
        reward = FORMAT_WEIGHT * well_formed + CORRECT_WEIGHT * correct
        return VerifyResult(
            reward=reward,
            reward_components={"format": float(well_formed), "correct": float(correct)},
            extracted_answer=answer,
        )
