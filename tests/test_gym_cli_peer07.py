"""The commands of NeMo Gym 0.7.0 we added (`nemo_gym.cli.legacy`, reached through `gym` / `ng`) against 0.7.0 itself on
the same input, where the output is deterministic: `gym dataset render` (ng_materialize_prompts) byte for byte,
`gym list benchmarks --json` (ng_list_benchmarks) on the wheel's benchmarks, `gym env validate` (ng_validate)
on a wheel config, and the merged file of `gym eval aggregate` (ng_aggregate_rollouts) byte for byte.

0.7.0 is installed once by tests/nemo_gym_peer07.py; each of its commands takes 5-15 s to import on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nemo_gym_peer07 import peer07_env, peer07_json, peer07_site_packages, peer07_venv

pytestmark = [pytest.mark.integration, pytest.mark.peer, pytest.mark.timeout(600)]

OURS = Path(sys.executable).parent  # our console scripts (the project is installed in the test's environment)
EXAMPLE_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"


def _ours(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run([str(OURS / argv[0]), *argv[1:]], cwd=cwd, env=environ, capture_output=True, text=True)


def _theirs(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = [str(peer07_venv() / "bin" / argv[0]), *argv[1:]]
    return subprocess.run(command, cwd=cwd, env=peer07_env(), capture_output=True, text=True, timeout=300)


def test_dataset_render_writes_what_0_7_0_writes(tmp_path):
    rows = [
        {"question": "What is 2+2?", "expected_answer": "4", "responses_create_params": {"temperature": 0.5}},
        {"question": "Café {x}?", "expected_answer": "y", "metadata": {"k": [1, 2.5, None]}},
    ]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "prompt.yaml").write_text('system: "You answer. Use {{braces}}."\nuser: "Q: {question}"\n')
    ours = _ours(
        ["gym", "dataset", "render", "-i", "raw.jsonl", "--prompt-config", "prompt.yaml", "-o", "o.jsonl"], tmp_path
    )
    theirs = _theirs(["ng_materialize_prompts", "+input_jsonl_fpath=raw.jsonl", "+prompt_config=prompt.yaml",
                      "+output_jsonl_fpath=t.jsonl"], tmp_path)  # fmt: skip
    assert (ours.returncode, theirs.returncode) == (0, 0), ours.stderr + theirs.stderr
    assert (tmp_path / "o.jsonl").read_bytes() == (tmp_path / "t.jsonl").read_bytes()
    assert ours.stdout.replace("o.jsonl", "t.jsonl") == theirs.stdout


def test_list_benchmarks_json_is_0_7_0s(tmp_path):
    """Its 184 benchmarks: 171 with a manifest, 13 bare configs (our repository has none)."""
    ours = _ours(["ng_list_benchmarks", "+json=true"], tmp_path, NEMO_GYM_EXTRA_ROOTS=str(peer07_site_packages()))
    theirs = _theirs(["gym", "list", "benchmarks", "--json"], tmp_path)
    assert (ours.returncode, theirs.returncode) == (0, 0), ours.stderr + theirs.stderr
    listed = json.loads(ours.stdout)
    assert len(listed) > 150 and {e.get("status") for e in listed} == {"experimental", "no-manifest"}
    assert listed == json.loads(theirs.stdout)


def test_env_validate_judges_a_wheel_config_as_0_7_0_does():
    root = peer07_site_packages()
    for strict in ([], ["--strict"]):
        ours = _ours(["gym", "env", "validate", "--config", EXAMPLE_CONFIG, *strict], root)
        theirs = _theirs(["gym", "env", "validate", "--config", EXAMPLE_CONFIG, *strict], root)
        assert (ours.returncode == 0) == (theirs.returncode == 0) == (not strict), ours.stderr + theirs.stderr
        if not strict:  # valid, with a warning that the config names no model server
            assert ours.stdout == theirs.stdout.replace("\x1b[32m", "").replace("\x1b[0m", "") == "✓ Config is valid.\n"
            assert "policy_model" in ours.stderr and "policy_model" in theirs.stderr


# 0.7.0's own aggregation with its metrics call left out (it needs its head server): the merged file it writes
AGGREGATE_07 = """
import asyncio, sys
from nemo_gym import rollout_collection as rc
async def no_metrics(self, *args, **kwargs):
    return None
rc.RolloutCollectionHelper._call_aggregate_metrics = no_metrics
config = rc.RolloutAggregationConfig(input_glob=sys.argv[1], output_jsonl_fpath=sys.argv[2], disable_health_check=True)
asyncio.run(rc.RolloutAggregationHelper().run_from_config(config))
"""


def test_eval_aggregate_merges_shards_as_0_7_0_does(tmp_path):
    def row(task: int, rollout: int, reward: float) -> dict:
        return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward, "agent_ref": {"name": "a"},
                "response": {"output": [{"type": "message", "content": "é\u2028x"}]}}  # fmt: skip

    shards = {"r-2.jsonl": [row(1, 1, 0.0), row(0, 1, 1.0)], "r-1.jsonl": [row(1, 0, 0.5), row(0, 0, 1.0)]}
    for name, rows in shards.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r-1_materialized_inputs.jsonl").write_text("{}\n")  # a side file: not a shard
    ours = _ours(["gym", "eval", "aggregate", "-i", "r-*.jsonl", "-o", "out/ours.jsonl"], tmp_path)
    theirs = subprocess.run(
        [str(peer07_venv() / "bin/python"), "-c", AGGREGATE_07, "r-*.jsonl", "out/theirs.jsonl"],
        cwd=tmp_path, env=peer07_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (ours.returncode, theirs.returncode) == (0, 0), ours.stderr + theirs.stderr
    assert (tmp_path / "out/ours.jsonl").read_bytes() == (tmp_path / "out/theirs.jsonl").read_bytes()
    for line in (
        "Aggregating 2 shard(s):",
        "  - r-1.jsonl",
        "  - r-2.jsonl",
        "Loaded 4 rollout record(s) from 2 shard(s)",
    ):
        assert line in ours.stdout and line in theirs.stdout


# every subcommand of an argparse parser with its option strings: {"env start": ["--config", ...]}
WALK_PARSER = """
import argparse


def walk(parser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {" ".join(path): sorted(o for a in parser._actions for o in a.option_strings)}
    found = {}
    for sub in subs:
        for name, child in sub.choices.items():
            found.update(walk(child, (*path, name)))
    return found
"""


def test_every_subcommand_and_flag_of_0_7_0s_gym_is_ours_or_refused():
    """0.7.0's `gym` parser, walked: each of its subcommands is one of ours or refused by name (exit 2, with why),
    and each flag of a subcommand we run is registered on ours (taken, or refused naming why), so none is ever
    silently dropped or unknown."""
    from nemo_gym.cli import gym_router
    from nemo_gym.cli.gym_listing import CATALOG_SEARCH

    script = (
        WALK_PARSER + "import json\nfrom nemo_gym.cli.main import build_parser\nprint(json.dumps(walk(build_parser())))"
    )
    theirs = peer07_json(script, timeout=300)
    scope: dict = {}
    exec(WALK_PARSER, scope)
    ours = scope["walk"](gym_router.build_parser("gym"))
    # 0.7.0's `gym search [KIND] QUERY` is one subcommand with positionals; ours routes a kind to its listing's search
    # and the bare query to the catalog's (`gym search QUERY`: CATALOG_SEARCH)
    ours["search"] = ours.pop(CATALOG_SEARCH)
    assert len(theirs) > 30
    missing = sorted(set(theirs) - set(ours) - set(gym_router.UNSUPPORTED))
    assert missing == [], f"0.7.0 subcommands neither ours nor refused: {missing}"
    unknown = {command: sorted(set(flags) - set(ours[command])) for command, flags in theirs.items() if command in ours}
    assert {command: flags for command, flags in unknown.items() if flags} == {}
