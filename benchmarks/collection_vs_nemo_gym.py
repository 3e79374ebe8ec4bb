"""Rollout-collection throughput of our gym vs NVIDIA NeMo Gym 0.4.0 and 0.7.0 on the same work.

    .venv/bin/python benchmarks/collection_vs_nemo_gym.py            # full matrix, 3 reps (~25 min)
    .venv/bin/python benchmarks/collection_vs_nemo_gym.py --quick    # smoke run (~3 min)

The work, for every system: `ng_run` of `resources_servers/example_single_tool_call` + `simple_agent` +
`openai_model`, the policy being the shared harness's `fake_openai.py` (one `get_weather` call, then a final
message; `--latency-ms` per model call), then `ng_collect_rollouts` of the 5 example rows x 400 repeats = 2000
rollouts at concurrency 1, 32 and 256 (the matrix `1@0,32@0,256@0,256@50`, concurrency@latency ms). Every run is
checked: exit code 0, every reward 1.0 and exactly 2 model calls per rollout (the fake's `/stats`).

The systems (`collection_systems.py`, `--systems`): ours, from this checkout (`ng_run` with the servers in their uv
environment, built once, so the start-ups measured are warm; this Python's `ng_collect_rollouts`); NeMo Gym 0.4.0
through the harness in `--bench-dir` (default `../shared/bench` next to this repository; install it first with
`bash <bench-dir>/setup_nemo_gym.sh`): its `ngbench.NemoGym` starts the fake, NeMo Gym's `ng_run` (Ray included) and
its collector exactly as its own benchmark does; NeMo Gym 0.7.0, the release its users have today, installed as the
peer tests install it (`tests/nemo_gym_peer07.py`, on first use) and run with its own `ng_run` of its wheel's config
files and its own collector, which sends the rows through the `legacy_agent` environment server its config
declares. The floor is the harness's `floor_client.py`: one minimal aiohttp client making the same number of HTTP
calls per rollout as our chain (`--floor-hops`, default 8: collector → agent `/run`, agent → resources
`/seed_session`, agent → model ×2, model → policy ×2, agent → resources `/get_weather` and `/verify`; NeMo Gym
0.4.0's chain makes 9, its agent calling its own `/v1/responses` once more, 0.7.0's more again through its
environment server) directly to the fake.

Every system's servers stay up for the whole run and the cells are interleaved: for each latency, rep and
concurrency, the systems and the floor run back to back (the order of the systems turning by rep), so machine noise
hits all of them alike. Measured per collection (`benchlib.run_measured`): wall time of the collector process
(rollouts/s = N / wall), the dispatch loop (`_materialized_inputs.jsonl` appears → N lines), CPU seconds of every
process by group (collector: exact rusage; servers, Ray, fake: psutil deltas), peak RSS, and the 1-minute load
average before and after. Start-up: spawn → every server answers (ours: ng_run's "servers ready in" line; NeMo Gym:
its "All N / N servers ready", which it polls every 3 s).

Results: `results/bench/collection_vs_nemo_gym/<timestamp>/` (`results.jsonl`, one object per run;
`summary.json`; `summary.md`, the tables copied into benchmarks/README.md; `logs/`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from collection_systems import (  # noqa: E402
    DATA,
    FLOOR,
    OURS,
    THEIRS,
    THEIRS07,
    NemoGym04,
    NemoGym07,
    Ours,
)

SYSTEMS = (OURS, THEIRS, THEIRS07, FLOOR)
PEERS = (THEIRS, THEIRS07)  # the NeMo Gym releases, each compared with ours


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bench-dir",
        type=Path,
        default=REPO.parent / "shared" / "bench",
        help="the NeMo Gym harness (benchlib.py, ngbench.py, fake_openai.py, floor_client.py)",
    )
    parser.add_argument(
        "--ngb", default=os.environ.get("NGBENCH_DIR", "/tmp/ngbench"), help="NeMo Gym's install (setup_nemo_gym.sh)"
    )
    parser.add_argument("--matrix", default="1@0,32@0,256@0,256@50", help="comma list of concurrency@latency_ms")
    parser.add_argument("--rows", type=int, default=5, help="example rows used (limit)")
    parser.add_argument("--repeats", type=int, default=400, help="rollouts per row: N = rows x repeats")
    parser.add_argument("--reps", type=int, default=3, help="collections per cell and system (medians reported)")
    parser.add_argument("--startup-reps", type=int, default=3, help="ng_run start-ups measured per system")
    parser.add_argument(
        "--warmup-repeats",
        type=int,
        default=40,
        help="rows x this many rollouts at c=32 per system, not recorded (0 = none)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma list of {', '.join(SYSTEMS)} (each NeMo Gym release's column needs its install)",
    )
    parser.add_argument("--floor-hops", type=int, default=8, help="HTTP calls per rollout of the floor client")
    parser.add_argument(
        "--fake-port",
        type=int,
        default=28080,
        help="the fake policy's port (outside NeMo Gym's random range 10001-20000)",
    )
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 5 x 40 rollouts, 1 rep, 1 start-up each (~2 min)"
    )
    parser.add_argument("--collect-timeout", type=float, default=1800)
    parser.add_argument("--startup-timeout", type=float, default=600)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.reps, args.startup_reps, args.warmup_repeats = 40, 1, 1, 4
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {', '.join(sorted(unknown))} (known: {', '.join(SYSTEMS)})")
    args.bench_dir = args.bench_dir.resolve()
    if not (args.bench_dir / "benchlib.py").is_file():
        parser.error(f"--bench-dir {args.bench_dir}: no benchlib.py there (the NeMo Gym harness)")
    if args.results_dir is None:
        args.results_dir = REPO / "results" / "bench" / "collection_vs_nemo_gym" / f"{dt.datetime.now():%Y%m%d_%H%M%S}"
    return args


def load_harness(bench_dir: Path) -> tuple[Any, Any]:
    """The harness's `benchlib` and `ngbench` modules."""
    sys.path.insert(0, str(bench_dir))
    import benchlib
    import ngbench

    return benchlib, ngbench


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def floor_run(
    bl: Any, args: argparse.Namespace, ng: Any, conc: int, latency_ms: float, rep: int, n: int, logs: Path
) -> dict[str, Any]:
    """One floor-client run against the running fake (the harness's `floor_client.py client`)."""
    python = str(Path(args.ngb) / "venv" / "bin" / "python")
    log = logs / f"floor_c{conc}_l{latency_ms:g}_r{rep}.log"
    argv = [
        python,
        str(args.bench_dir / "floor_client.py"),
        "client",
        "--url",
        f"http://127.0.0.1:{args.fake_port}",
        "--n",
        str(n),
        "--concurrency",
        str(conc),
        "--hops",
        str(args.floor_hops),
        "--example-jsonl",
        str(REPO / DATA),
    ]
    before = ng.fake_stats_now()
    result = bl.run_measured(
        argv, {"fake": ng.fake_pids}, log_path=log, timeout_s=args.collect_timeout, client_label="client"
    )
    after = ng.fake_stats_now()
    inner = json.loads(log.read_text().strip().splitlines()[-1]) if result["rc"] == 0 else {}
    result.update(
        {
            "kind": "measure",
            "system": FLOOR,
            "concurrency": conc,
            "latency_ms": latency_ms,
            "rep": rep,
            "n_rollouts": n,
            "hops": args.floor_hops,
            "rewards_1": n if not inner.get("errors") and result["rc"] == 0 else 0,
            "model_calls": after["responses"] - before["responses"],
            "rollouts_per_s": round(n / result["wall_s"], 2),
            "cpu_ms_per_rollout": round(1000 * result["cpu_s_total"] / n, 3),
        }
    )
    if inner.get("elapsed_s"):
        result["loop_s"] = inner["elapsed_s"]
        result["rollouts_per_s_loop"] = inner["rollouts_per_s"]
    return result


def check(row: dict[str, Any]) -> str:
    """'' for a correct run, else what is wrong (exit code, rewards, model calls)."""
    n = row["n_rollouts"]
    problems = []
    if row["rc"] != 0:
        problems.append(f"exit code {row['rc']}")
    if row["rewards_1"] != n:
        problems.append(f"{row['rewards_1']}/{n} rewards are 1.0")
    if row["model_calls"] != 2 * n:
        problems.append(f"{row['model_calls']} model calls, expected {2 * n}")
    return "; ".join(problems)


def summarize(rows: list[dict[str, Any]], startups: list[dict[str, Any]], bl: Any) -> dict[str, Any]:
    """Medians per (system, concurrency, latency), the ratios ours / each NeMo Gym release and ours / floor
    (`ours_vs_<system>`), CPU ms per rollout by process group, and the start-up medians."""
    cells: dict[tuple[float, int], dict[str, Any]] = {}
    for row in rows:
        cell = cells.setdefault((row["latency_ms"], row["concurrency"]), {})
        cell.setdefault(row["system"], []).append(row)
    table = []
    for (latency_ms, conc), systems in sorted(cells.items()):
        entry: dict[str, Any] = {"concurrency": conc, "latency_ms": latency_ms}
        for system, runs in systems.items():
            n = runs[0]["n_rollouts"]
            groups: dict[str, list[float]] = {}
            for run in runs:
                for group, cpu_s in run["cpu_s_by_group"].items():
                    groups.setdefault(group, []).append(cpu_s)
            entry[system] = {
                "reps": len(runs),
                "n_rollouts": n,
                "ok": all(not check(run) for run in runs),
                "rollouts_per_s": bl.median([run["rollouts_per_s"] for run in runs]),
                "rollouts_per_s_runs": [run["rollouts_per_s"] for run in runs],
                "rollouts_per_s_loop": bl.median([run.get("rollouts_per_s_loop") for run in runs]),
                "cpu_ms_per_rollout": bl.median([run["cpu_ms_per_rollout"] for run in runs]),
                "cpu_ms_per_rollout_by_group": {
                    group: round(1000 * bl.median(values) / n, 2) for group, values in sorted(groups.items())
                },
                "peak_rss_mb": bl.median([run["peak_rss_mb_total"] for run in runs]),
                "load_avg_1m": [run["load_avg_before"] for run in runs],
            }
        ours = entry.get(OURS)
        for other in (*PEERS, FLOOR):
            if ours and entry.get(other):
                entry[f"ours_vs_{other}"] = round(ours["rollouts_per_s"] / entry[other]["rollouts_per_s"], 2)
        table.append(entry)
    start = {}
    for system in (OURS, *PEERS):
        runs = [s for s in startups if s["system"] == system and s.get("recorded", True)]
        if runs:
            start[system] = {
                "t_ready_s_median": bl.median([s["t_ready_s"] for s in runs]),
                "t_ready_s_runs": [s["t_ready_s"] for s in runs],
                "idle_rss_mb_median": bl.median([s["idle_rss_mb"]["total"] for s in runs]),
            }
    return {"cells": table, "startup": start}


def summary_md(summary: dict[str, Any], args: argparse.Namespace) -> str:
    fmt = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    present = [system for system in SYSTEMS if any(system in cell for cell in summary["cells"])]
    peers = [system for system in present if system in PEERS]
    compared = [system for system in present if system != OURS]
    header = (
        ["concurrency", "latency ms"]
        + [f"{system} rollouts/s" for system in present]
        + [f"ours / {system}" for system in compared]
        + [f"CPU ms/rollout {system}" for system in (OURS, *peers) if system in present]
        + ["load avg (1 min)"]
    )
    lines = [
        (
            f"N = {args.rows} x {args.repeats} rollouts per collection, {args.reps} rep(s) per cell, floor ="
            f" {args.floor_hops} HTTP calls per rollout."
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for cell in summary["cells"]:
        loads = [x for system in present for x in cell.get(system, {}).get("load_avg_1m", [])]
        values = (
            [str(cell["concurrency"]), f"{cell['latency_ms']:g}"]
            + [fmt(cell.get(system, {}).get("rollouts_per_s")) for system in present]
            + [f"{fmt(cell.get(f'ours_vs_{system}'), 2)}x" for system in compared]
            + [fmt(cell.get(system, {}).get("cpu_ms_per_rollout"), 2) for system in (OURS, *peers) if system in present]
            + [f"{fmt(min(loads), 1)}-{fmt(max(loads), 1)}" if loads else "-"]
        )
        lines.append("| " + " | ".join(values) + " |")
    lines += ["", "CPU ms per rollout by process group (medians):", ""]
    for cell in summary["cells"]:
        for system in present:
            if system in cell:
                s = cell[system]
                ok = "" if s["ok"] else " **FAILED CHECKS**"
                lines.append(
                    f"- c={cell['concurrency']} {cell['latency_ms']:g} ms, {system}:"
                    f" {json.dumps(s['cpu_ms_per_rollout_by_group'])}; runs {s['rollouts_per_s_runs']} rollouts/s{ok}"
                )
    if summary["startup"]:
        lines += ["", "| start-up (warm) | ready s (median) | runs | idle RSS MiB |", "|---|---|---|---|"]
        for system, s in summary["startup"].items():
            lines.append(
                f"| {system} | {fmt(s['t_ready_s_median'], 2)} | {', '.join(fmt(x, 2) for x in s['t_ready_s_runs'])} |"
                f" {fmt(s['idle_rss_mb_median'], 0)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bl, ngbench = load_harness(args.bench_dir)
    rdir: Path = args.results_dir
    logs, work = rdir / "logs", rdir / "work"
    logs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    results = rdir / "results.jsonl"
    cells = ngbench.parse_matrix(args.matrix)
    if THEIRS in args.systems or FLOOR in args.systems:
        if not (Path(args.ngb) / "venv" / "bin" / "ng_run").exists():
            raise SystemExit(
                f"NeMo Gym 0.4.0 is not installed under {args.ngb}: run `bash {args.bench_dir}/setup_nemo_gym.sh` first"
            )
        subprocess.run(
            [
                "bash",
                "-c",
                (
                    "for d in resources_servers/example_single_tool_call responses_api_agents/simple_agent"
                    f" responses_api_models/openai_model; do mkdir -p '{args.ngb}'/venvs/$d; ln -sfn '{args.ngb}'/venv"
                    f" '{args.ngb}'/venvs/$d/.venv; done"
                ),
            ],
            check=True,
        )
    # The harness's NeMo Gym driver; its fake policy (NeMo Gym's venv Python: aiohttp, orjson, uvloop) serves both
    # systems.
    ng = ngbench.NemoGym(
        argparse.Namespace(
            ngb=args.ngb,
            results_dir=str(rdir),
            fake_port=args.fake_port,
            startup_timeout=args.startup_timeout,
            collect_timeout=args.collect_timeout,
            keep_outputs=False,
            ng_run_extra=[],
            collect_extra=[],
        )
    )
    ng.fake_stats_now = lambda: ngbench.fake_stats(args.fake_port)
    drivers: dict[str, Any] = {OURS: Ours(bl, args, logs, work), THEIRS: NemoGym04(ng, args)}
    if THEIRS07 in args.systems:  # installs 0.7.0 on first use (tests/nemo_gym_peer07.py)
        drivers[THEIRS07] = NemoGym07(bl, args, logs, work)
    measured = [system for system in (OURS, *PEERS) if system in args.systems]
    info = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_avg_start": os.getloadavg(),
        "nemo_gym_env": ngbench.env_info(argparse.Namespace(ngb=args.ngb)) if THEIRS in args.systems else None,
    }
    (rdir / "env.json").write_text(json.dumps(info, indent=1))
    startups: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    failures: list[str] = []

    def record(row: dict[str, Any], load_before: float) -> None:
        row["load_avg_before"], row["load_avg_after"] = load_before, load_average()
        bl.append_jsonl(results, row)
        if row["kind"] != "measure":
            return
        rows.append(row)
        problem = check(row)
        if problem:
            failures.append(
                f"{row['system']} c={row['concurrency']} {row['latency_ms']:g} ms rep {row['rep']}: {problem}"
            )
        print(
            f"{row['system']:>15} c={row['concurrency']:<3} {row['latency_ms']:>3g} ms rep {row['rep']}:"
            f" {row['rollouts_per_s']:8.1f} rollouts/s, {row['cpu_ms_per_rollout']:6.2f} CPU ms/rollout, load"
            f" {load_before:.1f}{' FAILED: ' + problem if problem else ''}",
            flush=True,
        )

    def collect(system: str, conc: int, latency_ms: float, rep: int, repeats: int, tag: str) -> None:
        load = load_average()
        record(drivers[system].collect(conc, latency_ms, rep, repeats, tag, ng.fake_pids, ng.fake_stats_now), load)

    try:
        ng.start_fake(cells[0][1])
        for system in (s for s in (OURS, THEIRS07) if s in measured):
            # the first start builds (ours: the servers' uv environment) or compiles: not recorded
            startups.append(drivers[system].start(0, record=False))
            drivers[system].stop()
        for index in range(args.startup_reps):  # interleaved; the last of each stays up for the collections
            for system in measured:
                startup = drivers[system].start(index + 1)
                startups.append(startup)
                bl.append_jsonl(results, startup)
                print(f"{system} start-up {index}: ready in {startup['t_ready_s']:.2f} s", flush=True)
                if index < args.startup_reps - 1:
                    drivers[system].stop()
        if args.warmup_repeats:
            for system in measured:
                collect(system, 32, cells[0][1], 0, args.warmup_repeats, "warmup")
        latencies = list(dict.fromkeys(latency for _, latency in cells))
        for latency_ms in latencies:
            ng.start_fake(latency_ms)
            for rep in range(args.reps):
                for conc in [c for c, lat in cells if lat == latency_ms]:
                    # the systems back to back, the order turning by rep so that drift hits each alike
                    for system in measured[rep % len(measured) :] + measured[: rep % len(measured)]:
                        collect(system, conc, latency_ms, rep, args.repeats, "measure")
                    if FLOOR in args.systems:
                        record(
                            floor_run(bl, args, ng, conc, latency_ms, rep, args.rows * args.repeats, logs),
                            load_average(),
                        )
    finally:
        stopped = {system: drivers[system].stop() for system in (OURS, THEIRS07) if system in drivers}
        bl.append_jsonl(results, {"kind": "final_stop", **stopped, **ng.stop_all()})
    summary = summarize(rows, startups, bl)
    summary["failures"] = failures
    summary["load_avg_end"] = os.getloadavg()
    (rdir / "summary.json").write_text(json.dumps(summary, indent=1))
    markdown = summary_md(summary, args)
    (rdir / "summary.md").write_text(markdown)
    print(markdown)
    print(f"results: {rdir}")
    if failures:
        print("FAILED CHECKS:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
