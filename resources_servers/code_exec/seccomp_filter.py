"""A seccomp filter (classic BPF, built here with the standard library) for bwrap's `--seccomp FD`.

It refuses, with EPERM, the system calls a sandboxed program never needs and that widen the kernel surface
or reach outside the sandbox: new namespaces (`unshare`, `setns`, `clone` with a `CLONE_NEW*` flag; this
also stops the user-namespace trick that gives "root" inside to mount a RAM-backed tmpfs), mounts
(`mount`, `umount2`, `pivot_root`, the new mount API), `ptrace` and `process_vm_readv/writev`, `kcmp`,
kernel keys, `bpf`, `perf_event_open`, `userfaultfd`, io_uring, module loading, `kexec`, `reboot`, swap,
`acct`, `syslog`, `quotactl`, host/domain names, file handles, `iopl`/`ioperm`, `lookup_dcookie`, `vhangup`.
`clone3` answers ENOSYS (its flags live in memory a filter cannot read; glibc then falls back to `clone`,
whose flags are checked). A call of another ABI than the native one (i386 or x32 on x86_64, arm32 on
aarch64) is refused too, so the deny list cannot be bypassed through other syscall numbers.

Supported machines: x86_64 and aarch64 (`filter_program()` returns None elsewhere; the sandbox then runs
without the filter and says so in `Sandbox.check()`'s log).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["filter_program", "DENIED_SYSCALLS", "NAMESPACE_CLONE_FLAGS"]

# Syscall numbers: x86_64 from asm/unistd_64.h, aarch64 from asm-generic/unistd.h.
DENIED_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "sethostname": 170,
        "setdomainname": 171,
        "init_module": 175,
        "delete_module": 176,
        "quotactl": 179,
        "acct": 163,
        "ptrace": 101,
        "syslog": 103,
        "unshare": 272,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "finit_module": 313,
        "bpf": 321,
        "userfaultfd": 323,
        "perf_event_open": 298,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "lookup_dcookie": 212,
        "vhangup": 153,
        "iopl": 172,
        "ioperm": 173,
    },
    "aarch64": {
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "sethostname": 161,
        "setdomainname": 162,
        "init_module": 105,
        "delete_module": 106,
        "quotactl": 60,
        "acct": 89,
        "ptrace": 117,
        "syslog": 116,
        "unshare": 97,
        "setns": 268,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "finit_module": 273,
        "bpf": 280,
        "userfaultfd": 282,
        "perf_event_open": 241,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "lookup_dcookie": 18,
        "vhangup": 58,
    },
}
CLONE_SYSCALL = {"x86_64": 56, "aarch64": 220}
CLONE3_SYSCALL = 435
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000  # x86_64 only: syscall numbers of the x32 ABI
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
NAMESPACE_CLONE_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
# struct seccomp_data offsets: nr (u32), arch (u32), ip (u64), args[6] (u64 each; low half first, little endian)
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0_LOW = 0, 4, 16


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one, `platform.machine()`) as bwrap reads it from `--seccomp`:
    an array of `struct sock_filter` (8 bytes each). None on a machine without a table here."""
    machine = machine or platform.machine()
    if machine not in DENIED_SYSCALLS:
        return None
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    denied = sorted(set(DENIED_SYSCALLS[machine].values()))
    # Layout: [arch check][nr load][x32 check][deny list][clone][clone3][allow][clone flags][deny][enosys]
    body: list[tuple[int, int | str, int | str, int]] = [
        (LD_W_ABS, 0, 0, OFFSET_ARCH),
        (JEQ_K, 0, "deny", AUDIT_ARCH[machine]),
        (LD_W_ABS, 0, 0, OFFSET_NR),
    ]
    if machine == "x86_64":
        body.append((JGE_K, "deny", 0, X32_SYSCALL_BIT))
    body += [(JEQ_K, "deny", 0, nr) for nr in denied]
    body += [
        (JEQ_K, "clone_flags", 0, CLONE_SYSCALL[machine]),
        (JEQ_K, "enosys", 0, CLONE3_SYSCALL),
        (RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    labels = {"clone_flags": len(body)}
    body += [
        (LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
        (JSET_K, "deny", 0, NAMESPACE_CLONE_FLAGS),
        (RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    labels["deny"] = len(body)
    body.append((RET_K, 0, 0, deny))
    labels["enosys"] = len(body)
    body.append((RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS))

    def offset(index: int, target: int | str) -> int:
        if isinstance(target, int):
            return target
        jump = labels[target] - index - 1
        assert 0 <= jump <= 255, "BPF jump out of range"
        return jump

    return b"".join(_insn(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(body))
