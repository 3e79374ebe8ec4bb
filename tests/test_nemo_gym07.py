"""NeMo Gym 0.7.0, the release its users have now, both ways (issue 29): NVIDIA NeMo Gym 0.7.0 itself (installed by
`nemo_gym_peer07`) beside ours, with the same fake policy (`../shared/bench/fake_openai.py`), on the example rows of
the environments in ENVIRONMENTS, 2 repeats each.

Runs, all real processes on loopback:
- NeMo Gym 0.7.0's own `ng_run` of their config files (each environment's resources server, its agent and the
  `environment_servers` instance in front of it, e.g. `legacy_agent`), and its `openai_model`;
- our `ng_run` of the same config files, the folders unmodified from the wheel (run with the 0.7.0 release our
  ng_run finds from the folders' tree), and our `openai_model`.

Collected: by NeMo Gym's `ng_collect_rollouts` on its run (through the environment servers, as 0.7.0 collects), by
ours on its run and on ours (each through the agent, and through the environment server), and by NeMo Gym's on our
run. Row by row, (task, repeat) for (task, repeat), every rollout must be the same: reward, every verifier field
NeMo Gym's row has, and the response (its output: text, tool calls and their arguments; not the ids and token counts
the fake derives from request bytes, see `assert_same_rollouts`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from nemo_gym_peer import (
    BENCH_DIR,
    nemo_gym_collect_argv,
    nemo_gym_run_argv,
    our_collect_argv,
    peer_env,
    peer_site_packages,
    peer_venv,
    two_at_a_time,
)
from nemo_gym_peer07 import nemo_gym07_run_argv, peer07_env, peer07_site_packages, peer07_venv
from test_nemo_gym_interop import Process, _wait_http, wait_for
from test_reward_profile_parity import assert_same

from nemo_gym.common.jsonl import read_jsonl, write_jsonl
from nemo_gym.common.processes import free_port
from nemo_gym.env.testing import NgRun

# a batch of the row-by-row runs takes about 10 minutes on 2 AVX2 cores (the two: 1195 s), in the setup of the first
# test that reads one of its folders, with NeMo Gym 0.7.0's install (a minute or two) when it is the module's first:
# above pytest's default 900 s per test on a loaded machine
pytestmark = [pytest.mark.integration, pytest.mark.peer, pytest.mark.timeout(3600)]

# a config file of ours in the wheel's example_single_tool_call folder (written by the `peer07` fixture): its tools
# over MCP (`expose_tools_over_mcp`, 0.7.0's /mcp route) to 0.7.0's haystack_agent with its MCP pipeline
MCP_CONFIG = "ng_test_haystack_mcp"
MCP_CONFIG_TEXT = """\
example_single_tool_call_mcp:
  resources_servers:
    example_single_tool_call:
      entrypoint: app.py
      domain: agent
      expose_tools_over_mcp: true
example_single_tool_call_haystack_agent:
  responses_api_agents:
    haystack_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: example_single_tool_call_mcp}
      model_server: {type: responses_api_models, name: policy_model}
      pipeline_yaml: configs/pipeline_mcp.yaml
      agent_component_name: agent
      allow_mcp_tool_filtering: false
example_single_tool_call_haystack_environment_server:
  environment_servers:
    legacy_agent:
      entrypoint: app.py
      agent_server: {type: responses_api_agents, name: example_single_tool_call_haystack_agent}
"""

# a config file of ours in the wheel's gdp_pdf folder (written by the `peer07` fixture): gdp_pdf's rubric verify, its
# judge failing (the fake's text is no verdict: after judge_max_attempts its `judge_failsafe` answers reward 0.0,
# `mask_sample`, `_ng_failure_class: judge_failed`), behind simple_agent (its own agent renders PDFs the wheel does not
# ship; the rows' text prompts are enough for a text answer to verify)
JUDGE_CONFIG = "ng_test_judge_fails"
JUDGE_CONFIG_TEXT = """\
gdp_pdf_judged:
  resources_servers:
    gdp_pdf:
      entrypoint: app.py
      domain: other
      judge_model_server: {type: responses_api_models, name: judge_model}
      judge_chat_create_params: {messages: [], max_tokens: 1024}
      judge_prompt_template_fpath: prompt_templates/judge.txt
      judge_max_attempts: 2
      judge_endpoint_max_concurrency: 16
gdp_pdf_text_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: gdp_pdf_judged}
      model_server: {type: responses_api_models, name: policy_model}
gdp_pdf_text_environment_server:
  environment_servers:
    legacy_agent:
      entrypoint: app.py
      agent_server: {type: responses_api_agents, name: gdp_pdf_text_agent}
judge_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${judge_base_url}
      openai_api_key: ${judge_api_key}
      openai_model: ${judge_model_name}
"""

# resources server folders of the 0.7.0 wheel (`folder` or `folder:config`), each run with its config file
# `configs/<folder or config>.yaml`: environment servers (legacy_agent in all but one), tool calls, multi-reward,
# session state, multi-step, gymnasium agents, a judge, new offline servers (lc_niah, ragtruth, citation_if,
# string_match, ruler2), a single_agent_turn_legacy environment server (example_single_tool_call_single_agent_turn:
# a config file that includes another and `_inherit_from`s its template; the server seeds the resources server with
# 0.7.0's typed /seed_session body, closes it with /close_session, seeds a session agent and grants it direct HTTP
# tool access; its agent calls the model server at /ng-rollout/<id>/v1/responses), and tools over MCP (MCP_CONFIG).
# Left out: spartqa (0.7.0's own ng_run refuses its config: its datasets' `license`), configs whose judge names a
# model server they do not define (abstention, simpleqa, inverse_if, omniscience), blackjack (an unseeded deck: two
# runs differ), wordle (the wheel does not ship its word lists, data/guesses.txt: every rollout fails, under 0.7.0's
# own ng_run too)
# in CI's peer stage (one pair of runs): tools, multi-reward, session state, a judge, a new offline server (the
# folders PROFILED reads) and a single_agent_turn_legacy environment server; 6 (of a run's BATCH of 10: a batch's
# time goes with its folders, six collector runs each and their servers on both runs; on 2 AVX2 cores 530-727 s for
# 10, 350 s for 6)
ENVIRONMENTS_CI = (
    "example_single_tool_call",
    "example_tool_call_multireward",
    "example_session_state_mgmt",
    "lc_niah",
    "frontierscience_judge",
    "example_single_tool_call:example_single_tool_call_single_agent_turn",
)
# beyond CI's budget on 2 cores (two more pairs of runs), run with `pytest -m slow`
# (docs/tests.md): gymnasium and multi-step agents, tools over MCP (CI runs 0.7.0's MCP agent on our /mcp:
# test_nemo_gym_07s_environment_server_on_our_resources_server), mcqa, more offline servers, tool calling, a second
# judge and session-state server
ENVIRONMENTS_SLOW = (
    "example_multi_turn_gymnasium",
    "example_multi_step",
    f"example_single_tool_call:{MCP_CONFIG}",
    "mcqa",
    "gpqa_diamond",
    "ragtruth",
    "citation_if",
    "string_match",
    "xlam_fc",
    "workplace_assistant",
    "equivalence_rule:lc",
    "arc_agi",
    "ruler2",
)
ENVIRONMENTS = ENVIRONMENTS_CI + ENVIRONMENTS_SLOW
REPEATS = 2
BATCH = 10  # environments per pair of runs
# keys of a rollout row that are the collector's own, not the environment's
COLLECTOR_KEYS = ("_ng_", "ng_trajectory", "ng_perf")


def config_path(spec: str) -> str:
    folder, _, config = spec.partition(":")
    return f"resources_servers/{folder}/configs/{config or folder}.yaml"


def instances(folder: str) -> dict[str, str]:
    """`{server type: instance name}` of an environment's config file (its agent, its environment server)."""
    config = yaml.safe_load((peer07_site_packages() / config_path(folder)).read_text())
    return {
        server_type: name
        for name, value in config.items()
        if isinstance(value, dict)
        for server_type in value
        if server_type in ("responses_api_agents", "environment_servers")
    }


def example_rows(spec: str) -> Path:
    return peer07_site_packages() / "resources_servers" / spec.partition(":")[0] / "data" / "example.jsonl"


@pytest.fixture(scope="module")
def peer07() -> Path:
    venv = peer07_venv()
    for spec, text in (
        (f"example_single_tool_call:{MCP_CONFIG}", MCP_CONFIG_TEXT),
        (f"gdp_pdf:{JUDGE_CONFIG}", JUDGE_CONFIG_TEXT),
    ):
        (peer07_site_packages() / config_path(spec)).write_text(text)
    return venv


@pytest.fixture(scope="module")
def fake_policy(tmp_path_factory, peer07) -> str:
    port = free_port()
    log = tmp_path_factory.mktemp("fake07") / "fake.log"
    fake = Process(
        [sys.executable, str(BENCH_DIR / "fake_openai.py"), "--port", str(port)], log, dict(os.environ), Path("/tmp")
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        fake.stop()


def policy_overrides(fake_policy: str) -> list[str]:
    """The policy, and the judge of the configs that define their own (frontierscience_judge: NVIDIA's hosted API by
    default), both the fake: as a judge its text is no verdict, which 0.7.0 masks."""
    return [
        f"+policy_base_url={fake_policy}",
        "+policy_api_key=dummy-key",
        "+policy_model_name=fake-policy",
        f"++judge_base_url={fake_policy}",
        "++judge_api_key=dummy-key",
        "++judge_model_name=fake-policy",
    ]


class TheirRun:
    """NeMo Gym 0.7.0's own ng_run of `folders` (and the config files `extra_paths`) and its openai_model, as a
    context manager; `head_url` once ready."""

    def __init__(self, work: Path, folders: tuple[str, ...], fake_policy: str, extra_paths: tuple[Path, ...] = ()):
        self.work, self.folders, self.fake_policy, self.extra_paths = work, folders, fake_policy, extra_paths
        self.head_url = ""

    def __enter__(self) -> TheirRun:
        head_port = free_port()
        paths = [config_path(folder) for folder in self.folders] + [str(path) for path in self.extra_paths]
        paths.append("responses_api_models/openai_model/configs/openai_model.yaml")
        argv = nemo_gym07_run_argv(paths, head_port, *policy_overrides(self.fake_policy))
        log = self.work / "nemo_gym07_ng_run.log"
        self.process = Process(argv, log, peer07_env(), peer07_site_packages())
        try:
            wait_for(log, r"All \d+ / \d+ servers ready", self.process, 600)
        except BaseException:
            self.process.stop()
            raise
        self.head_url = f"http://127.0.0.1:{head_port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()


def our_run(work: Path, folders: tuple[str, ...], fake_policy: str, extra_paths: list[Path] = ()) -> NgRun:
    """Our ng_run of the same config files (the wheel's folders, unmodified; `extra_paths` too) and our
    openai_model."""
    policy = work / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "policy_model": {
                    "responses_api_models": {
                        "openai_model": {
                            "entrypoint": "app.py",
                            "openai_base_url": "${policy_base_url}",
                            "openai_api_key": "${policy_api_key}",
                            "openai_model": "${policy_model_name}",
                        }
                    }
                }
            }
        )
    )
    paths = [str(peer07_site_packages() / config_path(folder)) for folder in folders] + [str(policy)]
    paths += [str(path) for path in extra_paths]
    # +allow_same_user: NeMo Gym's ng_collect_rollouts (run by this user) cannot send the run token
    return NgRun(
        f"+config_paths=[{','.join(paths)}]", "+allow_same_user=true", *policy_overrides(fake_policy), timeout_s=900
    )


def nemo_gym07_collect(work: Path, head_url: str, agent: str, folder: str, label: str, fails: bool = False) -> Path:
    """NeMo Gym 0.7.0's ng_collect_rollouts of the folder's example rows through `agent`; `fails`: every rollout
    fails (0.7.0 exits 1 when no rollout gave a result)."""
    out = work / f"{label}_{folder.replace(':', '_')}.jsonl"
    command = nemo_gym_collect_argv(peer07_venv(), head_url, agent, example_rows(folder), out, REPEATS)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=work, env=peer07_env())
    assert done.returncode == (1 if fails else 0), done.stdout[-3000:] + done.stderr[-3000:]
    return out


def our_collect(
    work: Path, head_url: str, agent: str, folder: str, label: str, rows: Path | None = None, fails: bool = False
) -> Path:
    """Our ng_collect_rollouts of `rows` (default: the 0.7.0 folder's example rows) through `agent`; `fails`: every
    rollout fails (exit 1, each in the failures file)."""
    out = work / f"{label}_{folder.replace(':', '_')}.jsonl"
    command = our_collect_argv(rows or example_rows(folder), out, REPEATS, agent, head_url)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=work)
    assert done.returncode == (1 if fails else 0), done.stdout[-3000:] + done.stderr[-3000:]
    failures = out.with_name(f"{out.stem}_failures.jsonl")
    assert fails or not failures.exists() or not failures.read_text().strip(), failures.read_text()
    return out


def by_rollout(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    return {(row["_ng_task_index"], row["_ng_rollout_index"]): row for row in read_jsonl(path)}


# fields of a Responses object that the fake policy derives from the request's bytes (its ids hash them, its token
# counts are their length): our openai_model's request equals NeMo Gym's as JSON but not always as bytes
# (docs/coming_from.md, NeMo Gym 0.7.0), so from the second request of a rollout on these may differ
BYTE_DERIVED = ("id", "usage", "created_at")


def _without_byte_derived(value: Any, also: tuple[str, ...] = ()) -> Any:
    if isinstance(value, dict):
        return {k: _without_byte_derived(v, also) for k, v in value.items() if k not in (*BYTE_DERIVED, *also)}
    if isinstance(value, list):
        return [_without_byte_derived(v, also) for v in value]
    return value


def assert_same_rollouts(
    reference: Path, other: Path, same_agent: bool = True, response_aside: tuple[str, ...] = ()
) -> None:
    """Every rollout of `reference` (NeMo Gym's own) has its twin in `other`: the same reward, the same value of each
    environment field the reference row has (the collectors' own `_ng_*` keys aside; `agent_ref` by its agent's name:
    ours keeps the row's `{type, name}`, 0.7.0 writes `{name}`; through an environment server both name the agent
    behind it, and the server in `_ng_environment_server`), the same response (its output items, text, tool calls
    and arguments, status; the ids and token counts the fake derives from request bytes aside). `same_agent` False:
    `agent_ref` is not compared (two agents of one run); `response_aside`: keys of the response, at any depth, not
    compared either."""
    theirs, ours = by_rollout(reference), by_rollout(other)
    assert set(theirs) == set(ours), (reference.name, sorted(theirs), sorted(ours))
    for key, row in theirs.items():
        for field, value in row.items():
            mine = ours[key].get(field)
            if field.startswith(COLLECTOR_KEYS) or (field == "agent_ref" and not same_agent):
                continue
            if field == "agent_ref":
                mine, value = (mine or {}).get("name"), value["name"]
            elif field == "response":
                mine, value = _without_byte_derived(mine, response_aside), _without_byte_derived(value, response_aside)
            assert mine == value, (other.name, key, field, value, mine)


@pytest.fixture(scope="module")
def collected(tmp_path_factory, peer07, fake_policy) -> Collections:
    """Per environment: NeMo Gym's collector on its run (`theirs`), ours on its run through the agent
    (`ours_on_theirs`) and through the environment server (`ours_env_on_theirs`), ours on ours through the agent
    (`ours`) and through the environment server (`ours_env`), NeMo Gym's on ours (`theirs_on_ours`); each batch of
    environments when a test first asks for one of its folders."""
    return Collections(tmp_path_factory, fake_policy)


class Collections:
    """`collected[folder][label]`: the collection files of an environment. ENVIRONMENTS_CI and ENVIRONMENTS_SLOW are
    collected a batch at a time (BATCH environments, one run up at a time: a 0.7.0 server process holds 150-300 MB),
    the first time a folder of the batch is asked for: CI's selection (`not slow`) starts only the first pair of
    runs."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, fake_policy: str):
        self.tmp_path_factory, self.fake_policy = tmp_path_factory, fake_policy
        self.files: dict[str, dict[str, Path]] = {}

    def __getitem__(self, folder: str) -> dict[str, Path]:
        if folder not in self.files:
            group = ENVIRONMENTS_CI if folder in ENVIRONMENTS_CI else ENVIRONMENTS_SLOW
            start = group.index(folder) // BATCH * BATCH
            self._collect(group[start : start + BATCH])
        return self.files[folder]

    def _collect(self, folders: tuple[str, ...]) -> None:
        for folder in folders:
            self.files[folder] = {}
        work = self.tmp_path_factory.mktemp("collected07")
        with TheirRun(work, folders, self.fake_policy) as theirs:
            _collect_each(self.files, folders, ON_THEIR_RUN, work, theirs.head_url)
        with our_run(work, folders, self.fake_policy) as ours:
            ours.wait_ready()
            _collect_each(self.files, folders, ON_OUR_RUN, work, ours.head_url)


# the collections of the `collected` fixture on each run: label -> (collector, the server type it goes through)
ON_THEIR_RUN = {
    "theirs": (nemo_gym07_collect, "responses_api_agents"),
    "ours_on_theirs": (our_collect, "responses_api_agents"),
    "ours_env_on_theirs": (our_collect, "environment_servers"),
}
ON_OUR_RUN = {
    "ours": (our_collect, "responses_api_agents"),
    "ours_env": (our_collect, "environment_servers"),
    "theirs_on_ours": (nemo_gym07_collect, "responses_api_agents"),
}


def _collect_each(
    files: dict[str, dict[str, Path]],
    folders: tuple[str, ...],
    plan: dict[str, tuple[Callable[..., Path], str]],
    work: Path,
    head_url: str,
) -> None:
    """Run each collection of `plan` for each folder (through the folder's instance of that server type) on the run
    at `head_url`, two at a time (`two_at_a_time`), each into `files[folder][label]`."""
    calls = {}
    for folder in folders:
        names = instances(folder)
        for label, (collect, server_type) in plan.items():
            calls[(folder, label)] = partial(collect, work, head_url, names[server_type], folder, label)
    for (folder, label), path in two_at_a_time(calls).items():
        files[folder][label] = path


@pytest.mark.parametrize(
    "folder", [*ENVIRONMENTS_CI, *(pytest.param(folder, marks=pytest.mark.slow) for folder in ENVIRONMENTS_SLOW)]
)
def test_row_by_row_against_nemo_gym_07(collected, folder):
    """Our ng_run and collector give NeMo Gym 0.7.0's own rollouts, row by row, for each environment; our collector
    on NeMo Gym 0.7.0's ng_run gives them too (through its agent and its environment server); and NeMo Gym 0.7.0's
    collector on our ng_run gives them too (it reaches each agent through an environment server our head
    publishes)."""
    files = collected[folder]
    rows = read_jsonl(files["theirs"])
    assert len(rows) == REPEATS * len(read_jsonl(example_rows(folder)))
    for label in ("ours_on_theirs", "ours_env_on_theirs", "ours", "ours_env", "theirs_on_ours"):
        assert_same_rollouts(files["theirs"], files[label])
    env_server = instances(folder)["environment_servers"]
    if not any("agent_ref" in row for row in read_jsonl(example_rows(folder))):  # a row's own agent_ref wins
        for label in ("ours_env_on_theirs", "ours_env"):  # sent to the environment server, as 0.7.0's collector does
            assert {row.get("_ng_environment_server") for row in read_jsonl(files[label])} == {env_server}, label


# environments whose rollouts both reward profiles read: multi-reward fields, session state, a judge's fields, the
# gymnasium agent, a new offline server
PROFILED = ("example_tool_call_multireward", "example_session_state_mgmt", "frontierscience_judge", "lc_niah")


def both_reward_profiles(work: Path, rollouts: Path, rows: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """NeMo Gym 0.7.0's ng_reward_profile and ours, side by side (each process spends most of its life importing),
    each on its own copy of a collection (its rollouts, `rows` instead when given, and its materialized inputs);
    name → folder of the outputs `r_*`."""
    materialized = rollouts.with_name(f"{rollouts.stem}_materialized_inputs.jsonl")

    def profile(name: str, command: Path, env: dict[str, str] | None) -> Path:
        folder = work / name
        folder.mkdir()
        shutil.copy(materialized, folder / "r_materialized_inputs.jsonl")
        if rows is None:
            shutil.copy(rollouts, folder / "r.jsonl")
        else:
            write_jsonl(folder / "r.jsonl", rows)
        argv = [
            str(command),
            "+materialized_inputs_jsonl_fpath=r_materialized_inputs.jsonl",
            "+rollouts_jsonl_fpath=r.jsonl",
        ]
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{name}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return folder

    profilers = {
        "nemo_gym": (peer07_venv() / "bin" / "ng_reward_profile", peer07_env()),
        "ours": (Path(sys.executable).parent / "ng_reward_profile", None),
    }
    return two_at_a_time({name: partial(profile, name, *how) for name, how in profilers.items()})


def assert_same_reward_profiles(folders: dict[str, Path]) -> None:
    """The three output files of NeMo Gym 0.7.0's ng_reward_profile and ours: same rows, keys, types and values
    (floats within a relative 1e-12, `test_reward_profile_parity.assert_same`)."""
    theirs, ours = folders["nemo_gym"], folders["ours"]
    assert_same(read_jsonl(theirs / "r_reward_profiling.jsonl"), read_jsonl(ours / "r_reward_profiling.jsonl"), "tasks")
    for stem in ("agent_metrics", "repeat_level_metrics"):
        name = f"r_{stem}.json"
        assert_same(json.loads((theirs / name).read_text()), json.loads((ours / name).read_text()), stem)


@pytest.mark.parametrize("folder", PROFILED)
def test_reward_profile_as_nemo_gym_07s(collected, folder, tmp_path):
    """Our ng_reward_profile writes NeMo Gym 0.7.0's three files (task rows, agent rows with the across-repeats keys,
    repeat-level metrics) as its own does, on rollouts its collector wrote and on rollouts ours wrote."""
    for label in ("theirs", "ours"):
        work = tmp_path / label
        work.mkdir()
        assert_same_reward_profiles(both_reward_profiles(work, collected[folder][label]))


def test_reward_profile_of_masked_rollouts_as_nemo_gym_07s(collected, tmp_path):
    """0.7.0's masked samples (a judge that failed: `mask_sample: true`, `failure_kind: judge_failed`, reward 0.0,
    as its `judge_failsafe` answers) in a collection of its own: every rollout of the first task, one of the second,
    and `mask_sample: false` on the others. Both reward profiles leave them out of the statistics and count them."""
    rows = read_jsonl(collected["example_tool_call_multireward"]["theirs"])
    for row in rows:
        masked = row["_ng_task_index"] == 0 or (row["_ng_task_index"], row["_ng_rollout_index"]) == (1, 0)
        row |= (
            {"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed"} if masked else {"mask_sample": False}
        )
    folders = both_reward_profiles(tmp_path, collected["example_tool_call_multireward"]["theirs"], rows)
    assert_same_reward_profiles(folders)
    (agent,) = json.loads((folders["ours"] / "r_agent_metrics.json").read_text())
    assert agent["coverage/masked_rollouts"] == REPEATS + 1 and agent["coverage/fully_masked_tasks"] == 1


def wheel_agent(implementation: str, resources_server: str, **fields: Any) -> dict[str, Any]:
    """The config section of one of the 0.7.0 wheel's agents on `resources_server` and the policy."""
    agent = {
        "entrypoint": "app.py",
        "implementation_dir": str(peer07_site_packages() / "responses_api_agents" / implementation),
        "resources_server": {"type": "resources_servers", "name": resources_server},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    return {"responses_api_agents": {implementation: {**agent, **fields}}}


def environment_server(resources_server: str, agent: str, transport: str = "direct_http") -> dict[str, Any]:
    """The config section of 0.7.0's single_agent_turn_legacy environment server in front of `resources_server` and
    `agent`, granting the agent the resources server's tools over `transport` (direct_http or mcp)."""
    return {
        "_inherit_from": "single_agent_turn_legacy",
        "environment_servers": {
            "single_agent_turn_legacy": {
                "resources_server": {"type": "resources_servers", "name": resources_server},
                "agent_server": {"type": "responses_api_agents", "name": agent},
                "resources_tool_transports": [transport],
            }
        },
    }


def mixed_config(work: Path) -> Path:
    """NeMo Gym 0.7.0's single_agent_turn_legacy environment server and session agent (simple_agent) twice: in front
    of 0.7.0's example_single_tool_call resources server (`*_07`) and in front of ours (`*_ours`, this repository's
    folder), the template included from the wheel and `_inherit_from`ed by both, as 0.7.0's
    example_single_tool_call_single_agent_turn.yaml does. (0.7.0's own example_session_state_mgmt answers the typed
    /seed_session body 422: its seed_session takes the row only.) And 0.7.0's haystack_agent with its MCP pipeline
    twice, on each side's example_single_tool_call with `expose_tools_over_mcp: true` (`weather_mcp_*`). And our own
    simple_agent (`agent_native`) behind the same environment server on our resources server (`env_native`), and
    granted its tools over MCP (`env_native_mcp`)."""
    site = peer07_site_packages()
    template = site / "environment_servers/single_agent_turn_legacy/configs/single_agent_turn_legacy.yaml"
    config: dict[str, Any] = {"config_paths": [str(template)]}
    for side in ("07", "ours"):
        resources = {"entrypoint": "app.py"}
        if side == "07":
            resources["implementation_dir"] = str(site / "resources_servers/example_single_tool_call")
        config[f"weather_{side}"] = {"resources_servers": {"example_single_tool_call": resources}}
        config[f"agent_{side}"] = wheel_agent("simple_agent", f"weather_{side}")
        config[f"env_{side}"] = environment_server(f"weather_{side}", f"agent_{side}")
        # 0.7.0's haystack_agent working the resources server's tools over MCP (its MCP pipeline, as MCP_CONFIG)
        config[f"weather_mcp_{side}"] = {
            "resources_servers": {"example_single_tool_call": {**resources, "expose_tools_over_mcp": True}}
        }
        config[f"haystack_{side}"] = wheel_agent(
            "haystack_agent",
            f"weather_mcp_{side}",
            pipeline_yaml="configs/pipeline_mcp.yaml",
            agent_component_name="agent",
            allow_mcp_tool_filtering=False,
        )
    # our simple_agent behind the same 0.7.0 environment server, on our resources server (its agent sessions)
    native = {
        "entrypoint": "app.py",
        "resources_server": {"type": "resources_servers", "name": "weather_ours"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    }
    mcp_ref = {"type": "resources_servers", "name": "weather_mcp_ours"}
    config["agent_native"] = {"responses_api_agents": {"simple_agent": native}}
    config["env_native"] = environment_server("weather_ours", "agent_native")
    # and granted the tools over MCP (0.7.0's own simple_agent refuses such a grant)
    config["agent_native_mcp"] = {"responses_api_agents": {"simple_agent": {**native, "resources_server": mcp_ref}}}
    config["env_native_mcp"] = environment_server("weather_mcp_ours", "agent_native_mcp", transport="mcp")
    path = work / "mixed.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_nemo_gym_07s_environment_server_on_our_resources_server(tmp_path, peer07, fake_policy):
    """0.7.0's environment server and agent on our resources server (its typed /seed_session body, the session cookie
    for the agent's tool calls and /verify, /close_session with its body) give the rollouts they give on 0.7.0's own
    resources server in the same run: row by row, collected by 0.7.0's collector and by ours. So does 0.7.0's MCP
    agent (haystack_agent, its MCP pipeline) on our resources server with `expose_tools_over_mcp: true` (the seed
    answer's MCP access, tools/list and tools/call over /mcp: nemo_gym.env.mcp_exposure) against the same agent on
    0.7.0's own /mcp. And 0.7.0's environment server runs our own simple_agent through its agent sessions
    (/v1/agent_sessions with the direct_http grant, /v1/responses with the session cookie, the close's resources
    cookies for /verify: nemo_gym.env.agent_sessions), with the same rollouts, collected by both collectors; and
    with the tools granted over MCP instead (`resources_tool_transports: [mcp]`), the same rollouts again."""
    folder = "example_single_tool_call"
    plan = {}  # label -> (collector, the server it goes through)
    for side in ("07", "ours"):
        plan |= {
            side: (nemo_gym07_collect, f"agent_{side}"),
            f"{side}_by_ours": (our_collect, f"env_{side}"),
            f"mcp_{side}": (our_collect, f"haystack_{side}"),
        }
    plan |= {
        "native": (nemo_gym07_collect, "agent_native"),
        "native_by_ours": (our_collect, "env_native"),
        "native_mcp": (our_collect, "env_native_mcp"),
    }
    with our_run(tmp_path, (), fake_policy, extra_paths=[mixed_config(tmp_path)]) as run:
        run.wait_ready()
        files = two_at_a_time(
            {
                label: partial(collect, tmp_path, run.head_url, server, folder, label)
                for label, (collect, server) in plan.items()
            }
        )
    assert len(read_jsonl(files["07"])) == REPEATS * len(read_jsonl(example_rows(folder)))
    for label in ("ours", "07_by_ours", "ours_by_ours", "native", "native_by_ours", "native_mcp"):
        assert_same_rollouts(files["07"], files[label], same_agent=False)
    mcp_rollouts = read_jsonl(files["mcp_ours"])
    assert len(mcp_rollouts) == len(read_jsonl(files["07"])) and all(row["reward"] == 1.0 for row in mcp_rollouts)
    # the tools each server lists over MCP differ in their own words (ours: the tool's docstring, its argument schema
    # without titles; 0.7.0's: its GetWeatherRequest model, no description), and with them the request bytes the
    # fake derives call ids from; the calls, their arguments and outputs, the answers and the rewards are the same
    assert_same_rollouts(files["mcp_07"], files["mcp_ours"], same_agent=False, response_aside=("tools", "call_id"))
    (listed,) = mcp_rollouts[0]["response"]["tools"]
    assert listed["name"] == "get_weather" and listed["parameters"]["required"] == ["city"]


def nemo_gym04_collect(work: Path, folder: str, fake_policy: str) -> Path:
    """NeMo Gym 0.4.0's own ng_run and ng_collect_rollouts of one of its wheel's folders (its `<folder>.yaml`)."""
    head_port = free_port()
    config = f"resources_servers/{folder}/configs/{folder}.yaml"
    argv = nemo_gym_run_argv(
        [config, "responses_api_models/openai_model/configs/openai_model.yaml"],
        head_port,
        *policy_overrides(fake_policy)[:3],
    )
    log = work / "nemo_gym04_ng_run.log"
    process = Process(argv, log, peer_env(), peer_site_packages())
    try:
        wait_for(log, r"All \d+ / \d+ servers ready", process, 600)
        out = work / f"theirs04_{folder}.jsonl"
        rows = peer_site_packages() / "resources_servers" / folder / "data" / "example.jsonl"
        argv = nemo_gym_collect_argv(
            peer_venv(), f"http://127.0.0.1:{head_port}", f"{folder}_simple_agent", rows, out, REPEATS
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=work, env=peer_env())
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return out
    finally:
        process.stop()


@pytest.mark.slow  # 202 s on 2 AVX2 cores (a 0.4.0 run and one of ours): beyond CI's budget, `pytest -m slow`
def test_nemo_gym_04_and_07_folders_in_one_run(collected, tmp_path, fake_policy):
    """A folder of NeMo Gym 0.4.0's wheel (example_single_tool_call) and one of 0.7.0's (mcqa, behind its environment
    server) in one of our ng_runs, each in an environment with its own release, both releases' servers on the run's
    one Ray head: each gives the rollouts its own release's ng_run gives, row by row."""
    folder04 = peer_site_packages() / "resources_servers/example_single_tool_call"
    theirs04 = nemo_gym04_collect(tmp_path, "example_single_tool_call", fake_policy)
    config04 = folder04 / "configs/example_single_tool_call.yaml"
    with our_run(tmp_path, ("mcqa",), fake_policy, extra_paths=[config04]) as run:
        run.wait_ready()
        agent04 = "example_single_tool_call_simple_agent"
        rows04 = folder04 / "data/example.jsonl"
        ours04 = our_collect(tmp_path, run.head_url, agent04, "example_single_tool_call", "ours04", rows04)
        ours07 = our_collect(tmp_path, run.head_url, instances("mcqa")["environment_servers"], "mcqa", "ours07")
    assert_same_rollouts(theirs04, ours04)
    assert_same_rollouts(collected["mcqa"]["theirs"], ours07)


def failure_classes(output: Path, class_key: str) -> dict[tuple[int, int], str]:
    """(task, repeat) → failure class of a collection's failures file (`<out>_failures.jsonl`); its output has no
    row."""
    assert not output.exists() or not read_jsonl(output), output
    failures = read_jsonl(output.with_name(f"{output.stem}_failures.jsonl"))
    return {(row["_ng_task_index"], row["_ng_rollout_index"]): row[class_key] for row in failures}


@pytest.mark.slow  # 188 s on 2 AVX2 cores (a run of 0.7.0's and one of ours): beyond CI's budget, `pytest -m slow`
def test_a_failing_judge_routes_the_rollout_to_the_failures_file_as_0_7_0_does(tmp_path, peer07, fake_policy):
    """gdp_pdf's judge fails on every row (JUDGE_CONFIG): 0.7.0's judge_failsafe answers reward 0.0 with
    `mask_sample` and `_ng_failure_class: judge_failed`, and 0.7.0's collector writes each such rollout to its
    failures file, none to the output. Ours does the same, on 0.7.0's ng_run and on ours, and 0.7.0's collector on our
    ng_run too: the same rollouts, each failed as judge_failed (never a reward of 0 in the output)."""
    spec = f"gdp_pdf:{JUDGE_CONFIG}"
    names = instances(spec)
    agent, env_server = names["responses_api_agents"], names["environment_servers"]
    classes = {}
    with TheirRun(tmp_path, (spec,), fake_policy) as theirs:
        output = nemo_gym07_collect(tmp_path, theirs.head_url, agent, spec, "theirs", fails=True)
        classes["theirs"] = failure_classes(output, "_ng_failure_class")
        output = our_collect(tmp_path, theirs.head_url, env_server, spec, "ours_on_theirs", fails=True)
        classes["ours_on_theirs"] = failure_classes(output, "failure_class")
    with our_run(tmp_path, (spec,), fake_policy) as run:
        run.wait_ready()
        output = our_collect(tmp_path, run.head_url, env_server, spec, "ours", fails=True)
        classes["ours"] = failure_classes(output, "failure_class")
        output = nemo_gym07_collect(tmp_path, run.head_url, agent, spec, "theirs_on_ours", fails=True)
        classes["theirs_on_ours"] = failure_classes(output, "_ng_failure_class")
    expected = {(task, repeat): "judge_failed" for task in range(5) for repeat in range(REPEATS)}
    assert classes == {label: expected for label in classes}


PROMPT_TEMPLATE = "system: You help with {topic}.\nuser: '{question}'\n"


# a second weather environment in the run: its own resources server (so that example_single_tool_call stays named by
# one agent) and simple_agent, for the rows fanned out to two agents
SECOND_WEATHER = {
    "weather_b": {
        "resources_servers": {
            "example_single_tool_call": {
                "entrypoint": "app.py",
                "domain": "agent",
                "verified": False,
                "description": "example_single_tool_call again",
            }
        }
    },
    "weather_b_simple_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {"type": "resources_servers", "name": "weather_b"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    },
}


@pytest.fixture(scope="module")
def their_weather_run(tmp_path_factory, peer07, fake_policy) -> Iterator[TheirRun]:
    """0.7.0's own ng_run of example_single_tool_call (and `SECOND_WEATHER`), shared by the collection-parameter
    tests (one start)."""
    work = tmp_path_factory.mktemp("weather07")
    second = work / "weather_b.yaml"
    second.write_text(yaml.safe_dump(SECOND_WEATHER))
    with TheirRun(work, ("example_single_tool_call",), fake_policy, (second,)) as theirs:
        yield theirs


def collect_both(
    work: Path, head_url: str, rows: Path, label: str, repeats: int, extra: list[str], agent: str | None = None
) -> tuple[Path, Path]:
    """NeMo Gym 0.7.0's ng_collect_rollouts and ours of `rows` against the run at `head_url`, side by side, each with
    the same `extra` parameters (and `+agent_name=<agent>` when given); their outputs `theirs_<label>.jsonl`,
    `ours_<label>.jsonl`."""
    outputs = work / f"theirs_{label}.jsonl", work / f"ours_{label}.jsonl"
    theirs = nemo_gym_collect_argv(peer07_venv(), head_url, agent, rows, outputs[0], repeats) + extra
    ours = our_collect_argv(rows, outputs[1], repeats, agent, head_url) + extra
    runs = two_at_a_time(
        {
            side: partial(subprocess.run, command, capture_output=True, text=True, timeout=600, cwd=work, env=env)
            for side, command, env in (("theirs", theirs, peer07_env()), ("ours", ours, None))
        }
    )
    for done in runs.values():
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return outputs


def test_nemo_gym_collection_parameters_as_0_7_0_applies_them(tmp_path, their_weather_run: TheirRun):
    """`+num_repeats_add_seed=true +prompt_config=<template> +interleave_repeats=true` on raw rows (no input; the
    template builds it): 0.7.0's own ng_collect_rollouts and ours, on 0.7.0's ng_run of example_single_tool_call,
    dispatch the same rows (the materialized inputs' responses_create_params, seeds in metadata.extra_body
    included, (task, repeat) for (task, repeat)) and collect the same rollouts."""
    folder = "example_single_tool_call"
    raw = []
    for row in read_jsonl(example_rows(folder)):
        params = dict(row["responses_create_params"])
        question = params.pop("input")[-1]["content"]
        raw.append({"question": question, "topic": "the weather", "responses_create_params": params})
    rows = tmp_path / "raw.jsonl"
    write_jsonl(rows, raw)
    (tmp_path / "prompt.yaml").write_text(PROMPT_TEMPLATE)
    extra = [f"+prompt_config={tmp_path / 'prompt.yaml'}", "+num_repeats_add_seed=true", "+interleave_repeats=true"]
    agent = instances(folder)["responses_api_agents"]
    out_theirs, out_ours = collect_both(tmp_path, their_weather_run.head_url, rows, "parameters", 3, extra, agent)

    def dispatched(out: Path) -> dict[tuple[int, int], Any]:
        return {
            key: row["responses_create_params"]
            for key, row in by_rollout(out.with_stem(f"{out.stem}_materialized_inputs")).items()
        }

    mine, reference = dispatched(out_ours), dispatched(out_theirs)
    assert len(reference) == 15 and mine == reference
    assert {json.loads(p["metadata"]["extra_body"])["seed"] for p in reference.values()} == {0, 1, 2}
    assert reference[(0, 0)]["input"][0] == {"role": "system", "content": "You help with the weather."}
    assert_same_rollouts(out_theirs, out_ours)


def test_fan_out_and_num_repeats_by_agent_as_0_7_0_applies_them(tmp_path, their_weather_run: TheirRun):
    """0.7.0's `+fan_out` (rows whose task_source is `ds` run through two agents) with `+num_repeats` as a dict (an
    agent's entry, the routing key's, `_default`): 0.7.0's collector and ours, on 0.7.0's ng_run, send each
    (task, rollout) to the same agent and collect the same rollouts; a fanned row's rollouts are numbered on across
    its agents. Both ng_reward_profiles profile them per (task, agent) the same way."""
    folder = "example_single_tool_call"
    agent = instances(folder)["responses_api_agents"]
    rows = tmp_path / "fan_out.jsonl"
    example = read_jsonl(example_rows(folder))
    write_jsonl(rows, [{**row, "task_source": "ds"} for row in example[:2]] + example[2:])
    extra = [f"+fan_out={{ds: [weather_b_simple_agent, {agent}]}}"]
    repeats = "{weather_b_simple_agent: 1, ds: 2, _default: 3}"
    out_theirs, out_ours = collect_both(tmp_path, their_weather_run.head_url, rows, "fan_out", repeats, extra, agent)
    reference = {key: row["agent_ref"]["name"] for key, row in by_rollout(out_theirs).items()}
    fanned = {(0, 0): "weather_b_simple_agent", (0, 1): agent, (0, 2): agent}
    assert {key: name for key, name in reference.items() if key[0] == 0} == fanned
    assert len(reference) == 2 * 3 + 3 * (len(example) - 2)
    assert_same_rollouts(out_theirs, out_ours)
    # profiled per (task, agent) by both ng_reward_profiles, on 0.7.0's collection and on ours
    for label, out in (("theirs", out_theirs), ("ours", out_ours)):
        (tmp_path / f"profile_{label}").mkdir()
        folders = both_reward_profiles(tmp_path / f"profile_{label}", out)
        fanned_rows = [
            row for row in read_jsonl(folders["ours"] / "r_reward_profiling.jsonl") if row["_ng_task_index"] == 0
        ]
        assert [row["agent_ref"]["name"] for row in fanned_rows] == sorted([agent, "weather_b_simple_agent"])
        assert_same_reward_profiles(folders)


def test_task_source_and_agent_map_rows_go_where_0_7_0_sends_them(tmp_path, their_weather_run: TheirRun):
    """Rows as 0.7.0's ng_prepare_data writes them, without agent_ref and with `task_source` (the instance that
    declared the dataset): naming the agent that declares it, or the resources server only that agent names; and
    (`+agent_map`) rows whose task_source names no instance, re-routed by 0.7.0's agent_map. 0.7.0's collector and
    ours, with no +agent_name, on 0.7.0's ng_run: the same agent, the same rollouts."""
    folder = "example_single_tool_call"
    agent = instances(folder)["responses_api_agents"]
    for source in (folder, agent, "a_dataset_of_another_run"):
        rows = tmp_path / f"{source}.jsonl"
        write_jsonl(rows, [{**row, "task_source": source} for row in read_jsonl(example_rows(folder))])
        mapped = [f"+agent_map={{{source}: {agent}}}"] if source == "a_dataset_of_another_run" else []
        out_theirs, out_ours = collect_both(tmp_path, their_weather_run.head_url, rows, source, REPEATS, mapped)
        assert {row["agent_ref"]["name"] for row in read_jsonl(out_theirs)} == {agent}
        assert {(row["agent_ref"]["name"], row["task_source"]) for row in read_jsonl(out_ours)} == {(agent, source)}
        assert_same_rollouts(out_theirs, out_ours)
