"""The peer policy lets an allowed process in while it has a child that exited and is not reaped yet.

NeMo Gym 0.4.0's math judges (ugphysics_judge, physics_judge, math_with_judge) fork a child per answer to run
math-verify, and call their judge model right after it exits, before it is reaped. The policy looked at the caller's
children to find uvicorn workers, and a zombie child's command line cannot be read (psutil.ZombieProcess): the whole
decision failed, and our policy_model answered the NeMo Gym server's judge call 401 (seen under ng_run with
ugphysics_judge: 4 of its 5 example rows failed). Real processes on loopback: a caller process with a zombie child
connects to a listening socket of the test; the policy, with the caller's PID allowed, must let it in.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil

from nemo_gym.serving.auth import PeerPolicy, write_allowed_peers

# a caller: forks a child that exits at once (never reaped: a zombie), connects, says so, and waits for stdin to close
CALLER = """
import os, socket, sys, time
child = os.fork()
if child == 0:
    os._exit(0)
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
time.sleep(0.3)
print(child, flush=True)
sys.stdin.read()
"""


def test_an_allowed_caller_with_a_zombie_child_is_let_in(tmp_path: Path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        caller = subprocess.Popen(
            [sys.executable, "-c", CALLER, str(listener.getsockname()[1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            connection, client = listener.accept()
            with connection:
                child = int(caller.stdout.readline())
                assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
                scope = {"client": client, "server": connection.getsockname(), "headers": []}
                assert not PeerPolicy(tmp_path).allows(dict(scope))  # not allowed yet
                write_allowed_peers(tmp_path, [caller.pid])
                assert PeerPolicy(tmp_path).allows(dict(scope))
        finally:
            caller.stdin.close()
            caller.wait(10)
