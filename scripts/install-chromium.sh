#!/bin/sh
# Debian's chromium for the dashboard's browser tests (Playwright drives it by path; its own
# browser download is not used). Idempotent. Without it (no apt-get, no root) the tests skip.
set -eu
if command -v chromium >/dev/null 2>&1; then
    echo "chromium present: $(chromium --version 2>/dev/null || true)"
elif ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; install chromium yourself (browser tests skip)" >&2
elif [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
else
    echo "install-chromium: not root and no sudo; install chromium yourself (browser tests skip)" >&2
fi
