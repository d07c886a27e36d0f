#!/usr/bin/env bash
# One command on a CUDA machine: every `gpu`-marked test (CUDA FSDP packed vs per-sequence logprobs,
# bf16 train steps, the transformers engine on CUDA vs teacher forcing, a LoRA sync into vLLM, ...), the Megatron GPU tests
# (when megatron-core imports), bench/trainer.py --gpu (MFU), bench/inference.py, bench/weight_sync.py,
# bench/gpu_sync.py (a verified two-process sync: NCCL on two GPUs, else CUDA staging over gloo; and
# the cost of verification on the device vs on the host) and, when vLLM imports, bench/vllm_smoke.py
# (serve the tiny model, a completion with logprobs, a verified weight sync); writes a Markdown report
# with each command, its exit code and its output's tail (the benchmark tables).
#   scripts/gpu-check.sh [REPORT.md]          # default: gpu-check-<UTC time>.md
#   scripts/gpu-check.sh --dry-run [REPORT]   # list the steps without running them (works anywhere)
# Exit code: 0 when every step passed, 1 when one failed, 2 without a CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
REPORT="${1:-gpu-check-$(date -u +%Y%m%dT%H%M%SZ).md}"

if [ "$DRY" = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu-check: no CUDA device visible to $PY; run this on a GPU machine (docs/gpu.md)" >&2
  exit 2
fi

failed=0
LOGDIR=$(mktemp -d)
{
  echo "# Telescope GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo '```'
  if [ "$DRY" = 0 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
    "$PY" -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
    "$PY" -c "import megatron.core as m; print('megatron-core', m.__version__)" 2>&1 | tail -1
  else
    echo "dry run: nothing was executed"
  fi
  echo '```'
} > "$REPORT"

step() {  # step TITLE COMMAND...
  local title="$1"; shift
  local log="$LOGDIR/$(echo "$title" | tr -c 'a-zA-Z0-9' '_').log"
  { echo; echo "## $title"; echo; echo "\`$*\`"; echo; } >> "$REPORT"
  if [ "$DRY" = 1 ]; then echo "- not run (dry run)" >> "$REPORT"; echo "would run: $*"; return; fi
  echo "gpu-check: $title" >&2
  "$@" > "$log" 2>&1
  local code=$?
  [ "$code" = 0 ] || failed=1
  { echo "exit code: $code"; echo; echo '```'; tail -n 60 "$log"; echo '```'; } >> "$REPORT"
}

step "gpu-marked tests" "$PY" -m pytest -q -m gpu --run-slow tests --ignore=tests/megatron
if [ "$DRY" = 1 ] || "$PY" -c "import megatron.core" 2>/dev/null; then
  step "Megatron GPU tests" "$PY" -m pytest -q -m gpu --run-slow tests/megatron
else
  { echo; echo "## Megatron GPU tests"; echo; echo "skipped: megatron-core is not installed (TELESCOPE_EXTRAS=megatron)"; } >> "$REPORT"
fi
step "trainer benchmark (MFU)" "$PY" bench/trainer.py --gpu
step "inference benchmark" "$PY" bench/inference.py
step "weight-sync benchmark" "$PY" bench/weight_sync.py
step "GPU weight sync and verification cost" "$PY" bench/gpu_sync.py
if [ "$DRY" = 1 ] || "$PY" -c "import vllm" 2>/dev/null; then
  step "vLLM smoke (serve, complete, verified sync)" "$PY" bench/vllm_smoke.py
else
  { echo; echo "## vLLM smoke (serve, complete, verified sync)"; echo; echo "skipped: vLLM is not installed (TELESCOPE_EXTRAS=vllm)"; } >> "$REPORT"
fi
rm -rf "$LOGDIR"
echo "gpu-check: report written to $REPORT" >&2
exit "$failed"
