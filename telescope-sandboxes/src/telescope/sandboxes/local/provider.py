"""The ``local`` sandbox provider: bubblewrap + rlimits + an unprivileged uid on this machine.

Each sandbox is a private workspace directory; each ``execute`` starts a fresh bubblewrap
container over it (its own network namespace: no network, or with ``network_access`` an
outbound-only one through slirp4netns that cannot reach the host's loopback; read-only system
paths, new user/pid/ipc/uts namespaces, all capabilities dropped, a seccomp deny list
(``_seccomp``), uid 65534, a new session, killed with its parent). When the command's main
process exits, bubblewrap's pid namespace dies with it, so nothing outlives a command.

Resource limits: rlimits everywhere (RLIMIT_AS per process, RLIMIT_NPROC inside the sandbox's
user namespace, RLIMIT_CPU, RLIMIT_FSIZE, a disk watchdog); where cgroup v2 is delegated to this
process, also a cgroup per sandbox (``_cgroup``: memory of all its processes together with swap
off, pids, a CPU share), which reports an OOM kill as ``limit_exceeded="memory"``. One log line
at start says which holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from telescope.core.sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxConfigError,
    SandboxHandle,
    SandboxProvider,
    SandboxUnavailableError,
)
from telescope.sandboxes.local._cgroup import (
    CGROUP_ROOT,
    CgroupLimits,
    CgroupParent,
    SandboxCgroup,
    find_parent,
    join_argv,
)
from telescope.sandboxes.local._launch import (
    _BWRAP_PROCESSES,
    DEFAULT_RO_PATHS,
    Limits,
    bwrap_argv,
    make_preexec,
    nproc_counted_per_user_namespace,
    snapshot_etc,
    wrapper_argv,
)
from telescope.sandboxes.local._process import RunSpec, kill_group, run_command
from telescope.sandboxes.local._seccomp import deny_list_program, program_fd
from telescope.sandboxes.local._usage import CommandUsage, measured
from telescope.sandboxes.local._usernet import (
    SLIRP_INSTALL,
    SlirpIdentity,
    TunDeviceError,
    UserNet,
    slirp4netns_path,
)
from telescope.sandboxes.local._workspace import INSIDE_TMP, INSIDE_WORKSPACE, Workspace, default_root

__all__ = ["LocalSandboxKwargs", "LocalSandboxProvider", "create_local_provider"]

_log = logging.getLogger(__name__)
_NOBODY = 65534
#: /dev/shm is RAM-backed tmpfs that the disk watchdog cannot see: keep it small.
_MAX_SHM_BYTES = 64 << 20
#: Environment variable tagging unsandboxed processes with their sandbox id.
_STRAY_TAG = "TELESCOPE_SANDBOX_ID"


class LocalSandboxKwargs(BaseModel):
    """Settings of the ``local`` provider."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    bwrap_path: str | None = None
    """Path of the bubblewrap binary; None: ``bwrap`` on PATH."""
    allow_unsandboxed: bool = False
    """Without bubblewrap, run anyway with only rlimits and an unprivileged uid (no filesystem,
    network or PID isolation). Off by default: then a missing bubblewrap is an error."""
    uid: int = Field(default=_NOBODY, ge=1)
    """Unprivileged uid (and gid) the code runs as when Telescope runs as root."""
    workspace_root: str | None = None
    """Directory holding the sandboxes' workspaces; None: ``$TMPDIR/telescope-sandboxes``."""
    ro_paths: list[str] = Field(default_factory=lambda: list(DEFAULT_RO_PATHS))
    """Host paths mounted read-only inside the sandbox (missing ones are skipped)."""
    use_util_linux_wrappers: bool = True
    """Apply limits and the uid switch with ``setpriv``/``prlimit`` (cheap ``vfork`` start) when
    they are installed; False: a ``preexec_fn`` in the forked child."""
    disk_check_interval_s: float = Field(default=0.1, gt=0, le=10)
    """How often the workspace size is checked against ``disk_size_gb`` while a command runs."""
    cgroups: bool = True
    """Hold each sandbox to its memory_mb (swap off), max_processes and cpu with a cgroup v2 of its
    own where this process may create one (delegation: systemd ``Delegate=yes``, a container's
    own cgroup namespace, root); elsewhere the rlimits alone hold (one log line says which)."""
    cgroup_root: str = CGROUP_ROOT
    """Where the cgroup v2 hierarchy is mounted."""
    cgroup_parent: str | None = None
    """A delegated cgroup (relative to ``cgroup_root``) to create the sandboxes' cgroups under;
    None: ``telescope-sandboxes`` under this process's own cgroup. Set it when this process's
    cgroup holds processes and so cannot hand controllers to a child (the kernel refuses)."""
    seccomp: bool = True
    """Install the seccomp deny list (``_seccomp.DENIED``: ptrace, mount, namespaces, keyring,
    bpf, perf, io_uring, modules, ... answer EPERM). Supported on x86_64 and aarch64; turn it off
    only on another machine, where it cannot be built."""


@dataclass
class _LocalSandbox:
    workspace: Workspace
    running: set[asyncio.subprocess.Process] = field(default_factory=set)
    cgroup: SandboxCgroup | None = None


class LocalSandboxProvider(SandboxProvider):
    """Sandboxes on this machine (see the module docstring for the isolation it provides)."""

    name = "local"

    def __init__(self, kwargs: LocalSandboxKwargs | None = None) -> None:
        self.kwargs = kwargs or LocalSandboxKwargs()
        self.bwrap = self._find_bwrap()
        self._as_root = os.geteuid() == 0
        self._etc: str | None = None
        self._seccomp: bytes | None = None
        self._cgroups: CgroupParent | None = None
        # As root the command runs as uid 65534, whose other processes are few: limit it anyway.
        self._nproc_limit = self._as_root or nproc_counted_per_user_namespace()
        self._choose_cgroups()
        if self.bwrap is None:
            self._warn_unsandboxed()
            return
        if self.kwargs.seccomp:
            try:
                self._seccomp = deny_list_program()
            except ValueError as exc:
                raise SandboxUnavailableError(str(exc)) from None
        if not self._nproc_limit:
            _log.warning(
                "local sandbox: no process limit (max_processes): kernel %s counts RLIMIT_NPROC per user "
                "across the machine, so it would count your own processes; Linux 5.14+ counts it per "
                "user namespace, or run Telescope as root to run sandboxes as uid %d",
                os.uname().release,
                self.kwargs.uid,
            )

    # ----------------------------------------------------------------- setup
    def _choose_cgroups(self) -> None:
        """Use cgroup v2 limits where delegated; say in one line which mechanism holds."""
        rlimits = (
            "rlimits (memory_mb: RLIMIT_AS per process; max_processes: RLIMIT_NPROC in the sandbox's user "
            "namespace; cpu time: RLIMIT_CPU; no CPU share)"
        )
        if not self.kwargs.cgroups:
            _log.info("local sandbox limits: %s; cgroups off (cgroups: false)", rlimits)
            return
        found = find_parent(self.kwargs.cgroup_root, parent=self.kwargs.cgroup_parent)
        if isinstance(found, str):
            _log.info("local sandbox limits: %s; no cgroup v2 limits: %s", rlimits, found)
            return
        self._cgroups = found
        _log.info(
            "local sandbox limits: a cgroup v2 per sandbox under %s (memory.max with swap off, pids.max, "
            "cpu.max) and the %s",
            found.path,
            rlimits,
        )

    def _etc_dir(self) -> str:
        if self._etc is None:
            self._etc = snapshot_etc(
                self.kwargs.workspace_root or default_root(), tuple(self.kwargs.ro_paths)
            )
        return self._etc

    def _find_bwrap(self) -> str | None:
        path = self.kwargs.bwrap_path or shutil.which("bwrap")
        if path is not None and os.access(path, os.X_OK):
            return path
        if self.kwargs.bwrap_path is not None:
            raise SandboxUnavailableError(
                f"local sandbox: bwrap_path {self.kwargs.bwrap_path!r} is not executable"
            )
        if not self.kwargs.allow_unsandboxed:
            raise SandboxUnavailableError(
                "local sandbox: bubblewrap (bwrap) is not installed, so untrusted code cannot be isolated. "
                "Install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), or set "
                "allow_unsandboxed: true in the provider kwargs to run with rlimits and an unprivileged uid only."
            )
        return None

    def _warn_unsandboxed(self) -> None:
        missing = (
            "filesystem isolation (code can read every world-readable file), network isolation, PID isolation"
        )
        if not self._as_root:
            missing += (
                ", the unprivileged uid and the process limit (not root: code runs as the current user)"
            )
        _log.warning("local sandbox WITHOUT bubblewrap: rlimits only; missing protection: %s", missing)

    def check_config(self, config: SandboxConfig) -> None:
        if config.image:
            raise SandboxConfigError(
                f"local sandbox: image={config.image!r} is not supported (it runs on the host's read-only "
                "system files); leave image empty or choose a cloud provider (e2b, modal, daytona, prime)"
            )
        if config.gpu_count:
            raise SandboxConfigError(f"local sandbox: gpu_count={config.gpu_count} is not supported; use 0")
        cores = os.cpu_count() or 1
        if config.cpu > cores:
            raise SandboxConfigError(
                f"local sandbox: cpu={config.cpu:g} exceeds this machine's {cores} cores"
            )
        if self.bwrap is not None and config.network_access and slirp4netns_path() is None:
            raise SandboxConfigError(
                "local sandbox: network_access=true gives the sandbox its own outbound-only network "
                f"(never the host's, whose loopback services it could reach), which needs slirp4netns: {SLIRP_INSTALL}"
            )
        if self.bwrap is not None and config.network_access:
            self._slirp_identity()
        if self.bwrap is None and config.network_access is False:
            raise SandboxConfigError(
                "local sandbox: network_access=false cannot be enforced without bubblewrap; install bubblewrap"
            )

    def _slirp_identity(self) -> SlirpIdentity:
        """Who runs a networked sandbox's slirp4netns here; SandboxConfigError when nobody may."""
        uid = self.kwargs.uid if self._as_root else None
        try:
            return SlirpIdentity.choose(uid)
        except TunDeviceError as exc:
            raise SandboxConfigError(str(exc)) from None

    # ----------------------------------------------------------------- provider API
    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        sandbox_id = f"local-{uuid.uuid4().hex[:12]}"
        ws = await asyncio.to_thread(
            Workspace.create, self.kwargs.workspace_root, sandbox_id, self.kwargs.uid, self.kwargs.uid
        )
        cgroup = None
        if self._cgroups is not None:
            limits = CgroupLimits(
                memory_bytes=config.memory_mb << 20,
                pids=config.max_processes + _BWRAP_PROCESSES,
                cpus=config.cpu,
            )
            try:
                cgroup = await asyncio.to_thread(self._cgroups.create, sandbox_id, limits)
            except OSError:
                await asyncio.to_thread(ws.remove)
                raise
        return SandboxHandle(sandbox_id, self.name, config, native=_LocalSandbox(ws, cgroup=cgroup))

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        box: _LocalSandbox = handle.native
        config = handle.config
        inside_cwd = Workspace.inside_path(working_dir or INSIDE_WORKSPACE)
        limits = Limits.for_command(
            config.memory_mb,
            config.disk_size_gb,
            config.max_processes,
            timeout,
            private_uid=self._as_root,
            user_namespace=self.bwrap is not None,
        )
        if not self._nproc_limit:
            limits = dataclasses.replace(limits, sandbox_processes=None)
        uid = self.kwargs.uid if self._as_root else None
        env = self._environment(config)
        usernet = None
        owned_fds: tuple[int, ...] = ()
        if self.bwrap is not None:
            if config.network_access:
                usernet = UserNet(_require_slirp4netns(), identity=self._slirp_identity())
            etc_dir = self._etc_dir()
            if self._seccomp is not None:  # last before the pure bwrap_argv: nothing can leak it
                owned_fds = (program_fd(self._seccomp),)
            argv = bwrap_argv(
                self.bwrap,
                box.workspace,
                inside_cwd=inside_cwd,
                env=env,
                ro_paths=tuple(self.kwargs.ro_paths),
                network=bool(config.network_access),
                command=command,
                shm_bytes=min(int(config.disk_size_gb * 1e9), _MAX_SHM_BYTES),
                etc_dir=etc_dir,
                network_args=tuple(usernet.bwrap_args()) if usernet else (),
                seccomp_fd=owned_fds[0] if owned_fds else None,
                max_processes=limits.sandbox_processes,
            )
            run_env, cwd = {}, None
        else:
            # Tag the processes so strays that left the process group can be found later.
            argv, run_env = ["/bin/sh", "-c", command], {**env, _STRAY_TAG: handle.id}
            cwd = box.workspace.host_path(inside_cwd)
            await asyncio.to_thread(os.makedirs, cwd, exist_ok=True)
        prefix = wrapper_argv(limits, uid, uid) if self.kwargs.use_util_linux_wrappers else None
        preexec = None if prefix is not None else make_preexec(limits, uid, uid)
        argv = [*(prefix or []), *argv]
        cgroup = box.cgroup
        if cgroup is not None:
            # joined before the uid switch (the sandbox's uid may not write cgroup.procs)
            if preexec is None:
                argv = join_argv(cgroup, argv)
            else:
                preexec = _joining(cgroup, preexec)
        ooms = cgroup.oom_kills() if cgroup is not None else 0
        spec = RunSpec(
            argv,
            run_env,
            cwd,
            preexec,
            timeout,
            config.max_output_bytes,
            box.workspace,
            int(config.disk_size_gb * 1e9),
            self.kwargs.disk_check_interval_s,
            box.running,
            usernet,
            owned_fds,
        )
        usage = CommandUsage.begin(cgroup, reaped_here=self.bwrap is None)  # what it used: _usage.py
        try:
            result = measured(usage, await run_command(spec))
        finally:
            if self.bwrap is None:
                await asyncio.to_thread(_kill_strays, handle.id)
        if cgroup is not None and result.exit_code != 0 and cgroup.oom_kills() > ooms:
            # the kernel killed a process for memory.max: say so instead of a bare SIGKILL
            return dataclasses.replace(result, exit_code=None, limit_exceeded="memory")
        return result

    def _environment(self, config: SandboxConfig) -> dict[str, str]:
        home = INSIDE_WORKSPACE
        tmp = INSIDE_TMP
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": tmp,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(config.environment_vars)
        return env

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        box: _LocalSandbox = handle.native
        await asyncio.to_thread(box.workspace.write_bytes, remote_path, content)

    async def _destroy(self, handle: SandboxHandle) -> None:
        box: _LocalSandbox = handle.native
        self._kill_all(box)
        for proc in list(box.running):
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                _log.warning("local sandbox %s: process %d did not exit after SIGKILL", handle.id, proc.pid)
        if self.bwrap is None:
            await asyncio.to_thread(_kill_strays, handle.id)
        if box.cgroup is not None:
            await asyncio.to_thread(_remove_cgroup, box.cgroup)
        await asyncio.to_thread(box.workspace.remove)

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        box: _LocalSandbox = handle.native
        self._kill_all(box)
        if self.bwrap is None:
            _kill_strays(handle.id)
        if box.cgroup is not None:
            _remove_cgroup(box.cgroup)
        box.workspace.remove()

    @staticmethod
    def _kill_all(box: _LocalSandbox) -> None:
        for proc in list(box.running):
            kill_group(proc)


def _kill_strays(sandbox_id: str) -> int:
    """Unsandboxed mode only: SIGKILL processes still tagged with this sandbox's id.

    Best effort (a process can rewrite its environment); bubblewrap's pid namespace makes
    this unnecessary in the normal mode.
    """
    needle = f"{_STRAY_TAG}={sandbox_id}".encode()
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            os.kill(int(name), signal.SIGKILL)
            killed += 1
        except OSError:
            continue
    return killed


def _remove_cgroup(cgroup: SandboxCgroup) -> None:
    """Remove a sandbox's cgroup; one left behind (processes not reaped in time) is only a warning."""
    try:
        cgroup.remove()
    except OSError as exc:
        _log.warning(
            "local sandbox: cgroup %s not removed (%s); remove it with rmdir once empty", cgroup.path, exc
        )


def _joining(cgroup: SandboxCgroup, preexec: Callable[[], None]) -> Callable[[], None]:
    """``preexec`` preceded by the child's move into ``cgroup`` (before it drops its uid)."""

    def join_then_preexec() -> None:
        with open(cgroup.procs, "w") as fh:
            fh.write(str(os.getpid()))
        preexec()

    return join_then_preexec


def _require_slirp4netns() -> str:
    path = slirp4netns_path()
    if path is None:
        raise SandboxConfigError(f"local sandbox: network_access=true needs slirp4netns: {SLIRP_INSTALL}")
    return path


def create_local_provider(kwargs: LocalSandboxKwargs | None = None) -> LocalSandboxProvider:
    """Registry factory of the ``local`` provider."""
    return LocalSandboxProvider(kwargs)
