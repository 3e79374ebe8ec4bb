"""Survey of the resources servers of NVIDIA NeMo Gym's wheel: which run unmodified under our `ng_run` here, and why
the others do not. Writes docs/nemo_gym_wheel_servers.md (NeMo Gym 0.4.0) and docs/nemo_gym07_servers.md (0.7.0).

    .venv/bin/python scripts/survey_nemo_gym_servers.py [--release 0.7.0] [--site-packages DIR] [--write FILE.md]
    .venv/bin/python scripts/survey_nemo_gym_servers.py [--release 0.7.0] --try OUT_DIR name[:config.yaml] ...

The first form reads every `<site-packages>/resources_servers/<name>/` of the wheel (default: the NeMo Gym venv of
`tests/nemo_gym_peer.py`, `$NGBENCH_DIR/venv`, for 0.4.0; of `tests/nemo_gym_peer07.py`, `$NGBENCH07_DIR/venv`, for
0.7.0): its requirements (lines from git or a URL cannot install from the package index), its configs (agents,
environment servers, model servers it calls, environment variables), its example rows, and whether our ng_run
recognises it as a NeMo Gym folder; the verdict of each server is the release's table (`VERDICTS` below for 0.4.0,
`scripts/nemo_gym07_verdicts.py` for 0.7.0: what a run here showed, or what in the server's code stops it here), else
the first static reason that rules it out.

`--try` runs the named servers (a config file of theirs, default `<name>.yaml`) under our ng_run with the fake
policy of `../shared/bench/fake_openai.py` (a judge reference to a model server the config does not define is
pointed at `policy_model`) and collects each agent's `data/example.jsonl` once with our ng_collect_rollouts: how
the `runs here` verdicts were found. `tests/test_nemo_gym_wheel_servers.py` checks the rewards of a dozen of them
against NeMo Gym 0.4.0's own ng_run, `tests/test_nemo_gym07.py` sixteen against 0.7.0's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nemo_gym.orchestration.upstream_servers import release_requirements  # noqa: E402
from nemo_gym.upstream.detect import detect_framework
from scripts import nemo_gym07_verdicts as v07  # noqa: E402

# environment_servers: NeMo Gym 0.7.0's servers in front of an agent (legacy_agent, single_agent_turn, ...)
TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")


def site_packages(bench_dir: Path) -> Path:
    """The site-packages of the NeMo Gym venv under `bench_dir` (where the wheel's server folders are)."""
    return bench_dir / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


DEFAULT_SITE = site_packages(Path(os.environ.get("NGBENCH_DIR", "/tmp/ngbench")))
FAKE = REPO.parent / "shared" / "bench" / "fake_openai.py"

# Servers checked against NeMo Gym's own ng_run, row by row (tests/test_nemo_gym_wheel_servers.py).
TESTED = (
    "example_single_tool_call",
    "example_session_state_mgmt",
    "example_tool_call_multireward",
    "workplace_assistant",
    "ugphysics_judge",
    "multichallenge",
    "text_to_sql",
    "simpleqa",
    "mcqa",
    "gpqa_diamond",
    "structeval",
    "example_multi_turn_gymnasium",
)

RUNS = "runs"
NO = "does not run here"
# name -> (verdict, why). RUNS: started under our ng_run with `--try` (its <name>.yaml config unless said) and its
# example rows collected with the fake policy (a judge reference the config does not define pointed at policy_model).
VERDICTS: dict[str, tuple[str, str]] = {
    "example_single_tool_call": (RUNS, "tool calls; reward 1.0 on every row with the fake"),
    "example_session_state_mgmt": (
        RUNS,
        "per-session state: /seed_session, the tools and /verify share one counter per session",
    ),
    "example_tool_call_multireward": (RUNS, "rewards 2.0 and 1.0 with the fake"),
    "example_multi_step": (RUNS, "multi-step tool use"),
    "example_multi_turn_gymnasium": (RUNS, "gymnasium_agent"),
    "workplace_assistant": (RUNS, "stateful tools per session"),
    "multichallenge": (RUNS, "judge: calls `policy_model` itself (one call per rubric question)"),
    "text_to_sql": (RUNS, "judge: calls `policy_model` itself"),
    "simpleqa": (RUNS, "judge: its `genrm_model` reference pointed at `policy_model`"),
    "ugphysics_judge": (
        RUNS,
        (
            "judge through /v1/chat/completions (its `judge_model` reference pointed at `policy_model`), asked right"
            " after a forked math-verify child exits: our policy_model refused it (401) until the peer-policy fix"
        ),
    ),
    "physics_judge": (RUNS, "judge: its `judge_model` reference pointed at `policy_model`; math-verify"),
    "math_with_judge": (RUNS, "judge: calls `policy_model` itself; math-verify"),
    "math_with_autograder": (RUNS, "judge: its `judge_model` reference pointed at `policy_model`; math-verify"),
    "polymath": (RUNS, "judge: calls `policy_model` itself; math-verify"),
    "equivalence_llm_judge": (RUNS, "judge: calls `policy_model` itself; datasets==4.0.0 in its own environment"),
    "proof_judge": (RUNS, "judge: calls `policy_model` itself"),
    "proof_verification": (RUNS, "judge: calls `policy_model` itself"),
    "terminus_judge": (RUNS, "config terminus_judge_simple.yaml (judge `policy_model`); openapi-schema-validator"),
    "inverse_if": (RUNS, "judge: its `judge_model` reference pointed at `policy_model`"),
    "abstention": (RUNS, "judge: its `genrm_model` reference pointed at `policy_model`"),
    "aalcr": (RUNS, "judge: its `Qwen3-235B-A22B-Instruct-2507-FP8` reference pointed at `policy_model`"),
    "omniscience": (RUNS, "judge: its `genrm_model` reference pointed at `policy_model`"),
    "imo_proofbench_judge": (
        RUNS,
        "judge: its own `judge_model` (NeMo Gym's openai_model) with +judge_base_url at the fake",
    ),
    "frontierscience_judge": (
        RUNS,
        "judge: its own `judge_model` (NeMo Gym's openai_model) with +judge_base_url at the fake",
    ),
    "over_refusal_detection": (
        RUNS,
        "judge: its own `judge_model` (NeMo Gym's openai_model) with +judge_base_url at the fake; rewards 0.5",
    ),
    "equivalence_rule": (RUNS, "config lc.yaml"),
    "arc_agi": (RUNS, ""),
    "nvarc": (RUNS, "config inductive.yaml"),
    "xlam_fc": (RUNS, ""),
    "format_verification": (RUNS, "config freeform_formatting.yaml"),
    "graphwalks": (RUNS, "requirement tiktoken (not used at run time)"),
    "mrcr": (RUNS, "requirement tiktoken (not used at run time)"),
    "mcqa": (RUNS, "requirement tiktoken"),
    "gpqa_diamond": (
        RUNS,
        "imports resources_servers.mcqa.app: recognised as a NeMo Gym folder through it (detect_framework fix)",
    ),
    "bunsenbench_chemistry_mcq": (RUNS, "imports resources_servers.mcqa.app (see gpqa_diamond)"),
    "calendar": (RUNS, "requirement rich"),
    "hotpotqa_qa": (RUNS, ""),
    "math_proof_judgement": (RUNS, ""),
    "math_advanced_calculations": (RUNS, ""),
    "math_with_code": (RUNS, "requirements numpy, scipy, pandas"),
    "imo_gradingbench": (RUNS, ""),
    "proof_genselect": (RUNS, ""),
    "ruler": (RUNS, ""),
    "structeval": (RUNS, "config structeval_nonrenderable.yaml; xmltodict, toml"),
    "structured_outputs": (
        RUNS,
        "config structured_outputs_v4.yaml (non_executing_simple_agent; its example rows name that agent)",
    ),
    "indirect_prompt_injection": (RUNS, ""),
    "reasoning_gym": (RUNS, "requirement reasoning-gym"),
    "swe_pivot": (RUNS, "tool_simulation_agent"),
    "single_step_tool_use_with_argument_comparison": (RUNS, "tool_simulation_agent; rewards 0 and 1 with the fake"),
    "terminal_multi_harness": (
        RUNS,
        "config terminal_multi_harness_codex.yaml (tool_simulation_agent; its rows name that agent); rewards 1 and 0",
    ),
    "code_gen": (RUNS, "numpy 2.2.6 in its own environment; the unit tests of its rows run locally"),
    "verifif": (RUNS, "its judge defaults to `policy_model`"),
    "swerl_llm_judge": (RUNS, "requirements datasets, transformers, tiktoken"),
    "speed_bench": (RUNS, "its speed_bench_agent; no vLLM /metrics to read behind the fake"),
    "jailbreak_detection": (
        RUNS,
        (
            "config jailbreak_detection_nemotron_combined_reward_tp8.yaml (5 agents), its `safety_judge_model`"
            " reference pointed at `policy_model` instead of the vLLM judge"
        ),
    ),
    "arena_judge": (
        RUNS,
        "its own judge instance (NeMo Gym's openai_model) pointed at the fake with ++...openai_base_url",
    ),
    "circle_click": (RUNS, "image rows for a vision model (the text-only fake ignores the image)"),
    "circle_count": (RUNS, "image rows for a vision model (the text-only fake ignores the image)"),
    "labbench2_vlm": (
        RUNS,
        "its labbench2_vlm_agent; image/PDF rows for a vision model (the text-only fake ignores them)",
    ),
    "asr_with_pc": (
        RUNS,
        "audio rows for a speech model (the text-only fake ignores the audio); jiwer, whisper_normalizer",
    ),
    "blackjack": (RUNS, "gymnasium_agent; rewards depend on an unseeded deck (random.Random()), so two runs differ"),
    "grl_tetris": (
        RUNS,
        (
            "gymnasium_agent; starts and answers, but the fake's text has no <action> tag, which the server "
            "answers with an error (under NeMo Gym too): its rows need a real policy"
        ),
    ),
    "grl_sokoban": (RUNS, "gymnasium_agent, gym-sokoban; as grl_tetris, the fake's text is no action"),
    # did not run, or cannot: what stops them here
    "gymnasium": (
        NO,
        (
            "tried: exits at once with code 0: a base class for other servers (its config says 'Not a standalone"
            " server'; base.py starts nothing)"
        ),
    ),
    "genrm_compare": (
        NO,
        (
            "not tried, from its code and config: its judge is a GenRM reward model that its own genrm_model server"
            " runs on vLLM (data parallel, GPUs)"
        ),
    ),
    "example_mcp_weather": (
        NO,
        (
            "not tried, from its code and config: its agent is claude_code_agent: Claude Code's CLI (downloaded at"
            " start) and Anthropic's API"
        ),
    ),
    "vlm_eval_kit": (
        NO,
        (
            "not tried, from its code and config: installs through pyproject.toml (no requirements.txt: our ng_run"
            " installs only requirements.txt), torch and VLMEvalKit; image benchmarks for a vision model, data fetched"
            " from the web"
        ),
    ),
    "aviary": (
        NO,
        (
            "not tried, from its code and config: its agent (aviary_agent) and fhaviary's environments load data sets"
            " from the Hugging Face hub at run time"
        ),
    ),
    "browsecomp_advanced_harness": (
        NO,
        "not tried, from its code and config: web search through the Tavily API (API key, internet)",
    ),
    "tavily_search": (NO, "not tried, from its code and config: web search through the Tavily API (API key, internet)"),
    "google_search": (NO, "not tried, from its code and config: web search through Google's API (API key, internet)"),
    "finance_sec_search": (NO, "not tried, from its code and config: SEC EDGAR and Tavily over the internet"),
    "cvdp": (NO, "not tried, from its code and config: runs hardware-verification harnesses in Docker/Apptainer"),
    "swerl_gen": (NO, "not tried, from its code and config: runs SWE-bench tests in Singularity/Docker images"),
    "math_formal_lean": (
        NO,
        "not tried, from its code and config: needs a Lean 4 sandbox server (NEMO_SKILLS_SANDBOX_HOST/PORT)",
    ),
    "rdkit_chemistry": (
        NO,
        (
            "not tried, from its code and config: needs a NeMo Skills sandbox (RDKit) server, and its config runs the"
            " ns_tools folder (a git requirement)"
        ),
    ),
    "gdpval": (
        NO,
        (
            "not tried, from its code and config: needs LibreOffice and a judge model of its own"
            " (`gdpval_judge_model`); documents converted on the host"
        ),
    ),
    "wmt_translation": (
        NO,
        (
            "not tried, from its code and config: COMET scoring: torch 2.12 plus a COMET model downloaded from the"
            " Hugging Face hub"
        ),
    ),
    # tried with --try; how they stopped
    "ether0": (NO, "tried: exits at start, cloning its ether0 repository from GitHub (no git host reachable here)"),
    "newton_bench": (NO, "tried: exits at start, cloning NewtonBench from GitHub"),
    "bird_sql": (NO, "tried: exits at start, downloading the BIRD databases from the web"),
    "spider2_lite": (NO, "tried: exits at start, downloading the Spider 2.0-lite databases from the web"),
    "evalplus": (NO, "tried: exits at start, downloading the HumanEval+/MBPP+ data sets from the web"),
    "bigcodebench": (
        NO,
        (
            "tried: exits at start: it builds a Python 3.10 environment (uv venv --python 3.10), which needs a Python"
            " 3.10 download; then BigCodeBench's requirements from GitHub"
        ),
    ),
    "critpt": (
        NO,
        "tried: exits at start: its config needs an api_key for Artificial Analysis' grading API (internet)",
    ),
    "competitive_coding_challenges": (
        NO,
        "tried: exits at start: 'Sandbox not ready after waiting 240s' (needs a NeMo Skills code sandbox server)",
    ),
    "scicode": (
        NO,
        (
            "tried: starts, but every rollout fails: 'test_data_fpath is not configured. Stage SciCode's test_data.h5'"
            " (a data file the wheel does not ship, downloaded by hand)"
        ),
    ),
    "xstest": (
        NO,
        "tried: its judge is a local_vllm_model instance (WildGuard served by vLLM, a GPU): 'No module named vllm'",
    ),
}


def instances(config: Any):
    """(name, server type, implementation, fields) of each server instance of a loaded YAML mapping (0.7.0's
    directives beside the server type, e.g. `_inherit_from`, left out)."""
    for name, value in (config or {}).items() if isinstance(config, dict) else []:
        if isinstance(value, dict):
            value = {key: inner for key, inner in value.items() if not str(key).startswith("_")}
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in TYPES:
            server_type, inner = next(iter(value.items()))
            if isinstance(inner, dict) and len(inner) == 1:
                implementation, fields = next(iter(inner.items()))
                yield name, server_type, implementation, fields or {}


def model_refs(obj: Any, path: tuple[str, ...] = ()):
    """(path, name) of every `{type: responses_api_models, name: ...}` reference inside `obj`."""
    if isinstance(obj, dict):
        if obj.get("type") == "responses_api_models" and "name" in obj:
            yield path, str(obj["name"])
        for key, value in obj.items():
            yield from model_refs(value, path + (str(key),))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            yield from model_refs(value, path + (str(index),))


def survey_one(folder: Path, verdicts: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """What the survey reads of one resources server folder, and its verdict from `verdicts` (else a static one)."""
    raw = (
        [line.strip() for line in (folder / "requirements.txt").read_text().splitlines()]
        if (folder / "requirements.txt").is_file()
        else []
    )
    requirements = release_requirements(folder)
    from_git = [line for line in requirements if re.search(r"git\+|https?://|\.whl\b", line)]
    pyproject_git = (folder / "pyproject.toml").is_file() and "git =" in (folder / "pyproject.toml").read_text()
    configs, agents, environments, judges, env_vars, entrypoints = [], set(), set(), set(), set(), []
    for path in sorted((folder / "configs").glob("*.yaml")):
        text = path.read_text()
        env_vars |= set(re.findall(r"oc\.env:([A-Za-z0-9_]+)", text))
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        found = list(instances(config))
        if any(t == "resources_servers" for _, t, _, _ in found):
            configs.append(path.name)
        defined = {name: impl for name, t, impl, _ in found if t == "responses_api_models"}
        for _name, server_type, implementation, fields in found:
            if server_type == "responses_api_agents":
                agents.add(implementation)
            if server_type == "environment_servers":
                environments.add(implementation)
            if server_type == "resources_servers":
                entrypoints.append(str(fields.get("entrypoint") or "app.py"))
                for _, ref in model_refs(fields):
                    judges.add(f"{ref} ({defined[ref]})" if ref in defined else ref)
    example = folder / "data" / "example.jsonl"
    rows = sum(1 for line in example.read_text().splitlines() if line.strip()) if example.is_file() else 0
    entry = {
        "name": folder.name,
        "requirements": requirements,
        "from_git": from_git,
        "pyproject_git": pyproject_git,
        "configs": configs,
        "agents": sorted(agents),
        "environments": sorted(environments),
        "judges": sorted(judges),
        "env": sorted(env_vars),
        "example_rows": rows,
        "has_app": (folder / "app.py").is_file(),
        "recognised": detect_framework(folder, (entrypoints or ["app.py"])[0]) == "nemo_gym",
        "nemo_gym_line": any("../.." in line for line in raw),
    }
    entry["verdict"], entry["why"] = verdict(entry, verdicts)
    return entry


def short(requirement: str) -> str:
    """A requirement line from git or a URL shortened to what it installs (`segale (git)`, `en_core_web_sm-3.8.0
    (URL)`)."""
    if not re.search(r"git\+|https?://", requirement):
        return requirement
    name, _, source = requirement.partition(" @ ") if " @ " in requirement else ("", "", requirement)
    egg = re.search(r"#egg=([A-Za-z0-9_.-]+)", source)
    last = (
        egg.group(1) if egg else re.sub(r"(\.git)?(@[^/]*)?$", "", source.split("#")[0].rstrip("/")).rsplit("/", 1)[-1]
    )
    last = re.sub(r"-py3-none-any\.whl$", "", last)
    return f"{name.strip() or last} ({'git' if 'git+' in source else 'URL'})"


def verdict(entry: dict[str, Any], verdicts: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if entry["from_git"]:
        return NO, "requirement from git or a URL: " + ", ".join(short(line) for line in entry["from_git"])
    if entry["pyproject_git"]:
        return (
            NO,
            (
                "installs through its pyproject.toml, with a dependency from git (no requirements.txt to install from"
                " the index)"
            ),
        )
    if entry["name"] in verdicts:
        return verdicts[entry["name"]]
    if not entry["example_rows"]:
        return NO, "no data/example.jsonl"
    return "not tried", "requirements install from the index; not run here yet (`--try` it)"


# the notes under the counts of the 0.4.0 survey: how our ng_run runs the wheel's folders
NOTES04 = [
    "Notes on how our ng_run runs them, seen here:",
    "",
    (
        "- A folder that imports another server folder of its tree (`from resources_servers.mcqa.app import ...`)"
        " gets the copy of that folder inside the NeMo Gym release's environment, as under NeMo Gym's own ng_run"
        " from its wheel (an editable NeMo Gym checkout would give the checkout's folder): for the wheel's folders"
        " the two are the same files."
    ),
    (
        "- A folder without `requirements.txt` that declares its packages in `pyproject.toml` (code_fim,"
        " vlm_eval_kit) gets only the NeMo Gym release: NeMo Gym's ng_run installs such a folder with `uv pip"
        " install -e .`, ours reads `requirements.txt` only. Neither of the two wheel folders could run here"
        " anyway."
    ),
    (
        "- The judges' calls reach our `policy_model` without our run token: ng_run lets the NeMo Gym servers it"
        " started in (`nemo_gym.serving.auth.PeerPolicy`)."
    ),
    "",
]


def verdict_groups(entries: list[dict[str, Any]], tested: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """The entries that run, run and are tested, do not run, are not tried, and do not run for a git requirement."""
    runs = [e for e in entries if e["verdict"] == RUNS]
    no = [e for e in entries if e["verdict"] == NO]
    return {
        "runs": runs,
        "tested": [e for e in runs if e["name"] in tested],
        "no": no,
        "other": [e for e in entries if e["verdict"] not in (RUNS, NO)],
        "git": [e for e in no if e["from_git"] or e["pyproject_git"]],
    }


def intro04(entries: list[dict[str, Any]]) -> list[str]:
    """The text above the table of NeMo Gym 0.4.0's survey: what "runs" means, the counts, notes."""
    group = verdict_groups(entries, TESTED)
    runs, tested, no, other, git = (group[key] for key in ("runs", "tested", "no", "other", "git"))
    lines = [
        "# NeMo Gym 0.4.0's resources servers under our ng_run",
        "",
        (
            f"Generated by `scripts/survey_nemo_gym_servers.py` from the {len(entries)} resources server folders of"
            ' NVIDIA NeMo Gym 0.4.0\'s wheel (installed by `tests/nemo_gym_peer.py`). "Runs" means: started'
            " unmodified under our `ng_run` from the wheel's folder with its own config file (each NeMo Gym folder in"
            " an environment of its own with the NeMo Gym 0.4.0 release and its `requirements.txt` from the package"
            " index), our `openai_model` as `policy_model` over the fake policy of `../shared/bench/fake_openai.py`,"
            " and every row of its `data/example.jsonl` collected by our `ng_collect_rollouts` (`--try`; a judge"
            " reference to a model server the config does not define pointed at `policy_model`)."
        ),
        "",
        f"- **{len(runs)} run here unmodified.** Of these, grl_tetris and grl_sokoban answer the fake policy's text (no"
        " action) with an error, so their rows need a real policy; blackjack's rewards are random (an unseeded deck);"
        " circle_click, circle_count, labbench2_vlm and asr_with_pc have image or audio rows that the text-only fake"
        f" ignores. {len(tested)} are checked row by row against NeMo Gym's own `ng_run` and `ng_collect_rollouts` by"
        " `tests/test_nemo_gym_wheel_servers.py` (same reward, same verifier fields, same trajectory): "
        + ", ".join(e["name"] for e in tested)
        + ".",
        (
            f"- **{len(no)} do not run here**: {len(git)} install a requirement from git or a URL (no git host is"
            " reachable here, only the package index); the others need the internet at run time (a git clone, a hub or"
            " web download, a web API with a key), a vLLM or GPU judge, Docker/Apptainer/Singularity, LibreOffice or a"
            ' sandbox service, or are not a server. The column "why" says which, and whether it was tried here or read'
            " in the server's code and config."
        ),
    ]
    if other:
        lines.append(f"- {len(other)} not tried yet: their requirements install from the index.")
    return lines + [
        "",
        (
            "Every folder is recognised as a NeMo Gym folder by `detect_framework`"
            f" ({sum(e['recognised'] for e in entries)} of {len(entries)}; before it followed imports of the folder's"
            " own tree, gpqa_diamond, bunsenbench_chemistry_mcq and polymath were not). Regenerate: `.venv/bin/python"
            " scripts/survey_nemo_gym_servers.py --write docs/nemo_gym_wheel_servers.md`; try servers: `... --try"
            " OUT_DIR name[:config.yaml] ...` (`--override '+judge_base_url={fake}'` for a config's own judge)."
        ),
        "",
        *NOTES04,
    ]


GIT_KIND = "a requirement from git or a URL (no git host is reachable here, only the package index)"
VERDICTS07: dict[str, tuple[str, str]] = {name: (RUNS, why) for name, why in v07.RUNS_HERE.items()} | {
    name: (NO, why) for group in v07.NOT_HERE.values() for name, why in group.items()
}
KIND07 = {name: kind for kind, group in v07.NOT_HERE.items() for name in group}


def intro07(entries: list[dict[str, Any]]) -> list[str]:
    """The text above the table of NeMo Gym 0.7.0's survey: what "runs" means, the counts by kind of reason."""
    group = verdict_groups(entries, v07.TESTED)
    kinds = Counter(GIT_KIND if e in group["git"] else KIND07[e["name"]] for e in group["no"])
    environments = Counter(kind for e in entries for kind in e["environments"])
    lines = [
        "# NeMo Gym 0.7.0's resources servers under our ng_run",
        "",
        (
            f"Generated by `scripts/survey_nemo_gym_servers.py --release 0.7.0` from the {len(entries)} resources"
            " server folders of NVIDIA NeMo Gym 0.7.0's wheel (installed by `tests/nemo_gym_peer07.py`;"
            f' {sum(e["has_app"] for e in entries)} of them have an `app.py`). "Runs" means: started unmodified'
            " under our `ng_run` from the wheel's folder with its own config file (each NeMo Gym folder in an"
            " environment of its own with the NeMo Gym 0.7.0 release and its `requirements.txt` from the package"
            " index; the config's environment servers, e.g. `legacy_agent`, started too), our `openai_model` as"
            " `policy_model` over the fake policy of `../shared/bench/fake_openai.py`, and every row of its"
            " `data/example.jsonl` collected through its agent by our `ng_collect_rollouts` (`--try`; a judge"
            " reference to a model server the config does not define pointed at `policy_model`, a config's own"
            " `judge_model` at the fake with `++judge_base_url`). The verdicts of 0.4.0"
            " (`docs/nemo_gym_wheel_servers.md`) were not carried over: each server here was tried again, or its"
            " reason read again in 0.7.0's code."
        ),
        "",
        f"- **{len(group['runs'])} run here unmodified.** {v07.RUNS_CAVEATS} {len(group['tested'])} are checked row"
        " by row against NeMo"
        " Gym 0.7.0's own `ng_run` and `ng_collect_rollouts` by `tests/test_nemo_gym07.py` (same reward, same"
        " verifier fields, same response): " + ", ".join(e["name"] for e in group["tested"]) + ".",
        f"- **{len(group['no'])} do not run here**, by what they need: "
        + "; ".join(f"{kind}: {count}" for kind, count in kinds.most_common())
        + '. The column "why" says what, and whether it was tried here or read in the server\'s code and config.',
    ]
    if group["other"]:
        lines.append(f"- {len(group['other'])} not tried yet: their requirements install from the index.")
    return lines + [
        (
            f"- **Environment servers**: the configs of {sum(bool(e['environments']) for e in entries)} folders"
            " declare them (0.7.0's `environment_servers` in front of an agent): "
            + ", ".join(f"{kind} in {count}" for kind, count in environments.most_common())
            + "."
        ),
        "",
        (
            f"{sum(e['recognised'] for e in entries)} of the {len(entries)} folders are recognised as NeMo Gym"
            " folders by `detect_framework` (not: "
            + ", ".join(f"{e['name']}{'' if e['has_app'] else ', no app.py'}" for e in entries if not e["recognised"])
            + "). Regenerate: `.venv/bin/python"
            " scripts/survey_nemo_gym_servers.py --release 0.7.0 --write docs/nemo_gym07_servers.md`; try servers:"
            " `... --release 0.7.0 --try OUT_DIR name[:config.yaml] ...` (the tries here added `--override"
            " '++judge_base_url={fake}' --override ++judge_api_key=dummy-key --override ++judge_model_name=fake-policy`"
            " for a config's own judge). The verdicts are `scripts/nemo_gym07_verdicts.py`."
        ),
        "",
        "Notes on how our ng_run runs them, seen here:",
        "",
        *v07.NOTES,
        "",
    ]


def render(entries: list[dict[str, Any]], release: Release) -> str:
    """The Markdown survey: the release's intro, then one table row per server folder (an environment servers
    column where the release has them)."""
    columns = ["server", "verdict", "why", "requirements added", "agents (all configs)"]
    columns += ["environment servers"] if release.environment_servers else []
    columns += ["model servers it calls", "example rows"]
    lines = release.intro(entries) + ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for e in entries:
        verdict_text = (
            "**runs**, checked vs NeMo Gym"
            if e["name"] in release.tested
            else ("**runs**" if e["verdict"] == RUNS else e["verdict"])
        )
        cells = [e["name"], verdict_text, e["why"] or "-", ", ".join(map(short, e["requirements"])) or "-"]
        cells += [", ".join(e["agents"]) or "-"]
        cells += [", ".join(e["environments"]) or "-"] if release.environment_servers else []
        cells += [", ".join(e["judges"]) or "-", str(e["example_rows"])]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


# -- --try ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def try_servers(site: Path, out: Path, specs: list[str], extra: list[str] = ()) -> dict[str, Any]:
    """Run `specs` (`name[:config.yaml]`) under one ng_run with the fake policy and collect each agent's example rows
    once. A server that stops the start (its environment does not build, it exits) is recorded with ng_run's
    message and left out, and the others are started again. `extra`: more ng_run overrides (`{fake}` in them is the
    fake policy's base URL, e.g. `+judge_base_url={fake}` for a config's own judge model instance)."""
    results: dict[str, Any] = {}
    specs = list(specs)
    while specs:
        failed = _try_once(site, out, specs, results, list(extra))
        if not failed:
            break
        specs = [spec for spec in specs if spec.partition(":")[0] not in failed]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


def _try_plan(site: Path, specs: list[str]) -> tuple[list[str], list[str], list[tuple[str, str]], dict[str, str]]:
    """The config files of `specs`, the overrides pointing judge references the configs do not define at
    policy_model, the (server, agent instance) pairs to collect, and the server folder owning each instance."""
    configs, overrides, agents, owner = [], [], [], {}
    for spec in specs:
        name, _, config_name = spec.partition(":")
        path = site / "resources_servers" / name / "configs" / (config_name or f"{name}.yaml")
        configs.append(str(path))
        found = list(instances(yaml.safe_load(path.read_text())))
        defined = {n for n, *_ in found}
        for instance, server_type, implementation, fields in found:
            owner[instance] = name
            if server_type == "responses_api_agents":
                agents.append((name, instance))
            for ref_path, target in model_refs(fields):
                if target not in defined and target != "policy_model":
                    overrides.append(
                        f"++{instance}.{server_type}.{implementation}.{'.'.join(ref_path)}.name=policy_model"
                    )
    return configs, overrides, agents, owner


def _start_failed(message: str, specs: list[str], owner: dict[str, str], results: dict[str, Any]) -> set[str]:
    """The servers ng_run's start error `message` names (all of `specs` when it names none), recorded in `results`."""
    failed = {owner[name] for name in re.findall(r"server '([^']+)'", message) if name in owner}
    failed |= {
        name for name in re.findall(r"resources_servers/([A-Za-z0-9_]+)/configs/", message) if name in owner.values()
    }
    for name in failed or {spec.partition(":")[0] for spec in specs}:
        results[name] = {"start_error": message[-3000:]}
        print(name, "did not start:", message[-1500:], flush=True)
    return failed or {spec.partition(":")[0] for spec in specs}


def _collect(site: Path, out: Path, head: str, name: str, agent: str) -> dict[str, Any]:
    """Collect the example rows of server `name` once through `agent` with our ng_collect_rollouts."""
    output = out / f"{name}__{agent}.jsonl"
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ng_collect_rollouts"),
            f"+head_server_url={head}",
            f"+agent_name={agent}",
            f"+input_jsonl_fpath={site / 'resources_servers' / name / 'data' / 'example.jsonl'}",
            f"+output_jsonl_fpath={output}",
            "+num_repeats=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = sorted(
        (json.loads(line) for line in output.read_text().splitlines()) if output.exists() else [],
        key=lambda r: r["_ng_task_index"],
    )
    failures = output.with_name(output.stem + "_failures.jsonl")
    return {
        "exit": done.returncode,
        "rewards": [row.get("reward") for row in rows],
        "failures": failures.read_text().splitlines()[:3] if failures.exists() else [],
    }


def _try_once(site: Path, out: Path, specs: list[str], results: dict[str, Any], extra: list[str]) -> set[str]:
    """One ng_run of `specs`; returns the servers whose start failed (recorded in `results`), else collects."""
    from nemo_gym.env.testing import NgRun

    out.mkdir(parents=True, exist_ok=True)
    configs, overrides, agents, owner = _try_plan(site, specs)
    port = free_port()
    with (out / "fake.log").open("w") as log:
        fake = subprocess.Popen(
            [sys.executable, str(FAKE), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with NgRun(
            f"+config_paths=[{','.join(configs)},responses_api_models/openai_model/configs/openai_model.yaml]",
            f"+policy_base_url=http://127.0.0.1:{port}/v1",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-policy",
            *overrides,
            *(e.replace("{fake}", f"http://127.0.0.1:{port}/v1") for e in extra),
            timeout_s=900,
            env={"HF_HUB_OFFLINE": "1"},
        ) as run:
            try:
                head = run.wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                (out / f"ng_run_failed_{int(time.time())}.log").write_text(run.output())
                return _start_failed(str(exc), specs, owner, results)
            for name, agent in agents:
                results[f"{name}/{agent}"] = _collect(site, out, head, name, agent)
                print(name, agent, json.dumps(results[f"{name}/{agent}"])[:1500], flush=True)
            (out / "ng_run.log").write_text(run.output())
    finally:
        os.killpg(fake.pid, signal.SIGTERM)
        fake.wait()
    return set()


@dataclass(frozen=True)
class Release:
    """A NeMo Gym release the survey covers: where its wheel is installed, how to install it, the servers its peer
    test checks row by row, the verdicts found here, and the text above its table."""

    site: Path
    install_hint: str
    tested: tuple[str, ...]
    verdicts: dict[str, tuple[str, str]]
    intro: Callable[[list[dict[str, Any]]], list[str]]
    environment_servers: bool  # a column for the environment servers its configs declare (0.7.0 has them)


RELEASES = {
    "0.4.0": Release(DEFAULT_SITE, "bash ../shared/bench/setup_nemo_gym.sh", TESTED, VERDICTS, intro04, False),
    "0.7.0": Release(
        site_packages(Path(os.environ.get("NGBENCH07_DIR", "/tmp/ngbench07"))),
        (
            ".venv/bin/python -c \"import sys; sys.path.insert(0, 'tests'); import nemo_gym_peer07;"
            ' nemo_gym_peer07.peer07_venv()"'
        ),
        v07.TESTED,
        VERDICTS07,
        intro07,
        True,
    ),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--release", choices=sorted(RELEASES), default="0.4.0", help="the NeMo Gym wheel to survey (default: 0.4.0)"
    )
    parser.add_argument(
        "--site-packages",
        type=Path,
        help="the folder holding the wheel's resources_servers/ (default: the release's NeMo Gym venv)",
    )
    parser.add_argument(
        "--write", type=Path, help="write the Markdown survey here (e.g. docs/nemo_gym_wheel_servers.md)"
    )
    parser.add_argument("--json", action="store_true", help="print the survey as JSON")
    parser.add_argument(
        "--try",
        dest="try_out",
        type=Path,
        metavar="OUT_DIR",
        help="run the servers named after it under our ng_run (fake policy)",
    )
    parser.add_argument("servers", nargs="*", help="with --try: name[:config.yaml] of each server")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="with --try: one more ng_run override; {fake} is the fake policy's URL",
    )
    return parser.parse_args()


def survey(site: Path, release: Release) -> list[dict[str, Any]]:
    """One entry per resources server folder of the wheel at `site`, sorted by name."""
    return [
        survey_one(folder, release.verdicts)
        for folder in sorted((site / "resources_servers").iterdir())
        if folder.is_dir() and not folder.name.startswith("__")
    ]


def main() -> None:
    args = parse_args()
    release = RELEASES[args.release]
    site = args.site_packages or release.site
    if not (site / "resources_servers").is_dir():
        raise SystemExit(
            f"no resources_servers/ in {site}: install NeMo Gym {args.release} first ({release.install_hint})"
        )
    if args.try_out:
        started = time.monotonic()
        print(json.dumps(try_servers(site, args.try_out, args.servers, args.override), indent=1))
        print(f"{time.monotonic() - started:.0f} s")
        return
    entries = survey(site, release)
    if args.json:
        print(json.dumps(entries, indent=1))
    text = render(entries, release)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)
        print(f"wrote {args.write}")
    elif not args.json:
        print(text)


if __name__ == "__main__":
    main()
