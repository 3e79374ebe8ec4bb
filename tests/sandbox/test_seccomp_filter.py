"""code_exec's seccomp filter: its syscall numbers match the kernel headers, and the program is well formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nemo_gym.serving.module_loading import import_file

seccomp_filter = import_file(
    Path(__file__).resolve().parents[2] / "resources_servers" / "code_exec" / "seccomp_filter.py"
)
HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_syscall_numbers_match_the_kernel_headers(machine):
    header = Path(HEADERS[machine])
    if not header.is_file():
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    numbers = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())
    }
    table = seccomp_filter.DENIED_SYSCALLS[machine]
    assert {name: numbers.get(name) for name in table} == table
    assert (
        numbers["clone"] == seccomp_filter.CLONE_SYSCALL[machine] and numbers["clone3"] == seccomp_filter.CLONE3_SYSCALL
    )


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_program_is_a_sock_filter_array(machine):
    program = seccomp_filter.filter_program(machine)
    assert program and len(program) % 8 == 0
    assert len(program) // 8 == len(seccomp_filter.DENIED_SYSCALLS[machine]) + 11 + (machine == "x86_64")


def test_unknown_machine_has_no_filter():
    assert seccomp_filter.filter_program("riscv64") is None
