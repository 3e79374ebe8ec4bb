"""The sandbox escape corpus: programs that try to get out of code_exec's sandbox, one `Probe` each.

Every probe defines `escape(*args)`, which returns `"escaped"` (its test's expected value) only when the
escape worked; otherwise it raises (the error, e.g. `PermissionError: [Errno 1] Operation not permitted`,
is recorded in the verify answer's `test_results`) or returns what it saw instead. `args` name values of the
test's context (ports, pids, paths, secrets of the host; see `test_sandbox_probes.py`). Each probe's code
starts with `PRELUDE`: `MARKER` (a token unique to the probe, which the test looks for in every host
process's command line and environment afterwards), `libc`, `syscall_nr`, `check`.

`reasons`: the failure_reasons that count as "blocked or contained" for the probe; `error`: a text the
test's recorded error must hold (proves it was stopped for the right reason), when given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Probe", "PROBES", "PRELUDE"]

PRELUDE = '''\
import ctypes, errno, glob, os, platform, signal, socket, subprocess, sys, time
MARKER = "__MARKER__"
libc = ctypes.CDLL(None, use_errno=True)
NR = {
    "x86_64": {"bpf": 321, "perf_event_open": 298, "io_uring_setup": 425, "userfaultfd": 323, "add_key": 248,
               "keyctl": 250, "clone3": 435, "kexec_load": 246, "init_module": 175, "open_tree": 428, "fsopen": 430},
    "aarch64": {"bpf": 280, "perf_event_open": 241, "io_uring_setup": 425, "userfaultfd": 282, "add_key": 217,
                "keyctl": 219, "clone3": 435, "kexec_load": 104, "init_module": 105, "open_tree": 428, "fsopen": 430},
}[platform.machine()]

def check(result):
    """'escaped' for a successful libc call, else raise its OSError."""
    if result == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "escaped"

def syscall_nr(name, *args):
    return check(libc.syscall(NR[name], *[ctypes.c_long(a) for a in args]))

'''

EPERM = "Operation not permitted"
STOPPED = frozenset({"tests_failed"})
LIMIT_REASONS = frozenset({"timeout", "cpu_time_limit", "test_time_limit"})


@dataclass(frozen=True)
class Probe:
    """One escape attempt: `code` (after PRELUDE) defines `escape(*args)`; see the module docstring."""

    name: str
    code: str
    args: tuple[str, ...] = ()
    reasons: frozenset[str] = STOPPED
    error: str | None = None
    expected: str = "escaped"  # the test's expected value; "$<key>" takes it from the test's context
    tags: frozenset[str] = field(default_factory=frozenset)


def _reads(name: str, path_arg: str | None = None, path: str | None = None, error: str | None = None) -> Probe:
    """A probe reading a file (a host path from the context, or a fixed one): any content read is an escape."""
    code = "def escape(path):\n    open(path, 'rb').read(1)\n    return 'escaped'\n"
    if path is not None:
        code = f"def escape():\n    open({path!r}, 'rb').read(1)\n    return 'escaped'\n"
    return Probe(name, code, (path_arg,) if path_arg else (), error=error)


def _syscall(name: str, code: str, error: str = EPERM) -> Probe:
    return Probe(name, code, error=error)


PROBES: list[Probe] = [
    # -- network -----------------------------------------------------------------------------------------
    Probe(
        "loopback_listener",
        "def escape(port):\n    socket.create_connection(('127.0.0.1', port), timeout=0.5).sendall(b'x')\n    return"
        " 'escaped'\n",
        ("listener_port",),
        error="ConnectionRefusedError",
    ),
    Probe(
        "head_server_http",
        "def escape(port):\n"
        "    s = socket.create_connection(('127.0.0.1', port), timeout=0.5)\n"
        "    s.sendall(b'GET /servers HTTP/1.0\\r\\n\\r\\n')\n"
        "    return 'escaped' if s.recv(100) else 'no answer'\n",
        ("head_port",),
        error="ConnectionRefusedError",
    ),
    Probe(
        "loopback_ipv6",
        "def escape(port):\n    socket.create_connection(('::1', port), timeout=0.5)\n    return 'escaped'\n",
        ("listener_port",),
    ),
    Probe(
        "loopback_port_scan",
        "def escape(port):\n"
        "    open_ports = []\n"
        "    for p in [22, 80, 443, 2375, 5432, 6379, 8000, 8080, 11000, port, *range(port - 20, port + 20)]:\n"
        "        s = socket.socket()\n"
        "        s.settimeout(0.05)\n"
        "        if s.connect_ex(('127.0.0.1', p)) == 0:\n"
        "            open_ports.append(p)\n"
        "        s.close()\n"
        "    return 'escaped' if open_ports else 'no open port'\n",
        ("listener_port",),
    ),
    Probe(
        "host_abstract_unix_socket",
        "def escape(name):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0' + name)\n    return 'escaped'\n",
        ("abstract_name",),
        error="ConnectionRefusedError",
    ),
    Probe(
        "docker_socket",
        "def escape():\n    socket.socket(socket.AF_UNIX).connect('/var/run/docker.sock')\n    return 'escaped'\n",
        error="FileNotFoundError",
    ),
    Probe(
        "cloud_metadata",
        "def escape():\n    socket.create_connection(('169.254.169.254', 80), timeout=0.5)\n    return 'escaped'\n",
        error="unreachable",
    ),
    Probe(
        "dns_resolution",
        "def escape():\n    socket.getaddrinfo('example.com', 443)\n    return 'escaped'\n",
        error="gaierror",
    ),
    Probe(
        "udp_to_public_dns",
        "def escape():\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))\n    return"
        " 'escaped'\n",
        error="unreachable",
    ),
    Probe(
        "raw_socket",
        "def escape():\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n    return"
        " 'escaped'\n",
        error=EPERM,
    ),
    Probe(
        "network_interfaces",
        "def escape():\n    names = [n for _, n in socket.if_nameindex() if n != 'lo']\n    return 'escaped' if names"
        " else 'only lo'\n",
    ),
    # -- secrets and host files --------------------------------------------------------------------------
    Probe(
        "pid1_environ",
        "def escape(name):\n    return 'escaped' if name.encode() + b'=' in open('/proc/1/environ', 'rb').read() else"
        " 'no secret'\n",
        ("secret_env",),
        error="PermissionError",
    ),
    Probe(
        "all_proc_environ_and_cmdline",
        "def escape(name):\n"
        "    for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
        "        try:\n"
        "            if name.encode() + b'=' in open(path, 'rb').read():\n"
        "                return 'escaped'\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 'no secret'\n",
        ("secret_env",),
    ),
    Probe(
        "own_environment",
        "def escape(name):\n    return 'escaped' if name in os.environ else sorted(os.environ)\n",
        ("secret_env",),
    ),
    Probe(
        "parent_environ",
        "def escape(name):\n    return 'escaped' if name.encode() + b'=' in open(f'/proc/{os.getppid()}/environ',"
        " 'rb').read() else 'no secret'\n",
        ("secret_env",),
    ),
    Probe(
        "expected_answer_in_reach",
        "def escape():\n"
        "    for root, _, files in os.walk('/'):\n"
        "        if root.startswith(('/proc', '/usr', '/sys', '/dev', '/root')):\n"
        "            continue\n"
        "        for f in files:\n"
        "            try:\n"
        "                data = open(os.path.join(root, f), 'rb').read()\n"
        "            except OSError:\n"
        "                continue\n"
        "            at = data.find(b'ng-expected-')\n"
        "            if at >= 0:\n"
        "                return data[at:at + 44].decode(errors='replace')\n"
        "    return 'not found'\n",
        expected="$expected_token",
    ),
    _reads("repo_config_file", "repo_config", error="FileNotFoundError"),
    _reads("repo_task_data_with_answers", "repo_data", error="FileNotFoundError"),
    _reads("server_source", "server_source", error="FileNotFoundError"),
    _reads("host_secret_file", "secret_file", error="FileNotFoundError"),
    _reads("nemo_gym_cache", "nemo_cache", error="FileNotFoundError"),
    _reads("etc_shadow", path="/etc/shadow"),
    _reads("etc_passwd", path="/etc/passwd"),
    _reads("root_ssh_key", path="/root/.ssh/id_rsa", error="FileNotFoundError"),
    _reads("root_bash_history", path="/root/.bash_history", error="FileNotFoundError"),
    Probe(
        "home_ssh_dir",
        "def escape():\n    os.listdir(os.path.expanduser('~/.ssh'))\n    return 'escaped'\n",
        error="FileNotFoundError",
    ),
    Probe(
        "pid1_root_link",
        "def escape():\n    os.listdir('/proc/1/root/etc')\n    return 'escaped'\n",
        error="PermissionError",
    ),
    Probe(
        "sysfs", "def escape():\n    os.listdir('/sys/class/net')\n    return 'escaped'\n", error="FileNotFoundError"
    ),
    Probe(
        "symlink_to_host_file",
        "def escape(path):\n    os.symlink(path, 'link')\n    open('link').read(1)\n    return 'escaped'\n",
        ("secret_file",),
        error="FileNotFoundError",
    ),
    # -- writing outside /work ---------------------------------------------------------------------------
    Probe(
        "write_host_path",
        "def escape(path):\n    open(path, 'w').write('escaped')\n    return 'escaped'\n",
        ("host_target",),
    ),
    Probe(
        "write_system_dirs",
        "def escape():\n    written = []\n    for path in ['/usr/ng_probe', '/ng_probe', '/etc/ng_probe',"
        " '/tmp/ng_probe', '/dev/shm/ng_probe', '/dev/ng_probe', '../ng_probe', '/proc/ng_probe']:\n        try:\n     "
        "       open(path, 'w').write('x')\n            written.append(path)\n        except OSError:\n           "
        " pass\n    return 'escaped' if written else 'nothing written'\n",
    ),
    Probe("sysrq_trigger", "def escape():\n    open('/proc/sysrq-trigger', 'w').write('h')\n    return 'escaped'\n"),
    Probe(
        "proc_sys_hostname",
        "def escape():\n    open('/proc/sys/kernel/hostname', 'w').write('x')\n    return 'escaped'\n",
    ),
    Probe(
        "disk_fill",
        "def escape(max_disk_mb):\n"
        "    total = 0\n"
        "    for i in range(10_000):\n"
        "        with open(f'fill_{i}', 'wb') as f:\n"
        "            f.write(b'x' * (512 * 1024))\n"
        "        total += 512 * 1024\n"
        "        if total > 2 * max_disk_mb * 2**20:\n"
        "            return 'escaped'\n"
        "    return 'escaped'\n",
        ("max_disk_mb",),
        reasons=frozenset({"disk_limit"}),
        error="No space left on device",
    ),
    Probe(
        "huge_file",
        "def escape():\n    open('big', 'wb').write(b'x' * (64 * 2**20))\n    return 'escaped'\n",
        reasons=frozenset({"file_size_limit"}),
    ),
    Probe(
        "device_nodes",
        "def escape():\n    opened = []\n    for path in ['/dev/mem', '/dev/kmem', '/dev/port', '/dev/kmsg',"
        " '/dev/sda', '/dev/vda', '/dev/nvme0n1', '/dev/tty', '/dev/fuse', '/dev/kvm', '/dev/net/tun']:\n        try:\n"
        "            os.close(os.open(path, os.O_RDWR))\n            opened.append(path)\n        except OSError:\n    "
        "        pass\n    return 'escaped' if opened else 'none'\n",
    ),
    Probe(
        "mknod_device",
        "def escape():\n    os.mknod('mem', 0o600 | 0o020000, os.makedev(1, 1))\n    return 'escaped'\n",
        error=EPERM,
    ),
    # -- other processes ---------------------------------------------------------------------------------
    Probe(
        "kill_parent", "def escape():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 'escaped'\n", error=EPERM
    ),
    Probe(
        "kill_server_pid", "def escape(pid):\n    os.kill(pid, signal.SIGKILL)\n    return 'escaped'\n", ("canary_pid",)
    ),
    Probe(
        "kill_everything",
        "def escape(pid):\n"
        "    try:\n"
        "        os.kill(-1, signal.SIGKILL)\n"
        "    except ProcessLookupError:\n"
        "        return 'nothing to kill'\n"
        "    return 'signalled something'\n",
        ("canary_pid",),
        reasons=frozenset({"killed_by_signal", "exited_early", "tests_failed"}),
    ),
    Probe("ptrace_pid1", "def escape():\n    return check(libc.ptrace(16, 1, 0, 0))\n", error=EPERM),  # PTRACE_ATTACH
    Probe(
        "ptrace_traceme", "def escape():\n    return check(libc.ptrace(0, 0, 0, 0))\n", error=EPERM
    ),  # PTRACE_TRACEME
    Probe(
        "process_vm_readv_pid1",
        "def escape():\n"
        "    buf = ctypes.create_string_buffer(8)\n"
        "    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)\n"
        "    remote = (ctypes.c_void_p * 2)(0x400000, 8)\n"
        "    return check(libc.process_vm_readv(1, local, 1, remote, 1, 0))\n",
        error=EPERM,
    ),
    Probe(
        "mount_tmpfs",
        "def escape():\n    return check(libc.mount(b'none', b'/work', b'tmpfs', 0, None))\n",
        error=EPERM,
    ),
    Probe("unshare_user_namespace", "def escape():\n    return check(libc.unshare(0x10000000))\n", error=EPERM),
    Probe(
        "unshare_binary_root",
        "def escape():\n    out = subprocess.run(['unshare', '-Urm', 'id', '-u'], capture_output=True, text=True,"
        " timeout=5)\n    return 'escaped' if out.stdout.strip() == '0' else out.stderr.strip()[-200:]\n",
    ),
    Probe(
        "setns_pid1_net",
        "def escape():\n    fd = os.open('/proc/1/ns/net', os.O_RDONLY)\n    return check(libc.setns(fd, 0))\n",
    ),
    Probe(
        "clone3_new_user", "def escape():\n    return syscall_nr('clone3', 0, 0)\n", error="Function not implemented"
    ),
    Probe("setuid_root", "def escape():\n    os.setuid(0)\n    return 'escaped'\n", error=EPERM),
    Probe(
        "setuid_binaries",
        "def escape():\n    for argv in (['mount', '-t', 'tmpfs', 'none', '/work'], ['su', '-c', 'id -u'], ['newgrp',"
        " 'root'], ['chsh', '-s', '/bin/sh']):\n        try:\n            out = subprocess.run(argv,"
        " capture_output=True, text=True, timeout=3)\n        except OSError:\n            continue\n        if"
        " out.returncode == 0:\n            return 'escaped'\n    return 'all refused'\n",
    ),
    Probe("chroot", "def escape():\n    os.chroot('.')\n    return 'escaped'\n", error=EPERM),
    Probe(
        "raise_hard_limits",
        "import resource\ndef escape():\n    resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY,"
        " resource.RLIM_INFINITY))\n    return 'escaped'\n",
    ),
    Probe(
        "higher_priority",
        "def escape():\n    os.setpriority(os.PRIO_PROCESS, 0, -20)\n    return 'escaped'\n",
        error="PermissionError",
    ),
    Probe("sethostname", "def escape():\n    return check(libc.sethostname(b'pwned', 5))\n", error=EPERM),
    Probe(
        "kernel_keyring",
        "def escape():\n    return syscall_nr('add_key', ctypes.addressof(ctypes.create_string_buffer(b'user')),"
        " ctypes.addressof(ctypes.create_string_buffer(b'k')), 0, 0, -4)\n",
        error=EPERM,
    ),
    Probe("bpf", "def escape():\n    return syscall_nr('bpf', 0, 0, 0)\n", error=EPERM),
    Probe("perf_event_open", "def escape():\n    return syscall_nr('perf_event_open', 0, 0, -1, -1, 0)\n", error=EPERM),
    Probe(
        "io_uring",
        "def escape():\n    return syscall_nr('io_uring_setup', 8,"
        " ctypes.addressof(ctypes.create_string_buffer(120)))\n",
        error=EPERM,
    ),
    Probe("userfaultfd", "def escape():\n    return syscall_nr('userfaultfd', 0)\n", error=EPERM),
    Probe(
        "kexec_and_modules",
        "def escape():\n    try:\n        syscall_nr('init_module', 0, 0, 0)\n    except OSError:\n        pass\n   "
        " return syscall_nr('kexec_load', 0, 0, 0, 0)\n",
        error=EPERM,
    ),
    Probe(
        "new_mount_api",
        "def escape():\n    return syscall_nr('fsopen', ctypes.addressof(ctypes.create_string_buffer(b'tmpfs')), 0)\n",
        error=EPERM,
    ),
    Probe("reboot", "def escape():\n    return check(libc.reboot(0x01234567))\n", error=EPERM),
    # -- resources and lifetime --------------------------------------------------------------------------
    Probe("fork_bomb", "def escape():\n    while True:\n        os.fork()\n", reasons=frozenset({"processes_limit"})),
    Probe(
        "thread_bomb",
        "import threading\ndef escape():\n    while True:\n        threading.Thread(target=time.sleep, args=(3600,),"
        " daemon=True).start()\n",
        reasons=frozenset({"processes_limit", "memory_limit", "tests_failed"}),
    ),
    Probe(
        "allocate_10_gib",
        "def escape():\n    block = bytearray(10 * 2**30)\n    return 'escaped'\n",
        reasons=frozenset({"memory_limit"}),
        error="MemoryError",
    ),
    Probe(
        "mmap_10_gib",
        "import mmap\ndef escape():\n    m = mmap.mmap(-1, 10 * 2**30)\n    m[-1] = 1\n    return 'escaped'\n",
        reasons=frozenset({"memory_limit"}),
        error="Cannot allocate memory",
    ),
    Probe("infinite_loop", "def escape():\n    while True:\n        pass\n", reasons=frozenset({"test_time_limit"})),
    Probe(
        "infinite_loop_in_c",
        "import itertools\ndef escape():\n    return sum(itertools.count())\n",
        reasons=frozenset({"cpu_time_limit", "timeout"}),
    ),
    Probe(
        "loop_ignoring_alarm",
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef escape():\n    while True:\n        pass\n",
        reasons=LIMIT_REASONS,
    ),
    Probe(
        "sleep_with_closed_fds",
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nos.closerange(0, 1024)\ntime.sleep(3600)\n",
        reasons=frozenset({"timeout"}),
    ),
    Probe(
        "stop_self",
        "def escape():\n    os.kill(os.getpid(), signal.SIGSTOP)\n    return 'escaped'\n",
        reasons=frozenset({"timeout"}),
    ),
    Probe(
        "ignore_all_signals",
        "def escape():\n"
        "    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGXCPU, signal.SIGUSR1):\n"
        "        signal.signal(s, signal.SIG_IGN)\n"
        "    while True:\n"
        "        pass\n",
        reasons=frozenset({"cpu_time_limit", "timeout", "killed_by_signal"}),
    ),
    Probe(
        "stdout_1_gib",
        "def escape():\n    chunk = b'x' * 2**20\n    for _ in range(1024):\n        os.write(1, chunk)\n    return"
        " 'escaped'\n",
        reasons=frozenset({"output_limit"}),
    ),
    Probe(
        "stderr_1_gib",
        "def escape():\n    chunk = 'x' * 2**20\n    for _ in range(1024):\n        sys.stderr.write(chunk)\n    return"
        " 'escaped'\n",
        reasons=frozenset({"output_limit"}),
    ),
    Probe(
        "many_fds",
        "def escape():\n    fds = [os.open('/dev/null', os.O_RDONLY) for _ in range(100_000)]\n    return 'escaped'\n",
        reasons=frozenset({"open_files_limit"}),
    ),
    Probe(
        "double_forked_daemon",
        "def escape():\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n           "
        " signal.signal(signal.SIGHUP, signal.SIG_IGN)\n            os.closerange(0, 1024)\n           "
        " os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(3600)', MARKER], {'NG_PROBE':"
        " MARKER})\n        os._exit(0)\n    time.sleep(0.2)\n    return 'daemon started'\n",
        tags=frozenset({"daemon"}),
    ),
    Probe(
        "sleeping_children",
        "def escape():\n"
        "    for _ in range(4):\n"
        "        if os.fork() == 0:\n"
        "            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(3600)', MARKER])\n"
        "    return 'children left behind'\n",
        tags=frozenset({"daemon"}),
    ),
    Probe(
        "daemon_after_harness_exit",
        "def escape():\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        os.execv('/bin/sh', ['sh', '-c', 'while :; do sleep 1; done', MARKER])\n"
        "    os._exit(0)\n",
        reasons=frozenset({"exited_early"}),
        tags=frozenset({"daemon"}),
    ),
]
