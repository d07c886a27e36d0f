"""The seccomp deny list of local sandboxes, compiled to the classic-BPF program that
bubblewrap's ``--seccomp FD`` installs right before it runs the command.

The program, for the machine's architecture (x86_64 or aarch64):

1. kills the process when a system call comes from another ABI (``AUDIT_ARCH`` differs, e.g.
   ``int 0x80`` from a 64-bit process), so numbers of another table cannot slip through;
2. on x86_64, answers ``ENOSYS`` to x32 calls (``__X32_SYSCALL_BIT``), which share the arch;
3. answers ``EPERM`` to every call of `DENIED` and to ``clone`` asking for a new namespace;
4. answers ``ENOSYS`` to ``clone3``, whose flags live in memory a filter cannot read (glibc then
   falls back to ``clone``, as in Docker's and Flatpak's profiles);
5. allows everything else.

Numbers come from the kernel's tables (``asm/unistd_64.h`` for x86_64, ``asm-generic/unistd.h``
for aarch64); ``tests/sandboxes/test_local_seccomp.py`` checks them against the installed
headers and each denied call from inside a real sandbox.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass

__all__ = ["DENIED", "SUPPORTED_MACHINES", "deny_list_program", "program_fd"]

# Classic BPF (linux/filter.h, linux/bpf_common.h) and seccomp (linux/seccomp.h) constants.
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_BPF_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_BPF_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_OFFSET_NR = 0
_OFFSET_ARCH = 4
_OFFSET_ARG0_LOW = 16  # the low 32 bits of args[0] on a little-endian machine
_X32_SYSCALL_BIT = 0x40000000
#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_CLONE_NAMESPACE_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)


@dataclass(frozen=True)
class _Arch:
    audit_arch: int
    numbers: dict[str, int]
    x32_bit: bool = False


#: Calls answered EPERM: debugging other processes, mounts and namespaces (after bubblewrap's
#: own setup), the kernel keyring, eBPF, perf, userfaultfd and io_uring (large attack
#: surfaces), kernel modules and kexec, file handles (escape through a bind mount), and host
#: administration (reboot, swap, accounting, port I/O).
DENIED: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "name_to_handle_at",
    "open_by_handle_at",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "iopl",
    "ioperm",
)

#: Calls added since Linux 5.1 have the same number on every architecture.
_UNIFIED = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
}
_ARCHES: dict[str, _Arch] = {
    "x86_64": _Arch(
        audit_arch=0xC000003E,  # AUDIT_ARCH_X86_64 = EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
        x32_bit=True,
        numbers={
            "clone": 56,
            "ptrace": 101,
            "pivot_root": 155,
            "chroot": 161,
            "acct": 163,
            "mount": 165,
            "umount2": 166,
            "swapon": 167,
            "swapoff": 168,
            "reboot": 169,
            "iopl": 172,
            "ioperm": 173,
            "init_module": 175,
            "delete_module": 176,
            "kexec_load": 246,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "unshare": 272,
            "perf_event_open": 298,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "setns": 308,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "finit_module": 313,
            "kexec_file_load": 320,
            "bpf": 321,
            "userfaultfd": 323,
            **_UNIFIED,
        },
    ),
    "aarch64": _Arch(
        audit_arch=0xC00000B7,  # AUDIT_ARCH_AARCH64 = EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
        numbers={
            "umount2": 39,
            "mount": 40,
            "pivot_root": 41,
            "chroot": 51,
            "acct": 89,
            "unshare": 97,
            "kexec_load": 104,
            "init_module": 105,
            "delete_module": 106,
            "ptrace": 117,
            "reboot": 142,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "clone": 220,
            "swapon": 224,
            "swapoff": 225,
            "perf_event_open": 241,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "setns": 268,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "finit_module": 273,
            "bpf": 280,
            "userfaultfd": 282,
            "kexec_file_load": 294,
            **_UNIFIED,
        },  # no iopl/ioperm on aarch64
    ),
}
SUPPORTED_MACHINES: tuple[str, ...] = tuple(_ARCHES)


def syscall_numbers(machine: str | None = None) -> dict[str, int]:
    """The system call numbers the filter uses on ``machine`` (default: this one)."""
    return dict(_arch(machine).numbers)


def _arch(machine: str | None) -> _Arch:
    machine = machine or platform.machine()
    try:
        return _ARCHES[machine]
    except KeyError:
        raise ValueError(
            f"local sandbox: no seccomp filter for machine {machine!r} (supported: {', '.join(SUPPORTED_MACHINES)}); "
            "set seccomp: false in the local provider kwargs to run without one"
        ) from None


def deny_list_program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one) as an array of ``struct sock_filter``."""
    arch = _arch(machine)
    prog = _Program()
    prog.load(_OFFSET_ARCH)
    prog.jump(_BPF_JEQ_K, arch.audit_arch, true="nr", false="kill")
    prog.label("nr")
    prog.load(_OFFSET_NR)
    if arch.x32_bit:
        prog.jump(_BPF_JGE_K, _X32_SYSCALL_BIT, true="enosys")
    for name in DENIED:
        if name in arch.numbers:
            prog.jump(_BPF_JEQ_K, arch.numbers[name], true="eperm")
    prog.jump(_BPF_JEQ_K, arch.numbers["clone3"], true="enosys")
    prog.jump(_BPF_JEQ_K, arch.numbers["clone"], true="clone")
    prog.ret(_RET_ALLOW)
    prog.label("clone")
    prog.load(_OFFSET_ARG0_LOW)
    prog.jump(_BPF_JSET_K, _CLONE_NAMESPACE_FLAGS, true="eperm", false="allow")
    prog.label("allow")
    prog.ret(_RET_ALLOW)
    prog.label("eperm")
    prog.ret(_RET_ERRNO | errno.EPERM)
    prog.label("enosys")
    prog.ret(_RET_ERRNO | errno.ENOSYS)
    prog.label("kill")
    prog.ret(_RET_KILL_PROCESS)
    return prog.assemble()


def program_fd(program: bytes) -> int:
    """A file descriptor from which bubblewrap reads ``program`` to its end (a pipe whose
    write end is already closed); the caller passes it to the child and closes it."""
    read_end, write_end = os.pipe()
    try:
        if os.write(write_end, program) != len(program):  # far below the pipe's 64 KiB buffer
            raise OSError(f"local sandbox: short write of the {len(program)}-byte seccomp program")
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


class _Program:
    """A classic-BPF assembler with forward labels: ``jump`` targets are resolved to the
    8-bit relative offsets of ``struct sock_filter`` when the program is assembled."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | None, str | None, int]] = []
        self.labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self.code.append((_BPF_LD_W_ABS, None, None, offset))

    def jump(self, op: int, k: int, *, true: str, false: str | None = None) -> None:
        self.code.append((op, true, false, k))

    def ret(self, value: int) -> None:
        self.code.append((_BPF_RET_K, None, None, value))

    def label(self, name: str) -> None:
        if name in self.labels:
            raise ValueError(f"seccomp program: label {name!r} defined twice")
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (op, true, false, k) in enumerate(self.code):
            out += struct.pack("=HBBI", op, self._offset(index, true), self._offset(index, false), k)
        return bytes(out)

    def _offset(self, index: int, label: str | None) -> int:
        if label is None:  # fall through to the next instruction
            return 0
        offset = self.labels[label] - index - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"seccomp program: jump from {index} to {label!r} is {offset} (must be 0..255)")
        return offset
