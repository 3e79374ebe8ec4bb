"""`ng_environments` (NeMo Gym 0.7.0's `gym list resources-servers`, nemo_gym.datasets.environments): the
environments under the search roots and this repository, named and described as 0.7.0 names and describes them; one
shown by name; against 0.7.0's own command on its 218 folders and on ours. With `+kind=agents|models` (0.7.0's `gym
list agents|models`): the agents and the model servers, against 0.7.0's own on its 55 agents and 23 model configs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from nemo_gym_peer07 import peer07_env, peer07_site_packages, peer07_venv
from ng_process import BIN

from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.datasets.environments import agent_entries, model_entries, resources_server_entries


def ng_environments(*arguments: str, cwd: Path, extra_roots: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "NEMO_GYM_EXTRA_ROOTS": extra_roots}
    return subprocess.run(
        [str(BIN / "ng_environments"), *arguments], capture_output=True, text=True, timeout=60, cwd=cwd, env=env
    )


def write_config(path: Path, sections: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sections))  # JSON is YAML


def test_every_environment_of_the_repository_is_listed_and_a_project_shadows_one(tmp_path):
    """Each folder's `<folder>.yaml` is `<folder>`, another config `<folder>/<file>`; a config that declares no
    resources server (a helper) is left out; the working directory's project comes first, so its `mcqa` is listed
    instead of ours."""
    ours = resources_server_entries([REPO_ROOT])
    folders = {p.parent.parent.name for p in REPO_ROOT.glob("resources_servers/*/configs/*.yaml")}
    assert {name.split("/")[0] for name in ours} == folders
    assert ours["mcqa"].domain == "knowledge" and ours["mcqa"].config_path.name == "mcqa.yaml"
    assert "llm_judge/llm_judge_openai" in ours

    project = tmp_path / "resources_servers" / "mcqa" / "configs"
    write_config(project / "mcqa.yaml", {"m": {"resources_servers": {"mcqa": {"domain": "mine", "description": "d"}}}})
    write_config(project / "judge.yaml", {"j": {"responses_api_models": {"openai_model": {"domain": "x"}}}})
    listed = json.loads(ng_environments("+json=true", cwd=tmp_path).stdout)
    by_name = {entry["name"]: entry for entry in listed}
    assert by_name["mcqa"] == {"name": "mcqa", "domain": "mine", "description": "d"}
    assert "mcqa/judge" not in by_name and set(by_name) == set(ours)


def test_one_environment_by_name_and_a_typo_gets_the_closest_names(tmp_path):
    shown = ng_environments("+name=example_single_tool_call", "+json=true", cwd=tmp_path)
    payload = json.loads(shown.stdout)
    assert payload["type"] == "resources server" and payload["domain"] == "agent"
    assert payload["details"]["config"].endswith("example_single_tool_call/configs/example_single_tool_call.yaml")
    assert (
        payload["usage_example"] == "gym env start --resources-server example_single_tool_call --model-type vllm_model"
    )
    text = ng_environments("+name=mcqa", cwd=tmp_path).stdout
    assert "Multiple-choice question answering" in text and "ng_run +config_paths=[" in text
    typo = ng_environments("+name=mcq", cwd=tmp_path)
    assert typo.returncode == 2 and "unknown environment 'mcq' (did you mean mcqa?)" in typo.stderr
    searched = ng_environments("+query=math", cwd=tmp_path).stdout
    assert "math_verify" in searched and "mcqa" not in searched
    # 0.7.0's matching: a close word counts too ("wether" is close to "weather")
    assert "example_single_tool_call" in ng_environments("+query=wether", cwd=tmp_path).stdout


def test_gym_list_and_search_resources_servers_run_it(tmp_path):
    def gym(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "gym"), *arguments], capture_output=True, text=True, timeout=60, cwd=tmp_path)

    done = gym("list", "resources-servers", "mcqa", "--json", "--search-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "mcqa"
    found = gym("search", "resources-servers", "answer letter", "--json")
    assert [entry["name"] for entry in json.loads(found.stdout)] == ["mcqa"]
    catalog = gym("search", "environments", "answer letter", "--json")  # the catalog's entry of the same config
    assert [entry["name"] for entry in json.loads(catalog.stdout)] == ["resources_servers/mcqa"]
    agents = gym("list", "agents", "--json")
    assert {entry["name"] for entry in json.loads(agents.stdout)} == {
        "simple_agent",
        "gymnasium_agent",
        "openai_client_agent",
    }
    shown = json.loads(gym("list", "models", "vllm_model", "--json").stdout)
    assert shown["type"] == "model" and shown["details"]["config"].endswith("vllm_model/configs/vllm_model.yaml")
    assert [e["name"] for e in json.loads(gym("search", "agents", "gymnasum", "--json").stdout)] == ["gymnasium_agent"]


def test_agents_and_model_servers_are_listed_as_0_7_0_classifies_them(tmp_path):
    """An agent is a folder with an app.py or a config declaring `responses_api_agents` (a folder with neither is
    not one); composable when its configs name a resources server and no agent framework, else self-contained; a
    model server is one per config, `<group>/<flavor>` for a config not named after its folder. The working
    directory's project shadows ours."""
    assert set(agent_entries([REPO_ROOT])) == {"simple_agent", "gymnasium_agent", "openai_client_agent"}
    simple = agent_entries([REPO_ROOT])["simple_agent"]
    assert (simple.variants, simple.self_contained) == (("simple_agent",), False) and "verify" in simple.description
    assert set(model_entries([REPO_ROOT])) == {"openai_model", "scripted_model", "vllm_model"}

    agents = tmp_path / "responses_api_agents"
    write_config(
        agents / "framework_agent/configs/a.yaml", {"a": {"responses_api_agents": {"x": {"agent_framework": 1}}}}
    )
    write_config(agents / "stub/configs/raw.yaml", {"harness": {"steps": 3}})  # no agent config and no app.py
    (agents / "bare").mkdir()
    (agents / "bare" / "app.py").write_text("")
    write_config(agents / "simple_agent/configs/mine.yaml", {"s": {"responses_api_agents": {"simple_agent": {}}}})
    write_config(tmp_path / "responses_api_models/vllm_model/configs/big.yaml", {"policy_model": {}})
    listed = {e["name"]: e for e in json.loads(ng_environments("+kind=agents", "+json=true", cwd=tmp_path).stdout)}
    assert set(listed) == {"framework_agent", "bare", "simple_agent", "gymnasium_agent", "openai_client_agent"}
    assert (listed["framework_agent"]["pattern"], listed["bare"]["pattern"]) == ("B (self-contained)", "A (composable)")
    assert listed["simple_agent"]["variants"] == ["mine"]  # the project's folder, not ours
    models = json.loads(ng_environments("+kind=models", "+json=true", cwd=tmp_path).stdout)
    assert {"name": "vllm_model/big", "model": "vllm_model/big", "model_group": "vllm_model"} in models
    typo = ng_environments("+kind=models", "+name=vllm_mdl", cwd=tmp_path)
    assert typo.returncode == 2 and "unknown model 'vllm_mdl' (did you mean vllm_model" in typo.stderr


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["agents", "models"])
def test_agents_and_models_are_0_7_0s(tmp_path, kind):
    """0.7.0's own `gym list agents|models --json` on its install root: every entry is ours, field for field; on
    this repository, every one of ours is its; one shown by name is its inspection payload."""
    site = peer07_site_packages()
    for search_dir in (site, REPO_ROOT):
        argv = [str(peer07_venv() / "bin" / "gym"), "list", kind, "--json", "--search-dir", str(search_dir)]
        theirs = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=tmp_path, env=peer07_env())
        assert theirs.returncode == 0, theirs.stderr[-2000:]
        their_entries = {e["name"]: e for e in json.loads(theirs.stdout)}
        ours = ng_environments(f"+kind={kind}", "+json=true", cwd=tmp_path, extra_roots=str(search_dir)).stdout
        our_entries = {e["name"]: e for e in json.loads(ours)}
        compared = their_entries if search_dir == site else our_entries
        assert (
            len(compared) >= {"agents": {site: 55, REPO_ROOT: 2}, "models": {site: 23, REPO_ROOT: 3}}[kind][search_dir]
        )
        assert {n: our_entries.get(n) for n in compared} == {n: their_entries.get(n) for n in compared}
    name = {"agents": "simple_agent", "models": "vllm_model"}[kind]
    argv = [str(peer07_venv() / "bin" / "gym"), "list", kind, name, "--json", "--search-dir", str(REPO_ROOT)]
    theirs = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=tmp_path, env=peer07_env())
    ours = ng_environments(f"+kind={kind}", f"+name={name}", "+json=true", cwd=tmp_path, extra_roots=str(REPO_ROOT))
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)


@pytest.mark.integration
@pytest.mark.peer
@pytest.mark.slow  # 54 s on 2 AVX2 cores (0.7.0's own processes): beyond CI's budget, `pytest -m slow`
@pytest.mark.timeout(300)
def test_the_list_is_0_7_0s(tmp_path):
    """0.7.0's own `gym list resources-servers --json`: on its install root (`--search-dir` its site-packages), all
    its 218 entries (name, domain, description) are ours, field for field; on this repository, all of ours are its."""
    site = peer07_site_packages()
    listed_by_them: dict[Path, set[str]] = {}
    for search_dir in (site, REPO_ROOT):
        theirs = subprocess.run(
            [
                str(peer07_venv() / "bin" / "gym"),
                "list",
                "resources-servers",
                "--json",
                "--search-dir",
                str(search_dir),
            ],
            capture_output=True,
            text=True,
            timeout=200,
            cwd=tmp_path,
            env=peer07_env(),
        )
        assert theirs.returncode == 0, theirs.stderr[-2000:]
        their_entries = {e["name"]: e for e in json.loads(theirs.stdout)}
        listed_by_them[search_dir] = set(their_entries)
        ours = json.loads(ng_environments("+json=true", cwd=tmp_path, extra_roots=str(search_dir)).stdout)
        our_entries = {e["name"]: e for e in ours}
        compared = their_entries if search_dir == site else our_entries
        assert len(compared) >= (218 if search_dir == site else 18)
        assert {n: our_entries.get(n) for n in compared} == {n: their_entries.get(n) for n in compared}
    # `gym search resources-servers QUERY` finds the same ones on 0.7.0's folders (a typo included)
    for query in ("wether", "math", "safety"):
        argv = [str(peer07_venv() / "bin" / "gym"), "search", "resources-servers", query, "--json", "--search-dir"]
        theirs = subprocess.run(
            [*argv, str(site)], capture_output=True, text=True, timeout=200, cwd=tmp_path, env=peer07_env()
        )
        ours = ng_environments(f"+query={query}", "+json=true", cwd=tmp_path, extra_roots=str(site)).stdout
        their_names = {e["name"] for e in json.loads(theirs.stdout)}
        assert their_names and their_names == {e["name"] for e in json.loads(ours)} & listed_by_them[site], query
