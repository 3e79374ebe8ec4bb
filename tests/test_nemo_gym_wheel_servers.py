"""Resources servers of NVIDIA NeMo Gym 0.4.0's wheel run unmodified under our `ng_run` and score their example rows
as NeMo Gym's own `ng_run` does.

The wheel's server folders (installed by `nemo_gym_peer.peer_venv()`) are run twice with the same deterministic
fake policy (`../shared/bench/fake_openai.py`: it calls a request's first function tool with `{"city": ...}`, then
answers with a fixed message; a judge's request gets a fixed message too):

- **ours**: our `ng_run` on the wheel's own config files (their instances run from the wheel's folders, each NeMo
  Gym folder in an environment with the NeMo Gym 0.4.0 release and its `requirements.txt`), with our `openai_model`
  as `policy_model`; rows collected by our `ng_collect_rollouts`;
- **NeMo Gym's**: NeMo Gym's `ng_run` on the same config files (the wheel's `openai_model` as `policy_model`; every
  server in NeMo Gym's venv, as `../shared/bench/README.md` describes; packages a server's requirements add are
  installed there by `peer_install`); rows collected by NeMo Gym's `ng_collect_rollouts`.

Each chosen server's `data/example.jsonl` rows must get the same reward, row by row (and every other field NeMo
Gym's rollout holds, the whole trajectory included, must be the same in ours). The chosen servers cover
tools, per-session state (example_session_state_mgmt, with one extra row whose reward is 1 only when the state
seeded by /seed_session is the one /verify reads; workplace_assistant), judges that call a model server themselves
(multichallenge, text_to_sql: `policy_model`; simpleqa, ugphysics_judge: their `genrm_model` / `judge_model`
reference pointed at `policy_model`; ugphysics_judge asks it through /v1/chat/completions, right after a forked
math-verify child exits), a server that reaches NeMo Gym through another folder of its tree (gpqa_diamond imports
mcqa's app), the gymnasium agent, and requirements from the package index (mcqa: tiktoken; structeval: xmltodict,
toml; ugphysics_judge: math-verify). Which of the wheel's
95 resources servers run here, and why the others do not: docs/nemo_gym_wheel_servers.md.

Also the bad inputs: a NeMo Gym folder whose requirement cannot install, and a NeMo Gym release that does not exist,
stop ng_run with an error that names the instance and says why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from nemo_gym_peer import BENCH_DIR, peer_env, peer_install, peer_server_dir, peer_site_packages, peer_venv

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import NgRun
from nemo_gym.orchestration.upstream_servers import release_requirements

pytestmark = [pytest.mark.integration, pytest.mark.peer]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAKE_TEXT = "Hello! How can I help?"  # the fake's answer to a request with no function tool (a judge's request)


@dataclass(frozen=True)
class WheelServer:
    folder: str  # resources_servers/<folder> of the wheel
    config: str  # its file under configs/
    agent: str  # the agent instance of that config that runs its rows
    overrides: tuple[str, ...] = ()  # for both ng_runs (a judge's model reference pointed at policy_model)

    @property
    def config_path(self) -> str:
        return f"resources_servers/{self.folder}/configs/{self.config}"


SERVERS = [
    WheelServer("example_single_tool_call", "example_single_tool_call.yaml", "example_single_tool_call_simple_agent"),
    WheelServer(
        "example_session_state_mgmt", "example_session_state_mgmt.yaml", "example_session_state_mgmt_simple_agent"
    ),
    WheelServer(
        "example_tool_call_multireward",
        "example_tool_call_multireward.yaml",
        "example_tool_call_multireward_simple_agent",
    ),
    WheelServer("workplace_assistant", "workplace_assistant.yaml", "workplace_assistant_simple_agent"),
    WheelServer("multichallenge", "multichallenge.yaml", "multichallenge_simple_agent"),
    WheelServer("text_to_sql", "text_to_sql.yaml", "text_to_sql_simple_agent"),
    WheelServer(
        "simpleqa",
        "simpleqa.yaml",
        "simpleqa_simple_agent",
        ("++simpleqa.resources_servers.simpleqa.judge_model_server.name=policy_model",),
    ),
    WheelServer(
        "ugphysics_judge",
        "ugphysics_judge.yaml",
        "ugphysics_judge_simple_agent",
        ("++ugphysics_judge.resources_servers.ugphysics_judge.judge_model_server.name=policy_model",),
    ),
    WheelServer("mcqa", "mcqa.yaml", "mcqa_simple_agent"),
    WheelServer("gpqa_diamond", "gpqa_diamond.yaml", "gpqa_diamond_simple_agent"),
    WheelServer("structeval", "structeval_nonrenderable.yaml", "structeval_nonrenderable_simple_agent"),
    WheelServer(
        "example_multi_turn_gymnasium", "example_multi_turn_gymnasium.yaml", "example_multi_turn_gymnasium_agent"
    ),
]
STATE_ROW = (  # gets one extra row: expected_count = initial_count (reward 1 iff the session state holds)
    "example_session_state_mgmt"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def stop_session(process: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGINT to a process started in its own session (ng_run stops its servers and Ray on it), then SIGKILL to
    whatever of that session is left (Ray's own daemons included)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == process.pid:
                proc.kill()
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    if process.poll() is None:
        process.kill()
    process.wait()


def input_rows(out: Path) -> tuple[Path, dict[int, str]]:
    """One JSONL with every chosen server's example rows, each routed to its agent (`agent_ref`), and the server of
    each row index; the session-state server gets one extra row (expected_count = initial_count)."""
    rows, owners = [], {}
    for server in SERVERS:
        lines = (
            (peer_server_dir("resources_servers", server.folder) / "data" / "example.jsonl").read_text().splitlines()
        )
        examples = [json.loads(line) for line in lines if line.strip()]
        if server.folder == STATE_ROW:
            examples.append({**examples[0], "expected_count": examples[0]["initial_count"], "extra_row": "state_held"})
        for row in examples:
            owners[len(rows)] = server.folder
            # the task index stamped: NeMo Gym's collector would give two equal rows (some example files have them) one
            # task index; ours numbers rows by line, as this does
            rows.append(
                {
                    **row,
                    "agent_ref": {"type": "responses_api_agents", "name": server.agent},
                    "_ng_task_index": len(rows),
                }
            )
    path = out / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, owners


def read_rollouts(path: Path, expected: int) -> dict[int, dict[str, Any]]:
    rows = read_jsonl(path)
    by_task = {int(row["_ng_task_index"]): row for row in rows}
    assert len(rows) == expected == len(by_task), (
        f"{path}: {len(rows)} rollouts for {expected} rows (tasks {sorted(by_task)})"
    )
    return by_task


@pytest.fixture(scope="module")
def fake_policy(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("fake") / "fake.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, str(BENCH_DIR / "fake_openai.py"), "--port", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", process)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_session(process, grace_s=5)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    peer_venv()
    return input_rows(tmp_path_factory.mktemp("rows"))


@pytest.fixture(scope="module")
def our_run(tmp_path_factory, fake_policy, rows) -> dict[str, Any]:
    """Every row collected through our ng_run running the wheel's folders, with our ng_collect_rollouts (`rows`), and
    the Ray addresses the NeMo Gym servers connected to (`ray_addresses`, from their logs)."""
    rows_path, owners = rows
    out = tmp_path_factory.mktemp("ours")
    site = peer_site_packages()
    configs = [str(site / server.config_path) for server in SERVERS] + [
        "responses_api_models/openai_model/configs/openai_model.yaml"
    ]
    overrides = [override for server in SERVERS for override in server.overrides]
    with NgRun(
        f"+config_paths=[{','.join(configs)}]",
        f"+policy_base_url={fake_policy}",
        "+policy_api_key=dummy-key",
        "+policy_model_name=fake-policy",
        *overrides,
        timeout_s=600,
        env={"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"},
    ) as run:
        head = run.wait_ready()
        output = out / "rollouts.jsonl"
        done = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+head_server_url={head}",
                f"+input_jsonl_fpath={rows_path}",
                f"+output_jsonl_fpath={output}",
                "+num_repeats=1",
                "+num_samples_in_parallel=8",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            "our ng_collect_rollouts"
            f" failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nng_run:\n{run.output()[-3000:]}"
        )
        failures = out / "rollouts_failures.jsonl"
        assert not failures.exists() or not failures.read_text().strip(), (
            f"failed rollouts:\n{failures.read_text()[:4000]}"
        )
        logs = Path(re.search(r"Logs: (\S+)\.", run.output()).group(1))
        addresses = [
            match
            for log in logs.glob("*.log")
            for match in re.findall(
                r"Connecting to existing Ray cluster at address: (\d+\.\d+\.\d+\.\d+:\d+)",
                log.read_text(errors="replace"),
            )
        ]
        return {"rows": read_rollouts(output, len(owners)), "ray_addresses": addresses}


@pytest.fixture(scope="module")
def ours(our_run) -> dict[int, dict[str, Any]]:
    return our_run["rows"]


@pytest.fixture(scope="module")
def nemo_gyms(tmp_path_factory, fake_policy, rows, ours) -> dict[int, dict[str, Any]]:
    """Every row collected through NeMo Gym's own ng_run and ng_collect_rollouts (after ours has stopped: one run at
    a time on this machine)."""
    rows_path, owners = rows
    work = tmp_path_factory.mktemp("nemo_gym")
    for server in SERVERS:  # what each server's requirements.txt adds to NeMo Gym
        peer_install(release_requirements(peer_server_dir("resources_servers", server.folder)))
    venvs = (
        work / "venvs"
    )  # NeMo Gym's per-server venvs: links to its venv (skip_venv_if_present), see ../shared/bench/README.md
    folders = [f"resources_servers/{s.folder}" for s in SERVERS] + [
        "responses_api_agents/simple_agent",
        "responses_api_agents/gymnasium_agent",
        "responses_api_models/openai_model",
    ]
    for folder in folders:
        (venvs / folder).mkdir(parents=True)
        (venvs / folder / ".venv").symlink_to(peer_venv())
    head_port = free_port()
    configs = [server.config_path for server in SERVERS] + [
        "responses_api_models/openai_model/configs/openai_model.yaml"
    ]
    head = ["+head_server.host=127.0.0.1", f"+head_server.port={head_port}"]
    argv = [
        str(peer_venv() / "bin" / "ng_run"),
        f"+config_paths=[{','.join(configs)}]",
        *head,
        f"+policy_base_url={fake_policy}",
        "+policy_api_key=dummy-key",
        "+policy_model_name=fake-policy",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={venvs}",
        *(o for s in SERVERS for o in s.overrides),
    ]
    log = work / "ng_run.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            argv, cwd=work, stdout=handle, stderr=subprocess.STDOUT, env=peer_env(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + 600
        while "servers ready!" not in log.read_text():
            assert process.poll() is None, (
                f"NeMo Gym's ng_run exited with {process.returncode}:\n{log.read_text()[-5000:]}"
            )
            assert time.monotonic() < deadline, f"NeMo Gym's ng_run not ready after 600 s:\n{log.read_text()[-5000:]}"
            time.sleep(0.5)
        output = work / "rollouts.jsonl"
        done = subprocess.run(
            [
                str(peer_venv() / "bin" / "ng_collect_rollouts"),
                *head,
                f"+input_jsonl_fpath={rows_path}",
                f"+output_jsonl_fpath={output}",
                "+num_repeats=1",
                "+num_samples_in_parallel=8",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
            env=peer_env(),
        )
        assert done.returncode == 0, (
            "NeMo Gym's ng_collect_rollouts"
            f" failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nng_run:\n{log.read_text()[-3000:]}"
        )
        return read_rollouts(output, len(owners))
    finally:
        stop_session(process)


# the runs of the wheel's servers (both ng_runs and their collections: 325 s on 2 AVX2 cores, the module fixtures) are
# beyond CI's budget on 2 cores: `pytest -m slow` (docs/tests.md); the bad inputs below run in CI
@pytest.mark.slow
@pytest.mark.parametrize("server", [s.folder for s in SERVERS])
def test_example_rows_score_as_under_nemo_gyms_ng_run(server, rows, ours, nemo_gyms):
    """Same reward for every row; and every field NeMo Gym's rollout has (the verifier's fields, the whole `response`
    trajectory) is in ours with the same value. Ours also keeps the row's own task fields, which NeMo Gym's collector
    writes only when the server's verify answer repeats them."""
    _, owners = rows
    tasks = [task for task, owner in owners.items() if owner == server]
    got = [ours[task]["reward"] for task in tasks]
    expected = [nemo_gyms[task]["reward"] for task in tasks]
    assert got == expected, f"{server}: rewards of its rows (ours vs NeMo Gym's): {got} vs {expected}"
    for task in tasks:
        differ = {
            key: (ours[task].get(key, "<missing>"), value)
            for key, value in nemo_gyms[task].items()
            if ours[task].get(key, "<missing>") != value
        }
        assert not differ, (
            f"{server}, row {task}: fields that differ (ours, NeMo Gym's): {json.dumps(differ, default=str)[:3000]}"
        )


@pytest.mark.slow
def test_session_state_holds_from_seed_to_verify(rows, ours, nemo_gyms):
    """The extra row's expected count is the seeded one: reward 1 only when /verify sees the counter /seed_session
    stored for the same session (the fake's tool call has the wrong arguments, so the count never changes)."""
    _, owners = rows
    extra = [task for task in owners if ours[task].get("extra_row") == "state_held"]
    assert len(extra) == 1
    assert ours[extra[0]]["reward"] == nemo_gyms[extra[0]]["reward"] == 1.0


@pytest.mark.slow
def test_judges_called_our_model_server(rows, ours):
    """The judges asked our policy_model (the fake behind it) and kept its answer: simpleqa through /v1/responses,
    ugphysics_judge through /v1/chat/completions (the fake's chat ids start with chatcmpl-)."""
    _, owners = rows
    simpleqa = [ours[task] for task, owner in owners.items() if owner == "simpleqa"]
    assert simpleqa and all(row.get("judge_output") == FAKE_TEXT for row in simpleqa), [
        row.get("judge_output") for row in simpleqa
    ]
    ugphysics = [
        ours[task]["judge_evaluations"][0]["response"] for task, owner in owners.items() if owner == "ugphysics_judge"
    ]
    assert ugphysics and all(
        judge["id"].startswith("chatcmpl-") and judge["output"][0]["content"][0]["text"] == FAKE_TEXT
        for judge in ugphysics
    ), ugphysics


# -- bad inputs --------------------------------------------------------------------------------------------------


def wheel_copy(tmp_path: Path, requirement: str | None = None) -> Path:
    """A copy of the wheel's example_single_tool_call folder in a tree of its own (optionally with one more
    requirement line), and a config with just its resources server; returns the config's path."""
    folder = tmp_path / "tree" / "resources_servers" / "example_single_tool_call"
    shutil.copytree(
        peer_server_dir("resources_servers", "example_single_tool_call"),
        folder,
        ignore=shutil.ignore_patterns("__pycache__", ".venv"),
    )
    if requirement:
        with (folder / "requirements.txt").open("a") as handle:
            handle.write(f"\n{requirement}\n")
    config = folder / "configs" / "broken.yaml"
    config.write_text(
        "broken_tool_server:\n  resources_servers:\n    example_single_tool_call:\n      entrypoint: app.py\n"
    )
    return config


def run_to_exit(*overrides: str, timeout_s: float = 600) -> tuple[int, str]:
    run = NgRun(*overrides, timeout_s=timeout_s)
    with run:
        code = run.wait_exit(timeout_s)
    return code, run.output()


def test_a_requirement_that_does_not_install_stops_ng_run_naming_the_server(tmp_path):
    peer_venv()
    config = wheel_copy(tmp_path, "nemo-gym-wheel-test-no-such-package==1.0")
    code, output = run_to_exit(f"+config_paths=[{config}]")
    assert code != 0, output
    assert "'broken_tool_server'" in output and "could not be built" in output, output
    assert "nemo-gym-wheel-test-no-such-package was not found in the package registry" in output, (
        output
    )  # the installer's own error
    assert "Traceback" not in output, output


def test_an_unknown_nemo_gym_release_stops_ng_run_listing_the_releases(tmp_path):
    peer_venv()
    config = wheel_copy(tmp_path)
    code, output = run_to_exit(f"+config_paths=[{config}]", "+nemo_gym_version=9.9.9")
    assert code != 0, output
    assert "'broken_tool_server'" in output and "NeMo Gym release 9.9.9" in output, output
    assert "releases on the index:" in output and "0.4.0" in output, output
    assert "Traceback" not in output, output


@pytest.mark.slow
def test_nemo_gym_servers_reach_ray_on_loopback(our_run):
    """The Ray head ng_run starts for the NeMo Gym servers is on 127.0.0.1, and they connect to it there (Ray would
    otherwise replace 127.0.0.1 by the machine's network address)."""
    addresses = our_run["ray_addresses"]
    assert addresses and all(address.startswith("127.0.0.1:") for address in addresses), addresses
