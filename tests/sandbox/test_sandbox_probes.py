"""The sandbox escape corpus (`escape_probes.py`, 70+ probes) against code_exec's real server over HTTP.

For each probe: the verify answer scores it 0 with a recorded reason among the probe's allowed ones (and, when
the probe names one, the recorded error says why it was stopped); it ends within the sandbox's deadline + 2 s;
no sandbox process is left (sandbox uids, children of this process, and a scan of every host process's
command line and environment for the probe's marker); the canary secret in this process's environment
appears nowhere in the answer; the host's listener was never connected to, the host file was never written,
and the canary process (standing for the head/collector server) still runs.

Integration test (about a minute); skipped only when bubblewrap is missing (scripts/setup.sh installs it).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient
from live_servers import serve

from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app

REPO = Path(__file__).resolve().parents[2]
SERVER_DIR = REPO / "resources_servers" / "code_exec"
LIMITS = {
    "wall_time_s": 3.0,
    "test_timeout_s": 1.0,
    "cpu_time_s": 2,
    "memory_mb": 256,
    "max_processes": 16,
    "max_output_bytes": 64 * 1024,
    "max_file_size_mb": 1,
    "max_disk_mb": 4,
    "max_open_files": 64,
}
DEADLINE_S = LIMITS["wall_time_s"] + 2.0
SECRET = "ng-sandbox-canary-" + secrets.token_hex(8)
SECRET_ENV = "NG_SANDBOX_PROBE_SECRET"


def _load_probes():
    spec = importlib.util.spec_from_file_location(
        "nemo_gym_sandbox_escape_probes", Path(__file__).with_name("escape_probes.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


probes = _load_probes()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("bwrap") is None,
        reason="bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap (scripts/setup.sh)",
    ),
]


@pytest.fixture(scope="module")
def server():
    return load_server_class(SERVER_DIR / "app.py")(LIMITS, name="code_exec")


@pytest.fixture(scope="module")
def client(server):
    os.environ[SECRET_ENV] = SECRET  # the server's environment holds a secret
    try:
        with TestClient(server.build_app()) as c:
            server.sandbox.check()
            yield c
    finally:
        os.environ.pop(SECRET_ENV, None)


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    """Host resources the probes aim at: a listening socket, a head server, an abstract unix socket, a canary
    process, a secret file, a path to write, the repo's config and answer files."""
    tmp = tmp_path_factory.mktemp("probes")
    secret_file = tmp / "secret.txt"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    abstract_name = f"ng_probe_{secrets.token_hex(6)}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract_name)
    unix.listen(8)
    unix.setblocking(False)
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with serve(build_head_app()) as head_url:
        yield {
            "listener": listener,
            "unix": unix,
            "canary": canary,
            "listener_port": listener.getsockname()[1],
            "head_port": int(head_url.rsplit(":", 1)[1]),
            "abstract_name": abstract_name,
            "canary_pid": canary.pid,
            "secret_env": SECRET_ENV,
            "secret_file": str(secret_file),
            "host_target": str(tmp / "escaped.txt"),
            "repo_config": str(SERVER_DIR / "configs" / "code_exec.yaml"),
            "repo_data": str(SERVER_DIR / "data" / "code_tasks.jsonl"),
            "server_source": str(SERVER_DIR / "sandbox.py"),
            "nemo_cache": str(Path.home() / ".cache" / "nemo_gym"),
            "max_disk_mb": LIMITS["max_disk_mb"],
            "expected_token": "ng-expected-" + secrets.token_hex(16),
        }
    canary.kill()
    canary.wait()
    listener.close()
    unix.close()


def answer(code: str) -> dict[str, Any]:
    text = f"My solution:\n```python\n{code}\n```"
    return {
        "id": "resp",
        "object": "response",
        "created_at": 0,
        "model": "test",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
    }


def sandbox_leftovers(server, keep: int) -> list[psutil.Process]:
    """Live processes of the sandbox uids, and live children of this test process but `keep` (the canary)."""
    uids = range(server.sandbox.uid_base, server.sandbox.uid_base + 64)
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        try:
            if proc.info["uids"].real in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, AttributeError):
            pass
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid != keep and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def processes_with_marker(marker: str) -> list[int]:
    """Host pids whose command line or environment holds `marker` (read straight from /proc)."""
    needle, found = marker.encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for what in ("cmdline", "environ"):
            try:
                if needle in (entry / what).read_bytes():
                    found.append(int(entry.name))
                    break
            except OSError:
                pass
    return found


@pytest.mark.long
@pytest.mark.parametrize("probe", probes.PROBES, ids=lambda p: p.name)
def test_probe_is_blocked_or_contained(client, server, context, probe):
    marker = f"ngprobe-{probe.name}-{secrets.token_hex(6)}"
    code = probes.PRELUDE.replace("__MARKER__", marker) + probe.code
    expected = context[probe.expected[1:]] if probe.expected.startswith("$") else probe.expected
    row = {
        "responses_create_params": {"input": "escape"},
        "entry_point": "escape",
        "tests": [{"args": [context[key] for key in probe.args], "expected": expected}],
        "response": answer(code),
    }
    start = time.monotonic()
    reply = client.post("/verify", json=row)
    elapsed = time.monotonic() - start
    assert reply.status_code == 200, reply.text
    result = reply.json()
    outcome = result["test_results"][0]
    assert result["reward"] == 0.0, f"{probe.name} escaped: {outcome}"
    assert result["failure_reason"] in probe.reasons, (
        f"{probe.name}: {result['failure_reason']} not in {set(probe.reasons)}: {outcome}"
    )
    if probe.error:
        assert probe.error in (outcome["error"] or ""), f"{probe.name}: {outcome}"
    assert elapsed <= DEADLINE_S, f"{probe.name} took {elapsed:.1f} s (deadline {DEADLINE_S} s)"
    assert sandbox_leftovers(server, keep=context["canary_pid"]) == [], f"{probe.name} left processes behind"
    assert processes_with_marker(marker) == [], f"{probe.name}: a process with its marker survived"
    assert SECRET not in reply.text
    assert context["canary"].poll() is None, "the canary (server) process was killed"
    assert not Path(context["host_target"]).exists()
    for sock in (context["listener"], context["unix"]):
        with pytest.raises(BlockingIOError):
            sock.accept()  # nobody from the sandbox ever connected


def test_corpus_covers_the_promise():
    """At least 40 probes, covering each family of probes."""
    names = {p.name for p in probes.PROBES}
    assert len(probes.PROBES) >= 40
    for needed in (
        "loopback_listener",
        "head_server_http",
        "cloud_metadata",
        "dns_resolution",
        "pid1_environ",
        "parent_environ",
        "repo_config_file",
        "repo_task_data_with_answers",
        "write_host_path",
        "kill_parent",
        "kill_server_pid",
        "ptrace_pid1",
        "mount_tmpfs",
        "unshare_user_namespace",
        "fork_bomb",
        "allocate_10_gib",
        "infinite_loop",
        "stdout_1_gib",
        "double_forked_daemon",
        "disk_fill",
        "many_fds",
        "etc_shadow",
        "root_ssh_key",
        "nemo_gym_cache",
    ):
        assert needed in names
