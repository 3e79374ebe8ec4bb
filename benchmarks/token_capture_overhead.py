"""What training token capture costs a model server per call, over a long rollout: the work of
`ModelServer._answer` around the model itself (read the rollout's records, put the parent's token ids back on the
request's last assistant turn, record the call), for a rollout of `--calls` model calls whose prompt grows by
`--turn-tokens` a call from `--prompt-tokens`.

    .venv/bin/python benchmarks/token_capture_overhead.py                    # 100 calls, 3 reps
    .venv/bin/python benchmarks/token_capture_overhead.py --calls 30 --reps 1   # smoke

Two readers of the same records, each call timed whole (entries + resolve_parent + record_call), in one run:
- `incremental`: one `TokenCaptureStore` for the process (what the model server holds since 2026-12-01): each call
  parses only the record appended since the last;
- `full_read`: a new `TokenCaptureStore` per call (what the model server did before: the whole records file parsed
  at every call, n² records over a rollout).
The requests are Responses bodies of a harness that dropped the token ids (its assistant turns are text only), so
every call resolves its parent by fingerprint and gets the parent's ids back, as in
`tests/test_token_capture.py`. Figures: seconds for the whole rollout, the last call's milliseconds, the records
file's size. Results: `results/bench/token_capture_overhead/<timestamp>/summary.json` and `summary.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nemo_gym.serving.token_capture import TokenCaptureStore, record_call, resolve_parent  # noqa: E402


def answer(call: int, prompt: list[int], generation: list[int]) -> dict[str, Any]:
    """A model server's Responses answer with its token ids, as vllm_model gives it."""
    return {
        "id": f"resp-{call}",
        "model": "policy",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"step {call}: looked it up"}],
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": [-0.5] * len(generation),
            }
        ],
    }


def one_rollout(args: argparse.Namespace, root: Path, rollout_id: str, incremental: bool) -> dict[str, Any]:
    """One rollout of `args.calls` calls; each call's seconds (records read, parent put back, call recorded)."""
    rng = random.Random(0)
    shared = TokenCaptureStore(root)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "find it"}]
    sequence = [rng.randrange(50_000) for _ in range(args.prompt_tokens)]  # the tokens the policy has seen
    seconds = []
    for call in range(args.calls):
        body = {"input": list(items)}
        started = time.perf_counter()
        store = shared if incremental else TokenCaptureStore(root)
        entries = store.entries(rollout_id)
        body, lineage = resolve_parent(body, entries, chat=False)
        generation = [rng.randrange(50_000) for _ in range(args.generation_tokens)]
        record_call(store, rollout_id, answer(call, list(sequence), generation), lineage, chat=False)
        seconds.append(time.perf_counter() - started)
        assert call == 0 or lineage.resolution == "resolved", lineage
        if call:
            restored = body["input"][-2]
            assert restored["generation_token_ids"] == entries[-1]["generation_token_ids"]
        # the harness keeps the text only, then adds the tool's output
        items += [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"step {call}: looked it up"}],
            },
            {"type": "message", "role": "user", "content": f"tool output {call}"},
        ]
        sequence += generation + [rng.randrange(50_000) for _ in range(args.turn_tokens - args.generation_tokens)]
    return {
        "seconds_total": round(sum(seconds), 4),
        "last_call_ms": round(1000 * seconds[-1], 3),
        "records_mib": round(store.path_for(rollout_id).stat().st_size / 2**20, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="model calls of the rollout")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="the first call's prompt")
    parser.add_argument("--turn-tokens", type=int, default=300, help="tokens a turn adds (generation + tool output)")
    parser.add_argument("--generation-tokens", type=int, default=100, help="tokens generated a call")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.calls < 2 or args.reps < 1:
        parser.error("--calls must be at least 2 (a parent and a call that resolves it) and --reps at least 1")
    if not 0 < args.generation_tokens <= args.turn_tokens:
        parser.error("--generation-tokens must be positive and at most --turn-tokens (a turn adds the generation)")
    results_dir = (
        args.results_dir or REPO / "results/bench/token_capture_overhead" / f"{dt.datetime.now():%Y%m%d_%H%M%S}"
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {"incremental": [], "full_read": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):  # interleaved, the order turning by rep
            for mode in list(runs) if rep % 2 == 0 else list(runs)[::-1]:
                runs[mode].append(one_rollout(args, Path(tmp), f"{mode}-{rep}", mode == "incremental"))
                print(f"{mode:>11} rep {rep}: {runs[mode][-1]}", flush=True)
    summary = {
        mode: {key: statistics.median(run[key] for run in mode_runs) for key in mode_runs[0]}
        for mode, mode_runs in runs.items()
    }
    summary["full_read_over_incremental"] = round(
        summary["full_read"]["seconds_total"] / summary["incremental"]["seconds_total"], 2
    )
    summary["args"] = {k: str(v) for k, v in vars(args).items()}
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    markdown = (
        f"{args.calls} calls, prompt {args.prompt_tokens} + {args.turn_tokens} tokens a turn,"
        f" medians of {args.reps}\n\n"
        "| reader | rollout s | last call ms | records MiB |\n|---|---|---|---|\n"
        + "".join(
            f"| {mode} | {summary[mode]['seconds_total']:.3f} | {summary[mode]['last_call_ms']:.2f} |"
            f" {summary[mode]['records_mib']:.1f} |\n"
            for mode in runs
        )
        + f"\nfull_read / incremental: {summary['full_read_over_incremental']}x\n"
    )
    (results_dir / "summary.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
