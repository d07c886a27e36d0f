# The two commands of the README: `make quickstart` and `make test`. Both set up .venv first.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: bootstrap quickstart test lint typecheck test-slow

bootstrap:
	@bash scripts/bootstrap.sh

quickstart: bootstrap
	$(BIN)/telescope train examples/quickstart.yaml

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: bootstrap
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest -q

test-slow: bootstrap
	TELESCOPE_RUN_SLOW=1 $(BIN)/python -m pytest -q -m slow
