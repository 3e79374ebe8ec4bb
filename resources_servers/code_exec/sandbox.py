"""Run untrusted programs in a bubblewrap (`bwrap`) sandbox with CPU, wall-time, memory, process, file-size,
open-file and output limits, no network, and a fresh working directory as the only writable place.

    sandbox = Sandbox(SandboxLimits(wall_time_s=5))
    result = sandbox.run_python("main.py", files={"main.py": "print(6 * 7)"})
    result.stdout  # "42\\n"

What the sandboxed program sees (each `run` is a fresh sandbox):

- filesystem: a new mount namespace whose root is an empty read-only tmpfs holding only `/usr` (and the
  `/bin`, `/lib*` links or directories), the Python installation (read-only), `/etc/ld.so.cache`, a minimal
  `/dev` and a `/proc` of its own PID namespace; `/work` (the working directory, a fresh tmpfs of
  `max_disk_mb`, gone with the sandbox) is the only writable path; the input files are copied into it by bwrap
  (`--file`), nothing of the host's disk is writable. No `/etc/hostname`, `/home`, `/tmp`, and of `/root` only
  the path to the Python installation when it lies there.
- network: a new network namespace (only its own loopback): no host socket, abstract socket or port is reachable.
- processes: a new PID namespace (the host's processes, and `/proc/<pid>/environ` of the server, are not
  visible); when its first process ends or the sandbox is killed, every process in it is killed by the kernel.
- system calls: a seccomp filter (`seccomp_filter.py`) refuses new namespaces (`unshare`, `setns`, `clone`
  with `CLONE_NEW*`: no user namespace, so no "root" that could mount a RAM-backed tmpfs), mounts, `ptrace`,
  `process_vm_*`, kernel keys, `bpf`, `perf_event_open`, `userfaultfd`, io_uring, modules, `kexec`, `reboot`.
- identity: run by root (the usual case in CI and containers), bwrap keeps real root for setting up and the
  program drops to a per-slot uid (`uid_base + slot`, no groups, no capabilities, `no_new_privs`) with
  `setpriv`; that makes RLIMIT_NPROC bite (the kernel never enforces it on uid 0) and gives each concurrent
  run its own process count. Run by another user, bwrap makes a user namespace instead (the limit then
  counts the processes of that namespace).
- environment: empty but `PATH=/usr/bin:/bin`, `HOME=TMPDIR=/work`, `LANG=C.UTF-8`; bwrap itself is started
  with that environment too, so not even the sandbox's PID 1 holds the server's variables. No fd but
  stdin (`/dev/null`), stdout and stderr is inherited.
- limits (`prlimit`, applied inside the namespaces): RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE,
  RLIMIT_NOFILE; the size of `/work` (tmpfs `size=`); the wall time and the output size are enforced by this
  module, which kills the sandbox.

Limits of this design: memory is capped per process (RLIMIT_AS), not in total (no cgroups here: a program
may hold `max_processes * memory_mb`); the tmpfs of `/work` is memory too (at most `max_disk_mb` per run);
`limits_hit` entries read from stderr (`memory`, `processes`, `file_size`, `disk`, `open_files`) are diagnostics the
program could fake, never used for scoring.

Requires the `bwrap` binary, version 0.8 or later for `--size` (Debian 12, Ubuntu 24.04: `apt-get install
bubblewrap`), and `prlimit` and `setpriv`
(util-linux, present on every Debian/Ubuntu). `Sandbox.check()` says what is missing.
"""

from __future__ import annotations

import os
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

import psutil

from nemo_gym.common.errors import ServerError

from . import seccomp_filter

__all__ = ["SandboxLimits", "SandboxResult", "Sandbox", "SandboxUnavailableError", "WORKDIR", "KilledBy"]

WORKDIR = "/work"
SANDBOX_PATH = "/usr/bin:/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
READ_ONLY_FILES = ("/etc/ld.so.cache",)
UID_FLOOR = 2_000_000_000  # sandbox uids lie far above any real account's (uid_t goes to 4_294_967_294)
MAX_SLOTS = 64
KILL_GRACE_S = 1.0
KilledBy = Literal["wall_time", "output_limit", "cpu_time", "signal"]
# stderr markers of a limit reached (diagnostics only: the program writes its own stderr).
STDERR_LIMIT_MARKERS = {
    "memory": ("MemoryError", "Cannot allocate memory"),
    "processes": ("Resource temporarily unavailable",),
    "file_size": ("File too large",),
    "open_files": ("Too many open files",),
    "disk": ("No space left on device",),
}


class SandboxUnavailableError(ServerError):
    """The sandbox cannot run here (bwrap, prlimit or setpriv missing, or namespaces refused). Code is never
    run unsandboxed instead: the rollout is an infrastructure failure, not a reward 0."""

    failure_class = "sandbox_unavailable"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run. Units are in the names."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 10
    memory_mb: int = 512  # RLIMIT_AS of each process
    max_processes: int = 32  # RLIMIT_NPROC: processes and threads of the sandbox's uid
    max_output_bytes: int = 64 * 1024  # stdout + stderr; the sandbox is killed past it
    max_file_size_mb: int = 16  # RLIMIT_FSIZE
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_disk_mb: int = 64  # size of the /work tmpfs (all files together)

    def prlimit_args(self) -> list[str]:
        """`prlimit` options (soft:hard); the CPU hard limit is one second above the soft one (SIGXCPU first)."""
        return [
            f"--cpu={self.cpu_time_s}:{self.cpu_time_s + 1}",
            f"--as={self.memory_mb * 2**20}",
            f"--nproc={self.max_processes}",
            f"--fsize={self.max_file_size_mb * 2**20}",
            f"--nofile={self.max_open_files}",
            "--core=0",
        ]


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended.

    `exit_code`: the program's exit status, None when it was killed by a signal (`signal` names it) or by
    this module (`killed_by`). `stdout`/`stderr`: decoded (UTF-8, replacement characters), at most
    `max_output_bytes` together, `output_truncated` when more was written. `limits_hit`: names among
    `wall_time`, `cpu_time`, `output`, `memory`, `processes`, `file_size`, `disk`, `open_files`.
    """

    exit_code: int | None
    signal: str | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_by: KilledBy | None
    limits_hit: list[str] = field(default_factory=list)
    output_truncated: bool = False
    wall_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0."""
        return self.exit_code == 0 and self.killed_by is None


class Sandbox:
    """A factory of sandboxed runs sharing limits; `run` is thread-safe (at most `max_concurrent` at once).

    Args:
        limits: the limits of each run.
        python_executable: interpreter for `run_python` (default: the base interpreter of this Python, i.e.
            not the virtual environment: the sandbox sees the standard library only).
        bwrap_path: the bwrap binary (default: found on PATH).
        max_concurrent: runs at the same time; more calls wait for a free slot.
        uid_base: first uid of the per-slot uids used when running as root (default: derived from this
            process's pid, so that two servers on one machine never share a uid, its process count or its sweep).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        python_executable: str | None = None,
        bwrap_path: str | None = None,
        max_concurrent: int = 2,
        uid_base: int | None = None,
    ):
        if not 1 <= max_concurrent <= MAX_SLOTS:
            raise ValueError(f"max_concurrent must be in [1, {MAX_SLOTS}], got {max_concurrent}")
        self.limits = limits or SandboxLimits()
        self.python = os.path.realpath(python_executable or getattr(sys, "_base_executable", None) or sys.executable)
        self.bwrap = bwrap_path or shutil.which("bwrap")
        self.prlimit = shutil.which("prlimit")
        self.setpriv = shutil.which("setpriv")
        self.as_root = os.geteuid() == 0
        self.uid_base = uid_base if uid_base is not None else UID_FLOOR + os.getpid() * MAX_SLOTS
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(max_concurrent):
            self._slots.put(slot)
        self._problem: str | None = None
        self._checked = False

    # -- availability ---------------------------------------------------------------------------------------
    def check(self) -> None:
        """Make sure sandboxed runs work here (a smoke run, done once).

        Raises:
            SandboxUnavailableError: what is missing and how to install it.
        """
        if not self._checked:
            self._problem = self._find_problem()
            self._checked = True
        if self._problem:
            raise SandboxUnavailableError(self._problem)

    def _find_problem(self) -> str | None:
        tools = (("bwrap", self.bwrap), ("prlimit", self.prlimit))
        missing = [name for name, path in tools if not path or not os.access(path, os.X_OK)]
        if self.as_root and not self.setpriv:
            missing.append("setpriv")
        if missing:
            return (
                f"sandbox unavailable: {', '.join(missing)} not found on PATH; install them "
                "(Debian/Ubuntu: apt-get install -y bubblewrap util-linux)"
            )
        usage = subprocess.run(
            [self.bwrap, "--help"], capture_output=True, text=True, timeout=10, env={"PATH": SANDBOX_PATH}
        )
        if "--size" not in usage.stdout + usage.stderr:
            return (
                f"sandbox unavailable: {self.bwrap} is older than bubblewrap 0.8 (no --size, so the working "
                "directory's size could not be capped); install bubblewrap >= 0.8"
            )
        if not os.access(self.python, os.X_OK):
            return f"sandbox unavailable: python_executable {self.python} is not executable"
        probe = self.run_python("probe.py", {"probe.py": "print('ok')"}, check=False)
        if probe.stdout.strip() != "ok":
            return (
                f"sandbox unavailable: a probe run failed (exit {probe.exit_code}, signal {probe.signal}): "
                f"{probe.stderr.strip()[-500:]} (are user/mount/network namespaces allowed here?)"
            )
        return None

    # -- running --------------------------------------------------------------------------------------------
    def run_python(self, script: str, files: dict[str, str | bytes], *, check: bool = True) -> SandboxResult:
        """Run `python -I -S <script>` (isolated mode, no site-packages) in a fresh sandbox whose working
        directory holds `files` (relative names)."""
        return self.run([self.python, "-I", "-S", script], files, check=check)

    def run(self, argv: list[str], files: dict[str, str | bytes], *, check: bool = True) -> SandboxResult:
        """Run `argv` (paths as seen inside the sandbox; cwd is `/work`) in a fresh sandbox holding `files`
        (relative names, copied into the `/work` tmpfs; read-only for the program when run by root).

        Raises:
            SandboxUnavailableError: the sandbox cannot run here (`check=True` only).
            ValueError: a file name is absolute or leaves the working directory.
        """
        if check:
            self.check()
        names = {name: checked_name(name) for name in files}
        slot = self._slots.get()
        fds: list[int] = []
        try:
            uid = self.uid_base + slot if self.as_root else None
            file_fds = {names[name]: memfd(name, content) for name, content in files.items()}
            fds += file_fds.values()
            program = seccomp_filter.filter_program()
            seccomp_fd = memfd("seccomp", program) if program else None
            if seccomp_fd is not None:
                fds.append(seccomp_fd)
            try:
                return self._execute(self._command(argv, file_fds, seccomp_fd, uid), fds)
            finally:
                if uid is not None:
                    kill_uid_processes(uid)
        finally:
            for fd in fds:
                os.close(fd)
            self._slots.put(slot)

    def _command(
        self, argv: list[str], file_fds: dict[PurePosixPath, int], seccomp_fd: int | None, uid: int | None
    ) -> list[str]:
        command = [
            self.bwrap,
            *filesystem_args(self.python),
            *workdir_args(file_fds, self.limits.max_disk_mb),
            "--chdir",
            WORKDIR,
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            "--setenv",
            "HOME",
            WORKDIR,
            "--setenv",
            "TMPDIR",
            WORKDIR,
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--remount-ro",
            "/",
        ]
        if seccomp_fd is not None:
            command += ["--seccomp", str(seccomp_fd)]
        command.append("--")
        if uid is not None:
            command += [
                self.setpriv,
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return command + [self.prlimit, *self.limits.prlimit_args(), "--", *argv]

    def _execute(self, command: list[str], pass_fds: list[int]) -> SandboxResult:
        start = time.monotonic()
        deadline = start + self.limits.wall_time_s
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": SANDBOX_PATH},
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
        stdout, stderr, killed_by = self._collect(process, deadline)
        code, late = wait_until(process, deadline)
        return self._result(code, stdout, stderr, killed_by or late, time.monotonic() - start)

    def _collect(self, process: subprocess.Popen, deadline: float) -> tuple[bytes, bytes, KilledBy | None]:
        """Read stdout and stderr until both close, the deadline passes or the output cap is reached (then kill)."""
        chunks = {process.stdout: bytearray(), process.stderr: bytearray()}
        cap = self.limits.max_output_bytes
        killed_by: KilledBy | None = None
        with selectors.DefaultSelector() as selector:
            for stream in chunks:
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed_by = "wall_time"
                    break
                for key, _ in selector.select(min(remaining, 0.5)):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    chunks[key.fileobj] += data
                if sum(map(len, chunks.values())) > cap:
                    killed_by = "output_limit"
                    break
        if killed_by:
            kill_group(process)
        for stream in chunks:
            stream.close()
        out, err = (bytes(chunks[s]) for s in (process.stdout, process.stderr))
        return out, err, killed_by

    def _result(
        self, code: int, stdout: bytes, stderr: bytes, killed_by: KilledBy | None, wall_time_s: float
    ) -> SandboxResult:
        cap = self.limits.max_output_bytes
        truncated = len(stdout) + len(stderr) > cap
        stdout = stdout[:cap]
        stderr = stderr[: max(0, cap - len(stdout))]
        signum = None if killed_by else -code if code < 0 else code - 128 if code > 128 else None  # bwrap: 128 + N
        sig_name = signal_name(signum)
        if sig_name == "SIGXCPU":  # the soft RLIMIT_CPU; a program that ignores it gets SIGKILL a second later
            killed_by = "cpu_time"
        elif sig_name:
            killed_by = "signal"
        err_text = stderr.decode("utf-8", "replace")
        limits = {"wall_time": "wall_time", "output_limit": "output", "cpu_time": "cpu_time"}
        limits_hit = [limits[killed_by]] if killed_by in limits else []
        limits_hit += [name for name, markers in STDERR_LIMIT_MARKERS.items() if any(m in err_text for m in markers)]
        return SandboxResult(
            exit_code=None if killed_by else code,
            signal=sig_name,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=err_text,
            timed_out=killed_by == "wall_time",
            killed_by=killed_by,
            limits_hit=limits_hit,
            output_truncated=truncated,
            wall_time_s=round(wall_time_s, 3),
        )


def filesystem_args(python: str) -> list[str]:
    """bwrap options for the read-only system view: system dirs (links kept as links), the Python
    installation of `python` (its ancestors made traversable) and the dynamic loader's cache."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in READ_ONLY_FILES:
        if os.path.isfile(path):
            args += ["--ro-bind", path, path]
    prefix = Path(python).parent.parent  # <prefix>/bin/python3.x
    if not any(prefix == Path(d) or Path(d) in prefix.parents for d in SYSTEM_DIRS):
        for ancestor in reversed(prefix.parents[:-1]):  # /root, /root/.pyenv, ... (not "/")
            args += ["--perms", "0755", "--dir", str(ancestor)]
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def checked_name(name: str) -> PurePosixPath:
    """`name` as a path below `/work`. Raises ValueError when it is empty, absolute or has a `..` part."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or path == PurePosixPath("."):
        raise ValueError(f"sandbox file name {name!r} leaves the working directory")
    return PurePosixPath(WORKDIR) / path


def memfd(name: str, content: str | bytes) -> int:
    """An anonymous in-memory file holding `content`, positioned at its start (for bwrap's `--file FD`)."""
    fd = os.memfd_create(f"ng_sandbox_{Path(name).name}")
    data = content.encode() if isinstance(content, str) else content
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def workdir_args(file_fds: dict[PurePosixPath, int], size_mb: int) -> list[str]:
    """bwrap options for `/work`: a tmpfs of `size_mb` MiB, mode 1777 (the dropped uid writes there), its
    subdirectories (0777) and the files copied from their fds (0644)."""
    args = ["--size", str(size_mb * 2**20), "--perms", "1777", "--tmpfs", WORKDIR]
    dirs = sorted({parent for path in file_fds for parent in path.parents if PurePosixPath(WORKDIR) in parent.parents})
    for directory in dirs:
        args += ["--perms", "0777", "--dir", str(directory)]
    for path, fd in file_fds.items():
        args += ["--perms", "0644", "--file", str(fd), str(path)]
    return args


def wait_until(process: subprocess.Popen, deadline: float) -> tuple[int, KilledBy | None]:
    """Wait for bwrap to exit, killing it at the deadline (a program that closed its stdout and stderr
    cannot outlive the deadline). Returns (exit code as `Popen.returncode`, "wall_time" when killed here)."""
    try:
        return process.wait(max(0.0, deadline - time.monotonic())), None
    except subprocess.TimeoutExpired:
        kill_group(process)
        return process.wait(), "wall_time"


def signal_name(signum: int | None) -> str | None:
    """`SIGKILL` for 9; None for None or an unknown number."""
    try:
        return signal.Signals(signum).name if signum else None
    except ValueError:
        return None


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL bwrap, its process group and every process below it, and wait until they are gone (bwrap's
    `--die-with-parent` would take the PID namespace down too, but asynchronously)."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    kill_and_wait(descendants)


def kill_uid_processes(uid: int) -> None:
    """SIGKILL any process still running as `uid` (a sandbox slot's uid; normally none is left) and wait for it."""
    found = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid:
                found.append(proc)
        except psutil.Error:
            pass
    kill_and_wait(found)


def kill_and_wait(processes: list[psutil.Process]) -> None:
    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + KILL_GRACE_S
    while processes and time.monotonic() < deadline:
        processes = [p for p in processes if alive(p)]
        time.sleep(0.01 if processes else 0)


def alive(proc: psutil.Process) -> bool:
    """Still running (a zombie is dead: it only waits for its parent, itself killed, to reap it)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
