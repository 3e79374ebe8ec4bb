"""GRPO in one file: collect rollouts from a running gym, group advantages, clipped loss, one AdamW step.

The readable companion of `ng_train`. No DeepSpeed, no framework classes: plain torch and
transformers. It computes the same loss as the real trainer (tests/test_train_example.py checks it).

    ng_run "+config_paths=[configs/quickstart.yaml]"          # in another terminal
    python examples/grpo_loop.py --model ~/.cache/nemo_gym/models/smollm2-<hash> \
        --tasks data/quickstart/reasoning_gym_tasks.jsonl --agent reasoning_gym_simple_agent

Without a weight sync the server keeps sampling from the initial weights: the loop is exact for its first step
and off-policy after that (the truncated importance-sampling weight below corrects for part of it). `ng_train`
pushes the weights to vLLM after each step.

Departures from the papers: one optimizer step per batch (so the PPO ratio is 1 in value and only its gradient
matters); token-level normalisation over the batch (DAPO, arXiv:2503.14476 eq. 8) instead of GRPO's
per-sequence mean (arXiv:2402.03300 eq. 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

import httpx
import torch
from transformers import AutoModelForCausalLM

from nemo_gym.serving.head import run_token_headers

CLIP_LOW, CLIP_HIGH, TIS_CAP = 0.2, 0.28, 2.0


# -- 1. rollouts --------------------------------------------------------------------------------------------
async def collect(head_url: str, agent: str, tasks: list[dict], group_size: int) -> list[list[dict]]:
    """group_size rollouts per task through the agent's /run; returns one list of rollout rows per task."""
    async with httpx.AsyncClient(
        timeout=600, headers=run_token_headers(head_url)
    ) as http:  # the run's token (nemo_gym.serving.auth)
        servers = (await http.get(f"{head_url}/servers")).json()
        agent_url = next(s["url"] for s in servers if s["name"] == agent)

        async def run(task: dict) -> dict:
            return (await http.post(f"{agent_url}/run", json=task)).json()

        rows = await asyncio.gather(*(run(task) for task in tasks for _ in range(group_size)))
    return [list(rows[i : i + group_size]) for i in range(0, len(rows), group_size)]


def sequence(rollout: dict) -> tuple[list[int], list[int], list[float]]:
    """(token ids, loss mask, sampler log-probs) of a rollout: the last model call's prompt + generation,
    with every call's generated tokens (at offset len(its prompt)) masked in."""
    calls = [item for item in rollout["response"]["output"] if item.get("generation_token_ids") is not None]
    ids = calls[-1]["prompt_token_ids"] + calls[-1]["generation_token_ids"]
    mask, logprobs = [0] * len(ids), [0.0] * len(ids)
    for call in calls:
        start = len(call["prompt_token_ids"])
        for offset, logprob in enumerate(call["generation_log_probs"]):
            mask[start + offset], logprobs[start + offset] = 1, logprob
    return ids, mask, logprobs


# -- 2. advantages ------------------------------------------------------------------------------------------
def grpo_advantages(rewards_G: torch.Tensor) -> torch.Tensor:
    """[groups, group_size] → (r - mean) / (std + 1e-6) per group (GRPO, arXiv:2402.03300 §4.1.2; unbiased std)."""
    return (rewards_G - rewards_G.mean(dim=1, keepdim=True)) / (rewards_G.std(dim=1, keepdim=True) + 1e-6)


def make_batch(groups: list[list[dict]], pad_id: int = 0) -> dict[str, torch.Tensor] | None:
    """Padded tensors of the groups whose rewards vary (the others carry no signal); None when none does."""
    rewards_G = torch.tensor([[float(r["reward"]) for r in group] for group in groups])
    keep = rewards_G.std(dim=1) > 0
    if not keep.any():
        return None
    advantages = grpo_advantages(rewards_G[keep]).reshape(-1)
    seqs = [sequence(r) for group, k in zip(groups, keep) if k for r in group]
    width = max(len(ids) for ids, _, _ in seqs)
    pad = lambda values, fill: [v + [fill] * (width - len(v)) for v in values]  # noqa: E731
    ids = torch.tensor(pad([s[0] for s in seqs], pad_id))
    return {
        "input_ids": ids,
        "attention_mask": torch.tensor(pad([[1] * len(s[0]) for s in seqs], 0)),
        "loss_mask": torch.tensor(pad([s[1] for s in seqs], 0), dtype=torch.float32)[:, 1:],  # about token t+1
        "rollout_logprobs": torch.tensor(pad([s[2] for s in seqs], 0.0))[:, 1:],
        "advantages": advantages,
    }


# -- 3. loss ------------------------------------------------------------------------------------------------
def grpo_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Clipped policy-gradient loss with clip-higher (DAPO) and truncated importance sampling.

    logprobs [B, T-1] of the generated tokens under the model; ratio r = exp(logp - logp.detach()) (= 1);
    per token -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A) · min(exp(logp_old - logp_vllm), TIS_CAP) (TIS: Yao et al.
    2025, "Your efficient RL framework secretly brings you off-policy RL training"), summed over generated
    tokens and divided by their count.
    """
    logits = (
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float() / temperature
    )
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask, advantages = batch["loss_mask"], batch["advantages"][:, None]
    ratio = torch.exp(logprobs - logprobs.detach())
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH) * advantages)
    tis = torch.exp(logprobs.detach() - batch["rollout_logprobs"]).clamp(max=TIS_CAP)
    return -(surrogate * tis * mask).sum() / mask.sum()


# -- 4. the loop --------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model folder (the one the gym's vllm_model serves)")
    parser.add_argument("--tasks", required=True, help="task JSONL")
    parser.add_argument("--agent", required=True, help="agent instance name")
    parser.add_argument("--head-url", default="http://127.0.0.1:11000")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args()

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    tasks = [json.loads(line) for line in open(args.tasks) if line.strip()]
    rng = random.Random(0)
    for step in range(1, args.steps + 1):
        groups = asyncio.run(collect(args.head_url, args.agent, rng.sample(tasks, args.batch_size), args.group_size))
        mean_reward = sum(float(r["reward"]) for g in groups for r in g) / sum(len(g) for g in groups)
        batch = make_batch(groups)
        if batch is None:
            print(f"step {step}: reward {mean_reward:.3f}, every group has equal rewards: nothing to learn")
            continue
        loss = grpo_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"step {step}: reward {mean_reward:.3f}, loss {loss.item():.4f}, grad norm {grad_norm:.3f}")


if __name__ == "__main__":
    main()
