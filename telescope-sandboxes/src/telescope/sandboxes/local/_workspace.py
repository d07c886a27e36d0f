"""The host side of a local sandbox: a private directory tree and symlink-safe writes into it.

Layout: ``<root>/<id>/`` (host-only) holds ``work/`` (``/workspace`` inside the sandbox) and
``tmp/`` (``/tmp`` inside), both owned by the sandbox uid. Sandboxed code can plant symlinks
in ``work/``; every host-side write therefore walks the path with ``O_NOFOLLOW``, so a write
can never land outside the workspace.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tempfile
from dataclasses import dataclass

from telescope.core.sandbox.errors import SandboxPathError, SandboxUnavailableError

__all__ = ["INSIDE_TMP", "INSIDE_WORKSPACE", "Workspace", "default_root", "ensure_private_dir"]

INSIDE_WORKSPACE = "/workspace"
INSIDE_TMP = "/tmp"


def default_root() -> str:
    """Where workspaces live unless configured: ``$TMPDIR/telescope-sandboxes``."""
    return os.path.join(tempfile.gettempdir(), "telescope-sandboxes")


def ensure_private_dir(path: str) -> str:
    """Create ``path`` (0711) or check that an existing one is ours and not writable by others.

    A shared temp directory lets anyone create the path first; a directory owned by someone
    else could be swapped under us, so it is refused.
    """
    os.makedirs(path, mode=0o711, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxUnavailableError(
            f"local sandbox: {path} must be a directory owned by uid {os.geteuid()} and not writable by "
            "others (someone else created it?); remove it or set workspace_root"
        )
    return path


@dataclass
class Workspace:
    """Host directories of one sandbox."""

    root: str
    work: str
    tmp: str
    uid: int
    gid: int

    @classmethod
    def create(cls, parent: str | None, sandbox_id: str, uid: int, gid: int) -> Workspace:
        parent = ensure_private_dir(parent or default_root())
        root = tempfile.mkdtemp(prefix=f"{sandbox_id}-", dir=parent)
        os.chmod(root, 0o711)  # the sandbox uid must traverse it for bubblewrap's binds
        ws = cls(root, os.path.join(root, "work"), os.path.join(root, "tmp"), uid, gid)
        for path in (ws.work, ws.tmp):
            os.mkdir(path, 0o700)
            if os.geteuid() == 0:
                os.chown(path, uid, gid)
        return ws

    def remove(self) -> None:
        """Delete the tree (``rmtree`` never follows symlinks)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def disk_usage(self) -> int:
        """Bytes allocated under the workspace (symlinks not followed)."""
        total = 0
        stack = [self.root]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except OSError:
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
        return total

    # ------------------------------------------------------------------ paths
    @staticmethod
    def inside_path(path: str) -> str:
        """Normalise a sandbox path: relative paths are under /workspace; escapes are refused."""
        if "\0" in path:
            raise SandboxPathError(f"path {path!r} contains a NUL byte")
        full = posixpath.normpath(posixpath.join(INSIDE_WORKSPACE, path))
        for top in (INSIDE_WORKSPACE, INSIDE_TMP):
            if full == top or full.startswith(top + "/"):
                return full
        raise SandboxPathError(
            f"path {path!r} is outside the sandbox's writable areas: use a relative path or one under "
            f"{INSIDE_WORKSPACE}/ or {INSIDE_TMP}/"
        )

    def host_path(self, inside: str) -> str:
        """Host path of a normalised inside path (for the unsandboxed mode)."""
        top, host = (INSIDE_TMP, self.tmp) if inside.startswith(INSIDE_TMP) else (INSIDE_WORKSPACE, self.work)
        return host + inside[len(top) :]

    def write_bytes(self, inside_path: str, content: bytes) -> None:
        """Write a file inside the sandbox, creating parents, never following symlinks."""
        inside = self.inside_path(inside_path)
        top, base = (INSIDE_TMP, self.tmp) if inside.startswith(INSIDE_TMP) else (INSIDE_WORKSPACE, self.work)
        parts = [p for p in inside[len(top) :].split("/") if p]
        if not parts:
            raise SandboxPathError(f"upload path {inside_path!r} names a directory, not a file")
        dir_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for part in parts[:-1]:
                child = self._enter_dir(dir_fd, part, inside_path)
                os.close(dir_fd)
                dir_fd = child
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(parts[-1], flags, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise SandboxPathError(f"cannot write {inside_path!r} in the sandbox: {exc}") from exc
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise SandboxPathError(f"upload target {inside_path!r} exists and is not a regular file")
                self._own(fd)
                with os.fdopen(fd, "wb", closefd=False) as fh:
                    fh.write(content)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)

    def _enter_dir(self, dir_fd: int, name: str, shown: str) -> int:
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
            created = True
        except FileExistsError:
            created = False
        try:
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            raise SandboxPathError(
                f"cannot write {shown!r}: {name!r} is not a plain directory ({exc})"
            ) from exc
        if created:
            self._own(child)
        return child

    def _own(self, fd: int) -> None:
        if os.geteuid() == 0:
            os.fchown(fd, self.uid, self.gid)
