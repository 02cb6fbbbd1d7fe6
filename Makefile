# Two commands on a fresh machine with only Python >= 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full lint typecheck docs check chaos bench bench-scale test-cluster clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,examples,web,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

# What CI runs (.ci/run): lint, format, types, the docs site, then every test, in 4 processes
# (most tests wait on servers and subprocesses; tests/conftest.py keeps shared stacks together).
PYTEST_PARALLEL ?= -n 4
test: lint typecheck docs
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The same with the full matrices (DT_TEST_FULL=1): the agent kill-and-resume and the
# cross-process trace run on every database, not on PostgreSQL alone.
test-full: lint typecheck docs
	DT_TEST_FULL=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

lint: $(STAMP)
	$(BIN)/ruff check durable_tasks tests examples
	$(BIN)/ruff format --check durable_tasks tests examples

typecheck: $(STAMP)
	$(BIN)/mypy

# The site with its API reference, into build/site; a warning fails it.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

check: test

chaos: $(STAMP)
	$(BIN)/python -m tests.chaos
	$(BIN)/python -m tests.chaos --database mysql

test-cluster: $(STAMP)
	$(BIN)/python -m tests.cluster.run_core

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

# How costs grow (history, payload size, tasks in flight, backlog) on the PostgreSQL of
# DT_BENCH_DATABASE_URL; SCALE_ARGS="--scale 0.01" for a quick run.
bench-scale: $(STAMP)
	$(BIN)/python -m benchmarks.bench_scale $(SCALE_ARGS)

clean:
	rm -rf $(VENV) .durable_tasks .pytest_cache .mypy_cache .ruff_cache build/site
