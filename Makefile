# Set-up is part of every target: a fresh clone needs only `make run` or `make test`.
# They install exactly the packages of requirements.lock (every package pinned, hashes checked; made
# by pip-tools from pyproject.toml, refreshed by `make lock`), torch's CPU build included.
PYTHON ?= python3
VENV ?= .venv
LOCK := requirements.lock
# the torch the lock takes (pip finds the CPU build on this machine's disk, elsewhere add
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu); `make lock` and `make test-latest` hold it
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LATEST := .venv-latest
LOCKER := .venv-lock

.PHONY: run test test-slow test-latest lock lint bench bench-quality install clean

# a changed lock rebuilds the environment from scratch, so nothing outside the lock stays installed
$(STAMP): $(LOCK) pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/fixedhead compare $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(ARGS)

# ruff (version pinned in the dev extras; rules in pyproject.toml). .ci/run runs it before the tests.
LINT_PATHS := src tests benchmarks examples

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_training_step.py $(ARGS)

# tokens to quality: pretraining recipes side by side (8-25 minutes per row on one CPU thread; rows run in parallel with --rows)
bench-quality: $(STAMP)
	$(BIN)/python benchmarks/bench_tokens_to_quality.py $(ARGS)

# the newest releases pyproject.toml allows (torch held at TORCH_SPEC), in an environment of their own
test-latest:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	echo "$(TORCH_SPEC)" > $(LATEST)/constraints.txt
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -c $(LATEST)/constraints.txt -e ".[dev]"
	$(LATEST)/bin/python -m pip list --format=freeze | grep -i -E '^(torch|transformers|tokenizers|accelerate|datasets|huggingface.hub|kernels|numpy)=='
	$(LATEST)/bin/python -m pytest -q $(ARGS)

# refresh the lock: the newest releases pyproject.toml allows (torch held at TORCH_SPEC); then
# `make test` installs them. tests/test_environment.py asks the lower bounds to follow.
lock:
	test -x $(LOCKER)/bin/pip-compile || ($(PYTHON) -m venv $(LOCKER) && $(LOCKER)/bin/python -m pip install -q pip-tools==7.7.0)
	echo "$(TORCH_SPEC)" > $(LOCKER)/constraints.txt
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCKER)/bin/pip-compile -q --upgrade --generate-hashes --allow-unsafe \
		--extra dev --strip-extras --no-emit-index-url --no-emit-find-links \
		-c $(LOCKER)/constraints.txt $(LOCK_ARGS) -o $(LOCK) pyproject.toml

clean:
	rm -rf $(VENV) $(LATEST) $(LOCKER) build src/*.egg-info .pytest_cache
