"""Rewards of the sample rnow project: a format gate, the answer's accuracy, and a bonus for using a tool."""

from nemo_gym.rnow import RewardArgs, get_response, reward


def final_answer(messages: list) -> str:
    """The text after the last 'Answer:' of the final assistant message ('' when there is none)."""
    text = get_response(messages)
    return text.rsplit("Answer:", 1)[1].strip() if "Answer:" in text else ""


@reward(precondition=True)
def answered(args: RewardArgs, messages: list) -> float:
    """Gate: the final message gives an answer after 'Answer:' (else the total reward is 0)."""
    return 1.0 if final_answer(messages) else 0.0


@reward
def accuracy(args: RewardArgs, messages: list) -> float:
    """1 when the answer holds the expected one (case-insensitive), else 0."""
    return 1.0 if str(args.metadata["answer"]).lower() in final_answer(messages).lower() else 0.0


@reward(timeout=5)
def used_tool(args: RewardArgs, messages: list) -> float:
    """1 when a tool answered during the episode, else 0."""
    return 1.0 if any(m.get("role") == "tool" for m in messages) else 0.0
