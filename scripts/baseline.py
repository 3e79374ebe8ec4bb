"""Measure the SmolLM2-135M-Instruct baseline of environments and write it into their READMEs.

    .venv/bin/python scripts/baseline.py <environment> [<environment> ...] [--repeats 4] [--limit 50]
    [--max-output-tokens 256] [--write-readme]

Starts one `ng_run` with `resources_servers/<environment>/configs/<environment>.yaml` of every environment named
and the embedded policy (`responses_api_models/vllm_model/configs/vllm_model.yaml`); for each environment collects
`repeats` rollouts of the first `limit` tasks of its first non-example dataset, profiles them (pass threshold 1.0),
prints the figures, and with `--write-readme` replaces the README's `## Baseline` section with them. Stops the
servers it started.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO))

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config  # noqa: E402
from nemo_gym.config.server_instances import server_instances  # noqa: E402


def baseline_dataset(environment: str) -> tuple[str, Path]:
    """(agent instance, dataset path) of the environment's first train/validation/benchmark dataset."""
    config = REPO / "resources_servers" / environment / "configs" / f"{environment}.yaml"
    policy = REPO / "responses_api_models/vllm_model/configs/vllm_model.yaml"
    loaded = load_config([f"+config_paths=[{config},{policy}]"], resolve=False)
    for instance in server_instances(loaded, check_dirs=False):
        for dataset in instance.fields.get("datasets", []):
            if dataset.get("type") != "example" and instance.server_type == "responses_api_agents":
                return instance.name, REPO / dataset["jsonl_fpath"]
    raise SystemExit(f"{config}: no agent with a non-example dataset to measure")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("environments", nargs="+")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    targets = {env: baseline_dataset(env) for env in args.environments}
    out = REPO / "results" / "baseline"
    out.mkdir(parents=True, exist_ok=True)
    yamls = [f"resources_servers/{env}/configs/{env}.yaml" for env in args.environments] + [
        "responses_api_models/vllm_model/configs/vllm_model.yaml"
    ]
    log_path = out / "ng_run.log"
    with log_path.open("w") as log:
        run = subprocess.Popen(
            [str(BIN / "ng_run"), f"+config_paths=[{','.join(yamls)}]", "+head_server.port=0"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = time.monotonic()
    texts = {}
    try:
        while not (match := re.search(r"Head server: (\S+)", log_path.read_text())):
            if run.poll() is not None:
                print(log_path.read_text(), file=sys.stderr)
                return 1
            time.sleep(1)
        print(f"servers ready in {time.monotonic() - started:.0f} s", flush=True)
        for env, (agent, dataset) in targets.items():
            texts[env] = measure(env, agent, dataset, match.group(1), out / env, args)
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
    for env, text in texts.items():
        print(f"{env}: {text}")
        if args.write_readme and text:
            write_readme(env, text)
    return 0 if all(texts.values()) else 1


def measure(env: str, agent: str, dataset: Path, head: str, out: Path, args: argparse.Namespace) -> str | None:
    """Collect and profile one environment's baseline; the README text, or None when collection failed."""
    out.mkdir(parents=True, exist_ok=True)
    rollouts = out / "rollouts.jsonl"
    collect = [
        str(BIN / "ng_collect_rollouts"),
        f"+head_server_url={head}",
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={dataset}",
        f"+output_jsonl_fpath={rollouts}",
        f"+limit={args.limit}",
        f"+num_repeats={args.repeats}",
        f"+num_samples_in_parallel={args.parallel}",
        f"+responses_create_params={{temperature: 1.0, max_output_tokens: {args.max_output_tokens}}}",
        "+resume=false",
        "+progress=false",
    ]
    t0 = time.monotonic()
    if subprocess.run(collect, cwd=REPO).returncode != 0:
        return None
    collect_s = time.monotonic() - t0
    profile = out / "profile.jsonl"
    tasks_file = rollouts.with_name("rollouts_materialized_inputs.jsonl")  # exactly the tasks collected (limit applied)
    subprocess.run(
        [
            str(BIN / "ng_profile"),
            f"+input_jsonl_fpath={tasks_file}",
            f"+rollouts_jsonl_fpath={rollouts}",
            f"+output_jsonl_fpath={profile}",
            "+pass_threshold=1.0",
        ],
        cwd=REPO,
        check=True,
    )
    rows = read_jsonl(rollouts)
    mean = sum(r["reward"] for r in rows) / len(rows)
    passed = sum(r["reward"] >= 1.0 for r in rows) / len(rows)
    tasks = len({r["_ng_task_index"] for r in rows})
    return (
        f"SmolLM2-135M-Instruct (embedded default, vLLM on CPU), {tasks} tasks of `{dataset.relative_to(REPO)}` x"
        f" {args.repeats} repeats, temperature 1.0, max_output_tokens {args.max_output_tokens}: **mean reward"
        f" {mean:.3f}**, **pass rate {passed:.3f}** (reward >= 1.0), {len(rows)} rollouts in {collect_s:.0f} s."
        f" Reproduce: `.venv/bin/python scripts/baseline.py {env} --repeats {args.repeats} --limit {args.limit}"
        f" --max-output-tokens {args.max_output_tokens}`."
    )


def write_readme(env: str, text: str) -> None:
    readme = REPO / "resources_servers" / env / "README.md"
    content = readme.read_text()
    section = f"## Baseline\n\n{text}\n"
    if "## Baseline" in content:
        content = re.sub(r"## Baseline\n.*?(?=\n## |\Z)", lambda _: section, content, flags=re.S)
    else:
        content = content.rstrip() + "\n\n" + section
    readme.write_text(content)


if __name__ == "__main__":
    sys.exit(main())
