"""Rollouts/s of `ng_collect_rollouts` with 1, 2 and 4 replicas of the resources server and the agent, at a
fixed model latency, on this machine (locally, or with `--ray` on a local two-node Ray cluster).

    .venv/bin/python benchmarks/replica_scaling.py [--replicas 1 2 4] [--rollouts 400] [--parallel 64]
    [--model-latency-s 0.05] [--ray]

The environment: `tests/configs/weather_scripted.yaml` — the weather resources server (example_single_tool_call),
simple_agent, and scripted_model as the policy answering after `--model-latency-s` seconds (a stand-in for a
model server at a fixed latency; one replica, asynchronous, so it never is the bottleneck). Each rollout is one
`/run` on an agent: seed the session, one model call, `/verify`. The servers run in their own processes (with
`+skip_venv=true`: this Python, as the tests do). The wall time is the collector's own (`Wall time:` of its
summary, from the first rollout to the last); each configuration is run `--repeats` times and the median kept.
Results: results/bench/replica_scaling/summary.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from nemo_gym.env.testing import NgRun  # noqa: E402

OUT = REPO / "results/bench/replica_scaling"
DATA = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def collect_once(head_url: str, rollouts: int, parallel: int, out: Path) -> float:
    """Rollouts/s of one collection of `rollouts` rollouts (the example's 5 tasks, repeated)."""
    out.unlink(missing_ok=True)
    command = [
        str(BIN / "ng_collect_rollouts"),
        f"+head_server_url={head_url}",
        "+agent_name=weather_agent",
        f"+input_jsonl_fpath={DATA}",
        f"+output_jsonl_fpath={out}",
        f"+num_repeats={rollouts // 5}",
        f"+num_samples_in_parallel={parallel}",
        "+progress=false",
        "+resume=false",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    match = re.search(r"Wall time: [\d.]+ s, ([\d.]+) rollouts/s", done.stdout)
    if done.returncode != 0 or not match:
        raise SystemExit(
            f"ng_collect_rollouts failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return float(match.group(1))


def measure(replicas: int, args: argparse.Namespace, ray_address: str | None) -> dict[str, float]:
    overrides = [
        "+config_paths=[tests/configs/weather_scripted.yaml]",
        "+skip_venv=true",
        f"+scripted_delay_s={args.model_latency_s}",
        f"+weather.resources_servers.example_single_tool_call.num_replicas={replicas}",
        f"+weather_agent.responses_api_agents.simple_agent.num_replicas={replicas}",
    ]
    if ray_address:
        overrides += [
            f"+ray_address={ray_address}",
            "+weather.resources_servers.example_single_tool_call.num_cpus=0.5",
            "+weather_agent.responses_api_agents.simple_agent.num_cpus=0.5",
            "+policy_model.responses_api_models.scripted_model.num_cpus=0.5",
        ]
    rates = []
    with NgRun(*overrides, timeout_s=600) as run, tempfile.TemporaryDirectory() as tmp:
        head = run.wait_ready()
        collect_once(head, 50, args.parallel, Path(tmp) / "warmup.jsonl")  # connections, imports, caches
        for index in range(args.repeats):
            rates.append(collect_once(head, args.rollouts, args.parallel, Path(tmp) / f"run{index}.jsonl"))
        run.stop()
    return {"replicas": replicas, "rollouts_per_s": statistics.median(rates), "runs": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rollouts", type=int, default=400, help="rollouts per measured collection (a multiple of 5)")
    parser.add_argument("--parallel", type=int, default=64, help="num_samples_in_parallel")
    parser.add_argument(
        "--model-latency-s", type=float, default=0.05, help="seconds the scripted policy takes per call"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--ray", action="store_true", help="place the servers on a local Ray cluster (head + one worker node)"
    )
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    cluster = None
    if args.ray:
        from ray_cluster import LocalRayCluster

        cluster = LocalRayCluster(OUT, free_port(), head_cpus=2)
        cluster.add_worker(cpus=2)
    try:
        results = [measure(n, args, cluster.address if cluster else None) for n in args.replicas]
    finally:
        if cluster:
            cluster.stop()
    base = results[0]["rollouts_per_s"]
    summary = {"setup": vars(args), "results": [{**r, "speedup": r["rollouts_per_s"] / base} for r in results]}
    name = "summary_ray.json" if args.ray else "summary.json"
    (OUT / name).write_text(json.dumps(summary, indent=1))
    print(f"{'replicas':>8}  {'rollouts/s':>10}  {'vs 1':>6}  runs")
    for row in summary["results"]:
        print(
            f"{row['replicas']:>8}  {row['rollouts_per_s']:>10.1f}  {row['speedup']:>5.2f}x "
            f" {', '.join(f'{r:.1f}' for r in row['runs'])}"
        )


if __name__ == "__main__":
    main()
