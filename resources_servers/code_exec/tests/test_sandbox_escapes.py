"""Sandbox escapes, tried through the real server over HTTP (FastAPI TestClient): each one is stopped, scored 0
with its reason recorded, ends within its deadline + 2 s, and leaves no process behind.

Needs bubblewrap (`apt-get install -y bubblewrap`); without it these tests fail with that instruction.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient

from nemo_gym.serving.entrypoint import load_server_class

SERVER_DIR = Path(__file__).resolve().parents[1]
CodeExecServer = load_server_class(SERVER_DIR / "app.py")
LIMITS = {
    "wall_time_s": 3.0,
    "test_timeout_s": 1.0,
    "cpu_time_s": 2,
    "memory_mb": 256,
    "max_processes": 16,
    "max_output_bytes": 64 * 1024,
    "max_file_size_mb": 1,
}
DEADLINE_S = LIMITS["wall_time_s"] + 2.0
SECRET = "ng-code-exec-secret-5f0c2a"


@pytest.fixture(scope="module")
def server():
    return CodeExecServer(LIMITS, name="code_exec")


@pytest.fixture(scope="module")
def client(server):
    with TestClient(server.build_app()) as c:
        server.sandbox.check()  # fails with "install bubblewrap" when it is missing
        yield c


def answer(code: str) -> dict[str, Any]:
    text = f"Here is my solution:\n```python\n{code}\n```"
    return {
        "id": "resp",
        "object": "response",
        "created_at": 0,
        "model": "test",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
    }


def escape(client: TestClient, server, code: str, args: list[Any], expected: Any) -> dict[str, Any]:
    """Verify `code`'s `escape(*args)` against `expected` (what a successful escape would return); check
    the deadline and that no sandbox process is left."""
    row = {
        "responses_create_params": {"input": "escape"},
        "entry_point": "escape",
        "tests": [{"args": args, "expected": expected}],
        "response": answer(code),
    }
    before = {p.pid for p in leftover_processes(server)}  # e.g. helper processes earlier tests of the session left
    start = time.monotonic()
    reply = client.post("/verify", json=row)
    elapsed = time.monotonic() - start
    assert reply.status_code == 200, reply.text
    assert elapsed <= DEADLINE_S, f"took {elapsed:.1f} s (deadline {DEADLINE_S} s)"
    assert [p for p in leftover_processes(server) if p.pid not in before] == []
    result = reply.json()
    assert result["reward"] == 0.0, result
    assert result["failure_reason"], result
    return result


def leftover_processes(server) -> list[psutil.Process]:
    """Processes of the sandbox uids, and children of this test process (bwrap), still alive."""
    uids = range(server.sandbox.uid_base, server.sandbox.uid_base + 64)
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        try:
            if proc.info["uids"].real in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, AttributeError):
            pass
    found += [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    return found


def test_socket_to_a_real_listener_fails(client, server):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "def escape(port):\n"
        "    s = socket.create_connection(('127.0.0.1', port), timeout=0.5)\n"
        "    s.sendall(b'hello')\n"
        "    return 'escaped'\n"
    )
    try:
        result = escape(client, server, code, [port], "escaped")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected
    finally:
        listener.close()
    assert result["failure_reason"] == "tests_failed"
    error = result["test_results"][0]["error"]
    assert "ConnectionRefusedError" in error or "unreachable" in error, error


def test_reading_a_secret_file_in_tmp_fails(client, server, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    code = "def escape(path):\n    return open(path).read()\n"
    result = escape(client, server, code, [str(secret_file)], SECRET)
    assert "FileNotFoundError" in result["test_results"][0]["error"]
    assert SECRET not in str(result["test_results"])


@pytest.mark.parametrize("path", ["/etc/hostname", "/etc/passwd", "/root/.bashrc", str(SERVER_DIR / "app.py")])
def test_reading_host_files_fails(client, server, path):
    code = "def escape(path):\n    return open(path).read()[:50]\n"
    result = escape(client, server, code, [path], "anything")
    assert (
        "FileNotFoundError" in result["test_results"][0]["error"]
        or "PermissionError" in result["test_results"][0]["error"]
    )


def test_server_environment_is_out_of_reach(client, server, monkeypatch):
    monkeypatch.setenv("NG_CODE_EXEC_TEST_SECRET", SECRET)
    code = (
        "import glob, os\n"
        "def escape(secret_name):\n"
        "    found = [k for k in os.environ if k == secret_name]\n"
        "    for path in glob.glob('/proc/*/environ') + [f'/proc/{os.getppid()}/environ']:\n"
        "        try:\n"
        "            if secret_name.encode() in open(path, 'rb').read():\n"
        "                found.append(path)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return found or sorted(os.environ)\n"
    )
    result = escape(client, server, code, ["NG_CODE_EXEC_TEST_SECRET"], ["NG_CODE_EXEC_TEST_SECRET"])
    assert result["failure_reason"] == "tests_failed"
    # The sandbox's whole environment, as the code saw it:
    assert result["test_results"][0]["error"] == 'wrong answer: returned ["HOME", "LANG", "PATH", "PWD", "TMPDIR"]'
    assert SECRET not in str(result)


def test_fork_bomb_is_stopped(client, server):
    code = "import os\ndef escape():\n    while True:\n        os.fork()\n"
    result = escape(client, server, code, [], "escaped")
    assert result["failure_reason"] == "processes_limit"
    assert result["test_results"][0]["limit"] == "processes"


def test_sleeping_children_do_not_survive(client, server):
    code = (
        "import os, time\ndef escape():\n    for _ in range(5):\n        if os.fork() == 0:\n"
        "            os.setsid()\n            time.sleep(3600)\n    return 'escaped'\n"
    )
    result = escape(client, server, code, [], "forked children outlive the sandbox")
    assert result["failure_reason"] == "tests_failed"


def test_infinite_loop_is_stopped_by_the_test_timeout(client, server):
    result = escape(client, server, "def escape():\n    while True:\n        pass\n", [], "escaped")
    assert result["failure_reason"] == "test_time_limit"


def test_infinite_loop_in_c_is_stopped_by_cpu_or_wall_time(client, server):
    code = (  # never returns to the interpreter loop
        "import itertools\ndef escape():\n    return sum(itertools.count())\n"
    )
    result = escape(client, server, code, [], "escaped")
    assert result["failure_reason"] in {"cpu_time_limit", "timeout"}
    assert result["sandbox"]["killed_by"] in {"cpu_time", "wall_time"}
    assert result["sandbox"]["limits_hit"]


def test_closing_stdout_does_not_outlive_the_deadline(client, server):
    # no output pipe left open, the harness's alarm ignored: only the wall-time kill can end it
    code = (
        "import os, signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nos.closerange(0,"
        " 1024)\ntime.sleep(3600)\n"
    )
    result = escape(client, server, code, [], "escaped")
    assert result["failure_reason"] == "timeout"


def test_huge_output_is_capped(client, server):
    code = "import os\ndef escape():\n    while True:\n        os.write(1, b'x' * 65536)\n"
    result = escape(client, server, code, [], "escaped")
    assert result["failure_reason"] == "output_limit"
    assert result["sandbox"]["killed_by"] == "output_limit" and "output" in result["sandbox"]["limits_hit"]


def test_big_allocation_is_refused(client, server):
    code = "def escape():\n    block = bytearray(2 * 1024 ** 3)\n    return len(block)\n"
    result = escape(client, server, code, [], 2 * 1024**3)
    assert result["failure_reason"] == "memory_limit"
    assert "MemoryError" in result["test_results"][0]["error"]


def test_writing_outside_the_workdir_fails(client, server, tmp_path):
    target = tmp_path / "escaped.txt"
    code = (
        "import os\n"
        "def escape(paths):\n"
        "    written = []\n"
        "    for path in paths:\n"
        "        try:\n"
        "            with open(path, 'w') as f:\n"
        "                f.write('escaped')\n"
        "            written.append(path)\n"
        "        except OSError as exc:\n"
        "            pass\n"
        "    open('inside.txt', 'w').write('fine')\n"  # the working directory is writable
        "    return written\n"
    )
    paths = [
        str(target),
        "/tmp/ng_code_exec_escape",
        "/usr/ng_code_exec_escape",
        "/ng_code_exec_escape",
        "../ng_code_exec_escape",
    ]
    result = escape(client, server, code, [paths], paths)
    assert result["test_results"][0]["error"] == "wrong answer: returned []"
    assert (
        not target.exists()
        and not Path("/tmp/ng_code_exec_escape").exists()
        and not Path("/usr/ng_code_exec_escape").exists()
    )


def test_big_file_is_capped(client, server):
    code = (
        "def escape():\n    with open('big', 'wb') as f:\n        f.write(b'x' * (8 * 1024 ** 2))\n    return"
        " 'escaped'\n"
    )
    result = escape(client, server, code, [], "escaped")
    assert result["failure_reason"] == "file_size_limit"


def test_sandbox_uid_has_no_privileges(client, server):
    code = "import os\ndef escape():\n    os.setuid(0)\n    return 'escaped'\n"
    result = escape(client, server, code, [], "escaped")
    assert "PermissionError" in result["test_results"][0]["error"]
    assert os.geteuid() != 0 or result["failure_reason"] == "tests_failed"
