"""`ng_run +ray_address=...` on a real local Ray cluster (a head node and a worker node, each started by
`ray start` with its own resources): replicas on both nodes, a worker node killed mid-collection, the
collection completing with one row per (task, repeat); a server that keeps dying stops the run by name."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from ng_process import BIN, REPO, NgRun

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config.server_instances import ServerInstance
from nemo_gym.orchestration.ray_placement import placement_of

ray = pytest.importorskip("ray")

ROWS = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
RESOURCES = "weather.resources_servers.example_single_tool_call"
AGENT = "weather_agent.responses_api_agents.simple_agent"
MODEL = "policy_model.responses_api_models.scripted_model"


def test_placement_fields_are_validated_naming_the_key():
    instance = ServerInstance(
        "weather",
        "resources_servers",
        "example_single_tool_call",
        {"num_cpus": 0.5, "resources": {"node_b": 1}},
        "x.yaml",
    )
    placement = placement_of(instance)
    assert (placement.num_cpus, placement.num_gpus, placement.resources, placement.max_restarts) == (
        0.5,
        0.0,
        {"node_b": 1.0},
        3,
    )
    bad = ServerInstance("weather", "resources_servers", "example_single_tool_call", {"max_restarts": -1}, "x.yaml")
    with pytest.raises(
        ConfigError, match=r"x.yaml: key 'weather.resources_servers.example_single_tool_call.max_restarts'"
    ):
        placement_of(bad)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray_cluster import LocalRayCluster

    made = LocalRayCluster(tmp_path_factory.mktemp("ray"), free_port(), head_cpus=2, head_resources={"node_a": 8})
    try:
        made.add_worker(cpus=2, resources={"node_b": 8})
        yield made
    finally:
        made.stop()


def rows(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def replica_on(placed: list[tuple[str, int, str]], name: str, node: str) -> int:
    """The replica index of instance `name` that was placed on `node`."""
    (replica,) = [r for n, r, where in placed if n == name and where == node]
    return replica


def ray_run(cluster, *extra: str) -> NgRun:
    return NgRun(
        "+config_paths=[tests/configs/weather_scripted.yaml]",
        "+skip_venv=true",
        f"+ray_address={cluster.address}",
        "+scripted_delay_s=0.05",
        f"+{MODEL}.resources={{node_a: 1}}",
        f"+{MODEL}.num_cpus=0.25",  # the policy stays on the head node
        f"+{RESOURCES}.num_cpus=0.25",
        f"+{AGENT}.num_cpus=0.25",
        # all nodes are this machine: the servers bind loopback 127.0.0.1 (by default they bind their node's address)
        f"+{MODEL}.host=127.0.0.1",
        f"+{RESOURCES}.host=127.0.0.1",
        f"+{AGENT}.host=127.0.0.1",
        *extra,
        timeout_s=300,
    )


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.ray
def test_replicas_on_two_nodes_survive_a_dead_node(cluster, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    repeats = 40
    with ray_run(cluster, f"+{RESOURCES}.num_replicas=2", f"+{AGENT}.num_replicas=2") as run:
        run.wait_ready()
        state = run.state()
        placed = [(s["name"], s["replica"], s["node_id"]) for s in state["servers"]]
        worker_ids = {node for name, _, node in placed if name != "policy_model"}
        assert len(worker_ids) == 2, placed  # replicas spread over the two nodes
        (worker_node,) = worker_ids - {
            node for name, _, node in placed if name == "policy_model"
        }  # the policy is on the head node

        collect = [
            str(BIN / "ng_collect_rollouts"),
            f"+head_server_url={run.head_url}",
            "+agent_name=weather_agent",
            f"+input_jsonl_fpath={ROWS}",
            f"+output_jsonl_fpath={out}",
            f"+num_repeats={repeats}",
            "+num_samples_in_parallel=4",
            "+progress=false",
            "+max_retries=6",
        ]
        collector = subprocess.Popen(collect, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while len(rows(out)) < 20:
            assert time.monotonic() < deadline and collector.poll() is None, collector.communicate()[0]
            time.sleep(0.05)
        cluster.workers[0].kill()  # the worker node dies mid-collection, with its replicas
        output, _ = collector.communicate(timeout=600)
        if collector.returncode != 0:  # rollouts lost with the node went to the failures file: resume redoes them
            output += subprocess.run(collect, cwd=tmp_path, capture_output=True, text=True, timeout=600).stdout
        pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows(out))
        assert set(pairs) == {(t, k) for t in range(5) for k in range(repeats)}, output
        assert max(pairs.values()) == 1  # exactly one row per (task, repeat)
        assert all(r["reward"] == 1.0 for r in rows(out))
        run.stop()
    restarted = re.findall(r"server '(\w+)' replica (\d) restarted at", run.output())
    assert restarted and all(
        int(replica) == moved for name, replica in restarted for moved in [replica_on(placed, name, worker_node)]
    ), run.output()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.ray
def test_a_server_that_keeps_dying_stops_the_run_by_name(cluster):
    # a resources server whose config is invalid exits at start with code 2, every time it is restarted
    with ray_run(cluster, f"+{RESOURCES}.no_such_field=1", f"+{RESOURCES}.max_restarts=1") as run:
        run.process.wait(timeout=300)
        assert run.process.returncode == 1
        output = run.output()
    assert "server 'weather'" in output and "max_restarts=1" in output and "no_such_field" in output
