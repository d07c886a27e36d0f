#!/usr/bin/env bash
# Create .venv and install every Telescope package (editable) with the dev tools; with --daytona,
# .venv-daytona instead: a small second environment for Daytona's SDK and its tests (make test-daytona).
# Idempotent: re-runs only when a pyproject.toml changed. Used by `make quickstart` and `make test`.
#   PYTHON=python3.12 make test                     # pick the interpreter
#   TELESCOPE_TORCH_SPEC="torch==2.9.1" make test   # pick the torch build to install
#   TELESCOPE_EXTRAS=vllm,megatron make quickstart   # GPU machine: also vLLM (+ tracing, NVML) and Megatron-Core
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${TELESCOPE_VENV:-.venv}"
DAYTONA_VENV="${TELESCOPE_DAYTONA_VENV:-.venv-daytona}"
TORCH_SPEC="${TELESCOPE_TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${TELESCOPE_EXTRAS:-}"  # comma-separated: vllm, megatron (docs/gpu.md)
core_extras="torch,inference,ray,math,wandb,tensorboard,mlflow"  # every logger, so its tests run
megatron_pkg="./telescope-megatron"
for extra in ${EXTRAS//,/ }; do
  case "$extra" in
    vllm) core_extras="$core_extras,vllm" ;;
    megatron) megatron_pkg="./telescope-megatron[megatron]" ;;
    *) echo "bootstrap: unknown TELESCOPE_EXTRAS entry '$extra' (known: vllm, megatron)" >&2; exit 2 ;;
  esac
done
want=$( (cat pyproject.toml telescope-*/pyproject.toml scripts/bootstrap.sh; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)

# Whether $1 (a virtualenv) was installed from the current pyproject files; creates it if missing.
up_to_date() {
  [ -x "$1/bin/python" ] || "$PYTHON" -m venv "$1"
  [ -f "$1/.telescope-install-stamp" ] && [ "$(cat "$1/.telescope-install-stamp")" = "$want" ]
}

if [ "${1:-}" = "--daytona" ]; then
  only_daytona=1
else
  only_daytona=0
fi

if [ "$only_daytona" = 0 ] && ! up_to_date "$VENV"; then
  echo "bootstrap: installing Telescope into $VENV (first run takes a few minutes)" >&2
  # vLLM pins its own torch build: let it choose unless a torch spec was given explicitly.
  if [[ ",$EXTRAS," == *",vllm,"* && -z "${TELESCOPE_TORCH_SPEC:-}" ]]; then
    :
  elif ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet "$TORCH_SPEC"
  fi
  "$VENV/bin/pip" install --quiet \
    -e "./telescope-core[$core_extras]" \
    -e ./telescope-fsdp -e "$megatron_pkg" -e "./telescope-envs[datasets,math]" \
    -e "./telescope-sandboxes[e2b,modal,prime]" -e "./telescope-cli[ui]" -e ".[dev]"
  echo "$want" > "$VENV/.telescope-install-stamp"
fi

# Daytona's SDK pins OpenTelemetry below what Ray's dashboard needs (telescope-sandboxes/README.md),
# so it lives apart from Ray and torch; `make test-daytona` runs the tests marked `daytona` here.
if [ "$only_daytona" = 1 ] && ! up_to_date "$DAYTONA_VENV"; then
  echo "bootstrap: installing Daytona's SDK into $DAYTONA_VENV (about a minute)" >&2
  "$DAYTONA_VENV/bin/pip" install --quiet -e ./telescope-core -e ./telescope-envs \
    -e "./telescope-sandboxes[daytona]" "pytest>=8" "pytest-timeout>=2.3"
  echo "$want" > "$DAYTONA_VENV/.telescope-install-stamp"
fi
