"""NeMo Gym users bring everything, both ways: NVIDIA NeMo Gym 0.4.0 itself (installed by
`nemo_gym_peer`) beside ours, with the same fake policy (`../shared/bench/fake_openai.py`), for
`example_single_tool_call`, `example_session_state_mgmt` and `mcqa`, 5 rows x 2 repeats each.

Runs, all real processes on loopback:
- NeMo Gym's own `ng_run` with its three resources servers, its `simple_agent`s and its `openai_model`;
- one `ng_run` of ours holding, for each environment: our server (`our_*`), NeMo Gym's server folder from the
  wheel started unmodified by our ng_run (`wheel_*`), NeMo Gym's running server named by `url:` (`url_*`); our
  simple_agent on each of them, NeMo Gym's simple_agent folder (started by our ng_run) on ours (`nemo_agent_*`),
  and our openai_model in front of the fake.

Every pairing must give the native pairings' rewards (ours with ours, NeMo Gym's with NeMo Gym's), which must
agree with each other; the fake is deterministic, so each rollout's reward is a function of its row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from nemo_gym_peer import (
    BENCH_DIR,
    nemo_gym_collect_argv,
    nemo_gym_run_argv,
    our_collect_argv,
    peer_env,
    peer_server_dir,
    peer_venv,
    two_at_a_time,
)

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.common.processes import free_port
from nemo_gym.env.testing import NgRun
from nemo_gym.serving.head import runs_dir

# beyond CI's budget on 2 cores (450 s on 2 AVX2 cores), run with `pytest -m slow` (docs/tests.md); in CI, NeMo Gym
# 0.7.0 is run beside ours both ways (tests/test_nemo_gym07.py) and 0.4.0's ng_reward_profile
# (tests/test_reward_profile_parity.py)
pytestmark = [pytest.mark.integration, pytest.mark.peer, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
PEER_DATA = REPO.parent / "shared" / "peer_data" / "nemo_gym" / "resources_servers"
# our instance suffix -> (NeMo Gym server folder, NeMo Gym's instance name, its agent's instance name)
ENVIRONMENTS = {
    "weather": ("example_single_tool_call", "example_single_tool_call", "example_single_tool_call_simple_agent"),
    "session": (
        "example_session_state_mgmt",
        "example_session_state_mgmt_resources_server",
        "example_session_state_mgmt_simple_agent",
    ),
    "mcqa": ("mcqa", "mcqa", "mcqa_simple_agent"),
}
REPEATS = 2


SESSION_ROWS_KEPT = (0, 2)  # rows of the session environment whose expected count is their initial count


def input_rows(env: str) -> Path:
    """NeMo Gym's example rows of an environment. For the session environment, rows SESSION_ROWS_KEPT expect the
    counter they start with: the fake's tool call (wrong arguments) leaves it as seeded, so they score 1 exactly
    when the rollout's session survives from /seed_session through a tool answer to /verify (the other rows, 0)."""
    source = PEER_DATA / ENVIRONMENTS[env][0] / "data" / "example.jsonl"
    if env != "session":
        return source
    target = Path(os.environ.get("TMPDIR", "/tmp")) / f"ng_interop_session_rows_{os.getpid()}.jsonl"
    rows = read_jsonl(source)
    for index in SESSION_ROWS_KEPT:
        rows[index]["expected_count"] = rows[index]["initial_count"]
    target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return target


def rewards_by_task(path: Path) -> dict[int, list[float]]:
    """Each task's rewards, sorted (rollouts of one task come back in any order)."""
    by_task: dict[int, list[float]] = defaultdict(list)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_task[row["_ng_task_index"]].append(float(row["reward"]))
    return {task: sorted(rewards) for task, rewards in sorted(by_task.items())}


class Process:
    """A command in its own session, output to a log; stopped by SIGTERM to its process group, then SIGKILL.

    Not SIGINT, Ctrl-C's signal: on SIGINT each of NeMo Gym's servers prints a KeyboardInterrupt traceback (rich's,
    highlighted) and its ng_run waits on each server in turn, then on Ray's shutdown; on 2 busy cores a run of ten
    environments took up to a minute to go. These tests compare what NeMo Gym's servers and collector answer, not how
    its ng_run shuts down; SIGTERM ends each process of the group (Ray's own block SIGINT, not SIGTERM) at once."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str], cwd: Path):
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def wait_for(log: Path, text: str, process: Process, timeout_s: float = 300) -> None:
    from ng_process import wait_for_output

    wait_for_output(log, text, process.process, log.name, timeout_s)


@pytest.fixture(scope="module")
def peer() -> Path:
    return peer_venv()


@pytest.fixture(scope="module")
def fake_policy(tmp_path_factory, peer) -> str:
    port = free_port()
    log = tmp_path_factory.mktemp("fake") / "fake.log"
    fake = Process(
        [sys.executable, str(BENCH_DIR / "fake_openai.py"), "--port", str(port)], log, dict(os.environ), REPO
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        fake.stop()


def _wait_http(url: str, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def nemo_gym_run(tmp_path_factory, peer, fake_policy) -> dict[str, Any]:
    """NeMo Gym's own ng_run of the three environments; its head URL and its config as its head serves it."""
    work = tmp_path_factory.mktemp("nemo_gym_run")
    head_port = free_port()
    config_paths = [f"resources_servers/{folder}/configs/{folder}.yaml" for folder, _, _ in ENVIRONMENTS.values()]
    config_paths.append("responses_api_models/openai_model/configs/openai_model.yaml")
    argv = nemo_gym_run_argv(
        config_paths,
        head_port,
        f"+policy_base_url={fake_policy}",
        "+policy_api_key=dummy-key",
        "+policy_model_name=fake-policy",
    )
    run = Process(argv, work / "ng_run.log", peer_env(), work)
    try:
        wait_for(work / "ng_run.log", r"All 7 / 7 servers ready", run, 300)
        head_url = f"http://127.0.0.1:{head_port}"
        config = yaml.safe_load(json.loads(httpx.get(f"{head_url}/global_config_dict_yaml", timeout=10).text))
        yield {"head_url": head_url, "config": config, "work": work}
    finally:
        run.stop()


def _address(config: dict[str, Any], name: str) -> str:
    fields = next(iter(next(iter(config[name].values())).values()))
    return f"http://{fields['host']}:{fields['port']}"


def our_config(nemo_gym: dict[str, Any], fake_policy: str) -> dict[str, Any]:
    """The composition of our ng_run (see the module docstring)."""
    policy = {"type": "responses_api_models", "name": "policy_model"}
    config: dict[str, Any] = {
        "policy_model": {
            "responses_api_models": {
                "openai_model": {
                    "entrypoint": "app.py",
                    "openai_base_url": fake_policy,
                    "openai_api_key": "dummy-key",
                    "openai_model": "fake-policy",
                }
            }
        }
    }
    for env, (folder, nemo_name, _) in ENVIRONMENTS.items():
        wheel_folder = str(peer_server_dir("resources_servers", folder))
        config[f"our_{env}"] = {"resources_servers": {folder: {"entrypoint": "app.py"}}}
        config[f"wheel_{env}"] = {
            "resources_servers": {folder: {"entrypoint": "app.py", "implementation_dir": wheel_folder}}
        }
        config[f"url_{env}"] = {"resources_servers": {folder: {"url": _address(nemo_gym["config"], nemo_name)}}}
        for server in (f"our_{env}", f"wheel_{env}", f"url_{env}"):
            config[f"{server}_agent"] = {
                "responses_api_agents": {
                    "simple_agent": {
                        "entrypoint": "app.py",
                        "resources_server": {"type": "resources_servers", "name": server},
                        "model_server": policy,
                    }
                }
            }
        config[f"nemo_agent_{env}"] = {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "implementation_dir": str(peer_server_dir("responses_api_agents", "simple_agent")),
                    "resources_server": {"type": "resources_servers", "name": f"our_{env}"},
                    "model_server": policy,
                }
            }
        }
    return config


@pytest.fixture(scope="module")
def our_run(tmp_path_factory, nemo_gym_run, fake_policy):
    work = tmp_path_factory.mktemp("our_run")
    config_path = work / "interop.yaml"
    config_path.write_text(yaml.safe_dump(our_config(nemo_gym_run, fake_policy)))
    # +allow_same_user: NeMo Gym's ng_collect_rollouts (run by this user) cannot send the run token
    with NgRun(f"+config_paths=[{config_path}]", "+allow_same_user=true", timeout_s=900) as run:
        run.wait_ready()
        yield run


def our_collect(tmp_path: Path, agent: str, env: str, *extra: str) -> dict[int, list[float]]:
    out = tmp_path / f"{agent}.jsonl"
    command = [*our_collect_argv(input_rows(env), out, REPEATS, agent), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        not (tmp_path / f"{agent}_failures.jsonl").exists()
        or not (tmp_path / f"{agent}_failures.jsonl").read_text().strip()
    )
    return rewards_by_task(out)


def nemo_gym_collect(
    tmp_path: Path, head_url: str, agent: str, env: str
) -> tuple[dict[int, list[float]], list[dict[str, Any]]]:
    """NeMo Gym 0.4.0's own ng_collect_rollouts against a head server; its rewards and its aggregate metrics file."""
    out = tmp_path / f"nemo_gym_{agent}.jsonl"
    command = nemo_gym_collect_argv(peer_venv(), head_url, agent, input_rows(env), out, REPEATS)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=peer_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads(out.with_name(f"{out.stem}_aggregate_metrics.json").read_text())
    return rewards_by_task(out), metrics


@pytest.fixture(scope="module")
def native(tmp_path_factory, our_run, nemo_gym_run) -> dict[str, dict[int, list[float]]]:
    """The native pairings' rewards per environment, checked equal to each other (ours with ours, NeMo Gym's with NeMo
    Gym's)."""
    tmp_path = tmp_path_factory.mktemp("native")
    rewards = {}
    calls = {}
    for env, (_, _, nemo_agent) in ENVIRONMENTS.items():
        calls[(env, "ours")] = partial(
            our_collect, tmp_path, f"our_{env}_agent", env, f"+head_server_url={our_run.head_url}"
        )
        calls[(env, "theirs")] = partial(nemo_gym_collect, tmp_path, nemo_gym_run["head_url"], nemo_agent, env)
    results = two_at_a_time(calls)
    for env in ENVIRONMENTS:
        ours, (theirs, _) = results[(env, "ours")], results[(env, "theirs")]
        assert ours == theirs, f"{env}: our native pairing {ours} != NeMo Gym's {theirs}"
        assert len(ours) == 5 and all(len(r) == REPEATS for r in ours.values())
        rewards[env] = ours
    return rewards


def test_native_pairings_agree_and_score(native):
    """The environments score the fake's rollouts the same way on both sides; in the session environment exactly
    the rows that expect their initial counter score, which takes the session kept across the rollout's calls."""
    assert all(r == 1.0 for rewards in native["weather"].values() for r in rewards)
    assert native["session"] == {task: [float(task in SESSION_ROWS_KEPT)] * REPEATS for task in range(5)}
    assert all(r == 0.0 for rewards in native["mcqa"].values() for r in rewards)  # the fake never names a letter


@pytest.mark.parametrize("server", ["wheel", "url"])
def test_our_agent_and_collector_on_nemo_gym_servers(tmp_path, our_run, native, server):
    """Our simple_agent and collector on NeMo Gym's servers: started unmodified by our ng_run (`wheel_*`), or
    running under NeMo Gym's ng_run and named by `url:` (`url_*`)."""
    for env in ENVIRONMENTS:
        assert (
            our_collect(tmp_path, f"{server}_{env}_agent", env, f"+head_server_url={our_run.head_url}") == native[env]
        ), env


def test_our_collector_on_nemo_gym_head(tmp_path, nemo_gym_run, native):
    """Our collector pointed at NeMo Gym's head server (no /servers: read through /global_config_dict_yaml), on its
    agents."""
    for env, (_, _, nemo_agent) in ENVIRONMENTS.items():
        assert our_collect(tmp_path, nemo_agent, env, f"+head_server_url={nemo_gym_run['head_url']}") == native[env], (
            env
        )


def test_nemo_gym_agent_and_collector_on_our_servers(tmp_path, our_run, native):
    """NeMo Gym's own collector on our ng_run, with NeMo Gym's simple_agent (started by our ng_run) on our
    resources servers and with our simple_agent: same rewards; our /aggregate_metrics fills its AggregateMetrics."""
    collected = two_at_a_time(
        {
            (env, agent): partial(nemo_gym_collect, tmp_path, our_run.head_url, agent, env)
            for env in ENVIRONMENTS
            for agent in (f"nemo_agent_{env}", f"our_{env}_agent")
        }
    )
    for (env, agent), (rewards, metrics) in collected.items():
        assert rewards == native[env], (env, agent)
        (entry,) = metrics
        assert entry["agent_metrics"]["mean/reward"] == pytest.approx(sum(map(sum, rewards.values())) / (5 * REPEATS))
        assert entry["key_metrics"] and len(entry["group_level_metrics"]) == 5


def test_nemo_gym_servers_are_registered_and_allowed(our_run):
    """The NeMo Gym processes our ng_run started are registered (framework nemo_gym, no run token sent to them), and
    listed in the run's allowed_peers.json; external servers are registered as external."""
    servers = httpx.get(f"{our_run.head_url}/servers", headers=our_run.headers, timeout=10).json()
    by_name = {s["name"]: s for s in servers}
    for env in ENVIRONMENTS:
        assert by_name[f"wheel_{env}"]["framework"] == "nemo_gym" and by_name[f"wheel_{env}"]["send_run_token"] is False
        assert by_name[f"url_{env}"]["external"] is True and by_name[f"url_{env}"]["send_run_token"] is False
        assert by_name[f"our_{env}"]["send_run_token"] is True
    state = our_run.state()
    allowed = json.loads((runs_dir() / state["run_id"] / "allowed_peers.json").read_text())["pids"]
    nemo_pids = {s["pid"] for s in state["servers"] if s.get("kind") == "nemo_gym"}
    assert nemo_pids and set(allowed) == nemo_pids


def test_discovery_answer_holds_addresses_only(our_run):
    """NeMo Gym's discovery routes on our head: instance names, types, hosts and ports, nothing else (no fields, no
    secrets); for NeMo Gym 0.7.0's collector, each agent also fronted by a `legacy_agent` environment server entry at
    the agent's own address, whose only other field is its agent reference."""
    answer = httpx.get(f"{our_run.head_url}/global_config_dict_yaml", headers=our_run.headers, timeout=10)
    config = yaml.safe_load(answer.json())
    assert "dummy-key" not in answer.text and "openai_base_url" not in answer.text
    assert set(config["head_server"]) == {"host", "port"}
    relays = {}
    for name, value in config.items():
        if name != "head_server":
            (fields,) = [f for impl in value.values() for f in impl.values()]
            if "environment_servers" in value:
                assert set(fields) == {"host", "port", "agent_server"}, name
                relays[fields["agent_server"]["name"]] = (fields["host"], fields["port"])
            else:
                assert set(fields) == {"host", "port"}, name
    agents = {name for name, value in config.items() if "responses_api_agents" in value}
    assert set(relays) == agents and all(
        relays[agent] == tuple(config[agent]["responses_api_agents"]["simple_agent"].values()) for agent in agents
    )
    instances = httpx.get(f"{our_run.head_url}/server_instances", headers=our_run.headers, timeout=10).json()
    assert {i["process_name"] for i in instances} == set(config) - {"head_server"} - {
        name for name, value in config.items() if "environment_servers" in value
    }
    assert all(set(i) == {"process_name", "server_type", "name", "host", "port", "url"} for i in instances)
