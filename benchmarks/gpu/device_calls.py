"""The device calls that carry the parts of benchmarks/gpu/carry.sh and run the GPU suite (standard library only).

    python3 benchmarks/gpu/device_calls.py [--out results/gpu-calls.json] [--limit-mib 60]

The parts are the folders `.vc<k>` (vLLM, from ../shared/gpu/carry_vllm.sh; the one with install.sh goes last) and
`.vw<k>` (the trainer's wheels) at the repository root. Each call carries at most `--limit-mib` MiB (the device takes
64 MiB a call; the rest is headroom): the parts are packed largest first into as few calls as fit, the install part
with whatever fits beside it into the last call, which runs the suite. Prints the calls and writes them as JSON
(`[{"carry": [...], "command": "...", "timeout_s": ...}]`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
RUN_TIMEOUT_S = 600  # the device's limit for one call; benchmarks/gpu/device.sh fits the suite into it


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def parts(root: Path) -> dict[str, int]:
    """`.vc<k>` and `.vw<k>` folders of `root` → their size in bytes, in k order."""
    found = [path for path in root.iterdir() if path.is_dir() and re.fullmatch(r"\.v[cw]\d+", path.name)]
    return {path.name: folder_bytes(path) for path in sorted(found, key=lambda p: (p.name[:3], int(p.name[3:])))}


def plan(sizes: dict[str, int], install: str, limit_bytes: int) -> list[list[str]]:
    """Calls (lists of part names): the parts but `install` packed first-fit, largest first, under `limit_bytes`; then
    a last call with `install` and the smallest parts that still fit beside it.

    Raises:
        ValueError: a part alone is over the limit.
    """
    over = [name for name, size in sizes.items() if size > limit_bytes]
    if over:
        raise ValueError(f"parts over {limit_bytes // MIB} MiB: {', '.join(over)}")
    last, room = [install], limit_bytes - sizes[install]
    rest = sorted((name for name in sizes if name != install), key=lambda name: sizes[name])
    while rest and sizes[rest[0]] <= room:  # the smallest ride with the last call
        room -= sizes[rest[0]]
        last.append(rest.pop(0))
    calls: list[list] = []  # [bytes, part names]
    for name in sorted(rest, key=lambda name: -sizes[name]):
        for call in calls:
            if call[0] + sizes[name] <= limit_bytes:
                call[0] += sizes[name]
                call[1].append(name)
                break
        else:
            calls.append([sizes[name], [name]])
    return [sorted(names) for _, names in calls] + [last]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results/gpu-calls.json")
    parser.add_argument("--limit-mib", type=int, default=60)
    args = parser.parse_args(argv)
    sizes = parts(REPO)
    installs = [name for name in sizes if (REPO / name / "install.sh").is_file()]
    if len(installs) != 1:
        print(
            f"expected one part with install.sh (bash benchmarks/gpu/carry.sh makes them), found {installs}",
            file=sys.stderr,
        )
        return 1
    planned = plan(sizes, installs[0], args.limit_mib * MIB)
    calls = [
        {"carry": names, "command": f"bash benchmarks/gpu/device.sh stash {' '.join(names)}", "timeout_s": 120}
        for names in planned[:-1]
    ]
    calls.append({"carry": planned[-1], "command": "bash benchmarks/gpu/device.sh run", "timeout_s": RUN_TIMEOUT_S})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(calls, indent=2) + "\n")
    print(
        f"{len(calls)} device calls, back to back on one lease ({sum(sizes.values()) / MIB:.0f} MiB in {len(sizes)}"
        f" parts; {args.out}):"
    )
    for number, call in enumerate(calls, 1):
        size = sum(sizes[name] for name in call["carry"]) / MIB
        print(
            f"  {number:2}. carry {json.dumps(call['carry'])} ({size:.0f} MiB), timeout_s {call['timeout_s']}:"
            f" {call['command']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
