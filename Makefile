# Set-up is part of every target: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow lint bench bench-quality install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
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

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
