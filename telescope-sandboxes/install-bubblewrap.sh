#!/bin/sh
# Install bubblewrap (the `local` sandbox provider's isolation) and slirp4netns (the outbound-only
# network of a sandbox with network_access: true) and passt (pasta: the private network namespace of a
# single-machine training run, docs/security.md) when missing. Idempotent.
# Debian/Ubuntu via apt-get; prints what to do elsewhere. Needs root (or sudo) to install.
set -eu
if command -v bwrap >/dev/null 2>&1 && command -v slirp4netns >/dev/null 2>&1 && command -v pasta >/dev/null 2>&1; then
    echo "bubblewrap present: $(bwrap --version); slirp4netns and pasta present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install-bubblewrap: not root and no sudo; install the 'bubblewrap' package yourself" >&2
        exit 1
    fi
fi
if command -v apt-get >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bubblewrap slirp4netns passt
elif command -v dnf >/dev/null 2>&1; then
    $SUDO dnf install -y bubblewrap slirp4netns passt
elif command -v apk >/dev/null 2>&1; then
    $SUDO apk add --no-cache bubblewrap slirp4netns passt
else
    echo "install-bubblewrap: unknown package manager; install 'bubblewrap' yourself" >&2
    exit 1
fi
echo "bubblewrap installed: $(bwrap --version)"
