"""Who opens /dev/net/tun for a networked ``local`` sandbox (``SlirpIdentity``), on simulated devices.

slirp4netns opens the device as the uid it runs as. On a host whose device is root's alone
(``crw-------``: some Debian 12 machines and containers) the sandbox's uid 65534 cannot, and the
sandbox used to fail at its first command. Here the device is a file of the test's making with the
mode under test, so the outcome never depends on this machine's device.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from telescope.core.sandbox import SandboxConfig, SandboxConfigError
from telescope.sandboxes.local import _usernet
from telescope.sandboxes.local._usernet import SlirpIdentity, TunDeviceError

from .conftest import run

SANDBOX_UID = 65534


def device(tmp_path: Path, mode: int, owner: int | None = None) -> str:
    path = tmp_path / "tun"
    path.write_text("")
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return str(path)


@pytest.mark.parametrize(
    ("mode", "owner", "opens"),
    [
        (0o666, 0, True),  # udev's default rule: everyone
        (0o600, 0, False),  # root's alone: not the sandbox's uid
        (0o660, 0, False),  # root's group: the sandbox runs with no group but its own
        (0o600, SANDBOX_UID, True),  # the sandbox's uid owns it
        (0o606, 0, True),  # others may read and write
        (0o604, 0, False),  # others may only read
    ],
)
def test_the_sandbox_uid_runs_slirp4netns_exactly_where_the_mode_lets_it_open_the_device(
    tmp_path: Path, mode: int, owner: int, opens: bool
) -> None:
    if os.geteuid() != 0 and owner != os.getuid():
        pytest.skip("only root can make a file another user owns")
    path = device(tmp_path, mode, owner)
    if opens:
        assert SlirpIdentity.choose(SANDBOX_UID, device=path, privileged=False) == SlirpIdentity(SANDBOX_UID)
        assert SlirpIdentity.choose(SANDBOX_UID, device=path, privileged=True) == SlirpIdentity(SANDBOX_UID)
        return
    confined = SlirpIdentity.choose(SANDBOX_UID, device=path, privileged=True)
    assert confined.confined_root and confined.run_as is None  # root opens it, then drops everything
    with pytest.raises(TunDeviceError) as refused:
        SlirpIdentity.choose(SANDBOX_UID, device=path, privileged=False)
    message = str(refused.value)
    assert "\n" not in message
    assert f"needs {path} opened as uid {SANDBOX_UID}" in message
    assert f"it is {stat.filemode(stat.S_IFREG | mode)} uid {owner}" in message  # what it found
    assert f"chmod 0666 {path}" in message and "network_access: false" in message


def test_a_missing_device_names_the_module_to_load(tmp_path: Path) -> None:
    with pytest.raises(
        TunDeviceError, match=r"cannot be read \(No such file or directory; load the tun module"
    ):
        SlirpIdentity.choose(SANDBOX_UID, device=str(tmp_path / "absent"), privileged=False)


def test_this_process_own_uid_is_judged_by_the_kernel(tmp_path: Path) -> None:
    """Not root: slirp4netns runs as this process; ``os.access`` decides (ACLs included)."""
    if os.geteuid() == 0:
        pytest.skip("root may open any file: the no-access case cannot be made")
    assert SlirpIdentity.choose(None, device=device(tmp_path, 0o600), privileged=False) == SlirpIdentity(None)
    with pytest.raises(TunDeviceError):
        SlirpIdentity.choose(None, device=device(tmp_path, 0o400), privileged=False)


def test_a_root_only_device_refuses_the_networked_sandbox_at_creation_in_one_line(
    local_provider: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where nobody may open the device (a simulated root-only one, no CAP_SYS_ADMIN), create
    refuses with the cause and the fix; before, the first command failed in slirp4netns."""
    if shutil.which("slirp4netns") is None:
        pytest.skip("slirp4netns is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    simulated = device(tmp_path, 0o000)
    monkeypatch.setattr(_usernet, "TUN_DEVICE", simulated)
    monkeypatch.setattr(_usernet, "root_with_cap_sys_admin", lambda: False)
    with pytest.raises(SandboxConfigError) as refused:
        run(local_provider.create(SandboxConfig(network_access=True)))
    message = str(refused.value)
    assert "\n" not in message and f"needs {simulated}" in message and "chmod 0666" in message
    handle = run(local_provider.create(SandboxConfig(network_access=False)))  # no network: no device
    run(local_provider.destroy(handle))
