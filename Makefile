# The two set-up commands of the README: `make demo` and `make test`.
# Each creates (or updates) .venv and installs into it what it runs, and no more:
# `make demo` the project with TensorFlow (what `adaptd demo` imports), `make test` the
# test toolchain too (the dev extra: pytest, moto, atheris, ruff, mutmut ...), JAX and
# Orbax (the jax extra: tests/orbax run real JAX jobs on CPU) and the programs the suite runs (scripts/test-deps.txt), root or passwordless sudo permitting:
# elsewhere the tests that need them skip and say what to install. Each install has its
# own stamp; the test install is a superset of the demo's, so it stamps both.
# TEST_DEPS=--required makes a missing program an error (CI: .ci/run).
PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
TEST_DEPS  ?=
# The suite runs in PYTEST_WORKERS pytest-xdist processes (docs/testing.md): its slow
# tests mostly wait (etcd leases, throttled mounts, daemons draining), which the other
# processes overlap with the TensorFlow tests' CPU; each runs whole modules (--dist
# loadscope: a module's fixtures start once). Three on the 2-core box: the suite in
# 558-567 s (make test 9:31-9:38, three fresh clones in a row green, 2026-12-08) against
# 667-676 s for two and 1,216 s for one, once the load-sensitive deadlines that failed
# under three were made to hold (docs/testing.md). PYTEST_WORKERS=2 runs two;
# PYTEST_WORKERS= (empty): one.
PYTEST_WORKERS ?= 3
XDIST := $(if $(PYTEST_WORKERS),-n $(PYTEST_WORKERS) --dist loadscope)
# setuptools tells every editable install of a package-dir layout that folders named like
# the package may shadow it ("Editable installation.", an InformationOnly notice, not a
# problem of the metadata); only that notice is filtered, every other warning shows.
# The installs compile no bytecode (uv's --compile-bytecode took 21 of a test install's
# 25 s, for 14,600 files the suite mostly never imports): the programs make runs write
# it on first import instead, so PYTHONDONTWRITEBYTECODE (set in many containers, this
# project's VM) is not passed on to them. With it, nothing would ever cache TensorFlow's
# bytecode, and every process of the suite compiled its 1,847 modules again: make test
# took 15:52 instead of 14:02-15:05 (pip --no-compile, 2026-12-05).
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install --quiet
# The project's installs go through uv (pip-installed into the venv first: one wheel, 2 s),
# which resolves, downloads and unpacks in parallel: the test install on a fresh clone
# took 30 s with uv (its bytecode compiled) against 125 s with pip (2026-12-07, the same
# versions of the 141 packages; docs/testing.md), 4 s without the bytecode. uv reads no
# pip.conf: its index is $$UV_DEFAULT_INDEX, else $$PIP_INDEX_URL, else PyPI. Where uv
# cannot be installed, or its install fails (no route to its index), pip does it.
# What a stamp installs is its target's SPEC.
INSTALL = if [ -x $(BIN)/uv ]; then \
	  UV_DEFAULT_INDEX="$${UV_DEFAULT_INDEX:-$${PIP_INDEX_URL:-https://pypi.org/simple}}" \
	  $(BIN)/uv pip install --quiet --python $(BIN)/python $(SPEC) \
	  || { echo "uv could not install $(SPEC): pip installs it instead" >&2; $(PIP_FALLBACK); }; \
	else $(PIP_FALLBACK); fi
PIP_FALLBACK = $(PIP_INSTALL) --upgrade pip && $(PIP_INSTALL) --no-compile $(SPEC)

.PHONY: demo test test-deps lint bench clean venv

# What the helper sessions and `make lint`/`bench`/`mutants` use: the full (test) install.
venv: $(TEST_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) uv || echo "uv not installed: pip installs the project (slower)" >&2

$(DEMO_STAMP): SPEC = -e '.[tensorflow]'
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(INSTALL)
	touch $@

$(TEST_STAMP): SPEC = -e '.[tensorflow,jax,dev]'
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(INSTALL)
	touch $@ $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/adaptd demo

# Quick when everything is there: a `command -v` per program, no apt-get.
test-deps:
	@bash scripts/install-test-deps.sh $(TEST_DEPS)

# --durations=25: every run's log (CI's too) names the 25 slowest tests, where the
# suite's time goes. scripts/layers.py: lint-imports on the installed layout, the floors of
# docs/architecture.md as the contracts of pyproject.toml ([tool.importlinter]).
test: $(TEST_STAMP) test-deps
	$(BIN)/ruff check .
	$(BIN)/python scripts/layers.py
	$(BIN)/python -m pytest --durations=25 $(XDIST) $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/layers.py

# save_storm takes 2-4 minutes and needs root or FUSE permissions (scripts/slowfs.py);
# fleet_storm (8 daemons + 8 TF jobs, etcd) about 8 minutes, and etcd (scripts/install-test-deps.sh).
bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/hook_cost.py
	$(BIN)/python benchmarks/save_stall.py
	$(BIN)/python benchmarks/save_storm.py
	$(BIN)/python benchmarks/fleet_storm.py --hosts 8 --saves 2 --bandwidth-mib-s 16

# Mutation score of the pure core (docs/testing.md): over an hour on 2 cores, not part of
# `make test`. AREAS="model policies" runs some areas; MUTANTS_ARGS="--survivors" re-tests survivors.
.PHONY: mutants
mutants: $(TEST_STAMP)
	nice -n 19 $(BIN)/python scripts/mutants.py $(MUTANTS_ARGS) $(AREAS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
