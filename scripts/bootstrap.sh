#!/usr/bin/env bash
# Create .venv and install every Telescope package (editable) with the dev tools.
# Idempotent: re-runs only when a pyproject.toml changed. Used by `make quickstart` and `make test`.
#   PYTHON=python3.12 make test                     # pick the interpreter
#   TELESCOPE_TORCH_SPEC="torch==2.9.1" make test   # pick the torch build to install
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${TELESCOPE_VENV:-.venv}"
TORCH_SPEC="${TELESCOPE_TORCH_SPEC:-torch==2.13.0}"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.telescope-install-stamp"
want=$(cat pyproject.toml telescope-*/pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "bootstrap: installing Telescope into $VENV (first run takes a few minutes)" >&2
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/pip" install --quiet "$TORCH_SPEC"
fi
"$VENV/bin/pip" install --quiet \
  -e "./telescope-core[torch,inference,ray,math,wandb]" \
  -e ./telescope-fsdp -e ./telescope-megatron -e "./telescope-envs[datasets,math]" \
  -e "./telescope-sandboxes[e2b,modal,prime]" -e "./telescope-cli[ui]" -e ".[dev]"
echo "$want" > "$stamp"
