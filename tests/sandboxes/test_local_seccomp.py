"""The local provider's seccomp deny list: the compiled program, the syscall numbers against the
kernel headers, and every denied call made from inside a real bubblewrap sandbox."""

from __future__ import annotations

import json
import platform
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from telescope.core.sandbox import SandboxConfig, SandboxUnavailableError
from telescope.sandboxes.local import _seccomp
from telescope.sandboxes.local._seccomp import DENIED, deny_list_program, syscall_numbers

from .conftest import MARKER_VAR
from .test_local_hostile import contained

HEADERS = {
    "x86_64": (
        Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        re.compile(r"#define __NR_(\w+)\s+(\d+)"),
    ),
    "aarch64": (
        Path("/usr/include/asm-generic/unistd.h"),
        re.compile(r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
    ),
}
EPERM, ENOSYS = 1, 38
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17


@pytest.mark.parametrize("machine", _seccomp.SUPPORTED_MACHINES)
def test_syscall_numbers_match_the_kernel_headers(machine: str) -> None:
    header, pattern = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    kernel = {name: int(nr) for name, nr in pattern.findall(header.read_text())}
    ours = syscall_numbers(machine)
    assert {name: kernel.get(name) for name in ours} == ours
    missing = {name for name in DENIED if name not in ours}
    assert missing == ({"iopl", "ioperm"} if machine == "aarch64" else set())
    assert missing.isdisjoint(kernel), f"{missing} exist on {machine}: add their numbers"


def test_program_kills_a_foreign_arch_first() -> None:
    words = [struct.unpack("=HBBI", chunk) for chunk in _chunks(deny_list_program("x86_64"))]
    assert words[0] == (0x20, 0, 0, 4)  # load seccomp_data.arch
    op, jt, jf, arch = words[1]
    assert (op, jt, arch) == (0x15, 0, 0xC000003E)
    assert words[1 + jf + 1] == (0x06, 0, 0, 0x80000000)  # SECCOMP_RET_KILL_PROCESS
    assert len(words) < 256


def test_unknown_machine_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"machine 'riscv64'.*x86_64, aarch64.*seccomp: false"):
        deny_list_program("riscv64")


def test_provider_refuses_to_start_without_a_filter_for_the_machine(
    local_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(SandboxUnavailableError, match="riscv64"):
        LocalSandboxProvider()
    assert LocalSandboxProvider(LocalSandboxKwargs(seccomp=False))._seccomp is None


PROBE = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    return [ret, ctypes.get_errno() if ret == -1 else 0]
numbers = json.loads({numbers!r})
out = {{name: call(nr, 0, 0, 0, 0, 0, 0) for name, nr in numbers.items() if name not in ('clone', 'clone3')}}
out['clone3'] = call(numbers['clone3'], 0, 0)
out['clone_newuser'] = call(numbers['clone'], {newuser}, 0, 0, 0, 0)
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
out['seccomp_mode'] = status['Seccomp'].strip()
print(json.dumps(out))
"""


def _probe(provider: Any, config: SandboxConfig, marker: str) -> dict[str, Any]:
    source = PROBE.format(
        numbers=json.dumps(syscall_numbers()),
        newuser=CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD,
    )
    result = contained(provider, config, marker, source)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def test_every_denied_call_fails_with_eperm_inside_a_sandbox(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

    filtered = _probe(local_provider, marked_config, marker)
    assert filtered.pop("seccomp_mode") == "2"  # SECCOMP_MODE_FILTER
    assert filtered.pop("clone3") == [-1, ENOSYS]  # glibc falls back to clone
    assert filtered.keys() == (set(DENIED) & set(syscall_numbers())) | {"clone_newuser"}
    assert filtered == dict.fromkeys(filtered, [-1, EPERM])

    # The same probe without the filter: these calls are not refused by anything else, so the
    # EPERM above is the filter's doing (ptrace(TRACEME) and unshare(0) succeed, ...).
    bare = _probe(LocalSandboxProvider(LocalSandboxKwargs(seccomp=False)), marked_config, marker)
    assert bare.pop("seccomp_mode") == "0"
    assert bare["ptrace"] == [0, 0] and bare["unshare"] == [0, 0]
    assert bare["clone3"] != [-1, ENOSYS]
    assert {"ptrace", "unshare", "setns", "keyctl", "perf_event_open", "process_vm_readv"} <= {
        name for name, answer in bare.items() if answer != [-1, EPERM]
    }


FOREIGN_ABI = """
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
x32_getpid = libc.syscall(0x40000000 | 39)
print('x32', x32_getpid, ctypes.get_errno(), flush=True)
code = b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3"  # mov eax, 20 (getpid of i386); int 0x80; ret
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
getpid_i386 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print('i386', getpid_i386() == os.getpid(), flush=True)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="int 0x80 and x32 exist on x86_64 only")
def test_a_call_through_another_abi_kills_the_process(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

    bare = contained(
        LocalSandboxProvider(LocalSandboxKwargs(seccomp=False)), marked_config, marker, FOREIGN_ABI
    )
    if "i386 True" not in bare.stdout:
        pytest.skip(f"this kernel does not run i386 system calls (ia32_emulation off): {bare}")
    result = contained(local_provider, marked_config, marker, FOREIGN_ABI)
    assert result.stdout == f"x32 -1 {ENOSYS}\n", result  # x32 shares the arch: ENOSYS, not run
    assert result.exit_code == 128 + 31 and "Bad system call" in result.stderr  # SIGSYS: killed


def test_normal_python_and_numpy_work_runs_under_the_filter(local_provider: Any, marker: str) -> None:
    from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

    numpy = pytest.importorskip("numpy")  # the Daytona venv collects this module too, without numpy
    site = Path(numpy.__file__).parents[1]
    bound = [str(p) for p in (site / "numpy", site / "numpy.libs") if p.exists()]
    provider = LocalSandboxProvider(LocalSandboxKwargs(ro_paths=[*local_provider.kwargs.ro_paths, *bound]))
    config = SandboxConfig(
        memory_mb=1024, max_processes=64, environment_vars={MARKER_VAR: marker, "PYTHONPATH": str(site)}
    )
    source = (
        "import multiprocessing, subprocess, threading, tempfile, os, socket\n"
        "import numpy as np\n"
        "a = np.random.default_rng(0).random((200, 200)); print('numpy', round(float(np.linalg.det(a @ a.T) > 0)))\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "print(subprocess.run(['echo', 'subprocess'], capture_output=True, text=True).stdout.strip())\n"
        "with multiprocessing.Pool(2) as pool:\n    print('pool', sum(pool.map(abs, range(-5, 5))))\n"
        "with tempfile.NamedTemporaryFile() as fh:\n    fh.write(b'x'); print('tmpfile')\n"
        "a, b = socket.socketpair(); a.send(b'socketpair'); print(b.recv(16).decode())\n"
    )
    result = contained(provider, config, marker, source, timeout=30)
    assert result.exit_code == 0, result
    assert result.stdout.split("\n")[:-1] == [
        "numpy 1",
        "thread",
        "subprocess",
        "pool 25",
        "tmpfile",
        "socketpair",
    ], result


def _chunks(program: bytes) -> list[bytes]:
    return [program[i : i + 8] for i in range(0, len(program), 8)]


def test_a_read_only_path_under_tmp_is_mounted_over_the_sandboxs_own_tmp(
    local_provider: Any, marker: str
) -> None:
    """A venv or checkout under the host's /tmp, named in ro_paths, is visible (the sandbox's /tmp is
    mounted first, then the user's paths over it)."""
    import tempfile

    from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

    with tempfile.TemporaryDirectory(dir="/tmp") as shared:
        (Path(shared) / "data.txt").write_text("visible")
        Path(shared).chmod(0o755)  # the sandbox's uid 65534 reads it
        provider = LocalSandboxProvider(
            LocalSandboxKwargs(ro_paths=[*local_provider.kwargs.ro_paths, shared])
        )
        config = SandboxConfig(environment_vars={MARKER_VAR: marker})
        source = f"print(open({str(Path(shared) / 'data.txt')!r}).read())\nopen('/tmp/own', 'w').write('x')\n"
        result = contained(provider, config, marker, source)
    assert result.exit_code == 0 and result.stdout.strip() == "visible", result
