# One entry point for everything: `make run` (the main job) and `make check` (all checks).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run check lint test bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

## run: load the spec's test data into pagedkv.duckdb and print the resolved addresses
run: $(STAMP)
	@$(BIN)/pagedkv-sql load data/ && $(BIN)/pagedkv-sql resolve

## check: lint, format check, type check, then the whole test suite
check: lint test

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP)
	$(BIN)/pytest -n 2

## bench: the benchmark suite (not part of check); SIZES=1000000,10000000
bench: $(STAMP)
	$(BIN)/python bench/run.py $(if $(SIZES),--sizes $(SIZES))

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
