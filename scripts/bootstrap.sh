#!/usr/bin/env bash
# Create .venv and install every Telescope package (editable) with the dev tools, and
# .venv-daytona, a small second environment for Daytona's SDK and its tests.
# Idempotent: re-runs only when a pyproject.toml changed. Used by `make quickstart` and `make test`.
#   PYTHON=python3.12 make test                     # pick the interpreter
#   TELESCOPE_TORCH_SPEC="torch==2.9.1" make test   # pick the torch build to install
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${TELESCOPE_VENV:-.venv}"
DAYTONA_VENV="${TELESCOPE_DAYTONA_VENV:-.venv-daytona}"
TORCH_SPEC="${TELESCOPE_TORCH_SPEC:-torch==2.13.0}"
want=$(cat pyproject.toml telescope-*/pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)

# Whether $1 (a virtualenv) was installed from the current pyproject files; creates it if missing.
up_to_date() {
  [ -x "$1/bin/python" ] || "$PYTHON" -m venv "$1"
  [ -f "$1/.telescope-install-stamp" ] && [ "$(cat "$1/.telescope-install-stamp")" = "$want" ]
}

if ! up_to_date "$VENV"; then
  echo "bootstrap: installing Telescope into $VENV (first run takes a few minutes)" >&2
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet "$TORCH_SPEC"
  fi
  "$VENV/bin/pip" install --quiet \
    -e "./telescope-core[torch,inference,ray,math,wandb]" \
    -e ./telescope-fsdp -e ./telescope-megatron -e "./telescope-envs[datasets,math]" \
    -e "./telescope-sandboxes[e2b,modal,prime]" -e ./telescope-cli -e ".[dev]"
  echo "$want" > "$VENV/.telescope-install-stamp"
fi

# Daytona's SDK pins OpenTelemetry below what Ray's dashboard needs (telescope-sandboxes/README.md),
# so it lives apart from Ray and torch; `make test-daytona` runs the tests marked `daytona` here.
if ! up_to_date "$DAYTONA_VENV"; then
  echo "bootstrap: installing Daytona's SDK into $DAYTONA_VENV (about a minute)" >&2
  "$DAYTONA_VENV/bin/pip" install --quiet -e ./telescope-core -e ./telescope-envs \
    -e "./telescope-sandboxes[daytona]" "pytest>=8" "pytest-timeout>=2.3"
  echo "$want" > "$DAYTONA_VENV/.telescope-install-stamp"
fi
