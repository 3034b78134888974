# The two set-up commands of the README: `make demo` and `make test`.
# Both create (or update) .venv and install the project into it first; `make test`
# also installs the programs the suite runs (scripts/test-deps.txt), root or
# passwordless sudo permitting: elsewhere the tests that need them skip and say what
# to install. TEST_DEPS=--required makes a missing program an error (CI: .ci/run).
PYTHON    ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
TEST_DEPS ?=

.PHONY: demo test test-deps lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[tensorflow,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/adaptd demo

# Quick when everything is there: a `command -v` per program, no apt-get.
test-deps:
	@bash scripts/install-test-deps.sh $(TEST_DEPS)

test: $(STAMP) test-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# save_storm takes 2-4 minutes and needs root or FUSE permissions (scripts/slowfs.py);
# fleet_storm (8 daemons + 8 TF jobs, etcd) about 8 minutes, and etcd (scripts/install-test-deps.sh).
bench: $(STAMP)
	$(BIN)/python benchmarks/hook_cost.py
	$(BIN)/python benchmarks/save_stall.py
	$(BIN)/python benchmarks/save_storm.py
	$(BIN)/python benchmarks/fleet_storm.py --hosts 8 --saves 2 --bandwidth-mib-s 16

# Mutation score of the pure core (docs/testing.md): over an hour on 2 cores, not part of
# `make test`. AREAS="model policies" runs some areas; MUTANTS_ARGS="--survivors" re-tests survivors.
.PHONY: mutants
mutants: $(STAMP)
	nice -n 19 $(BIN)/python scripts/mutants.py $(MUTANTS_ARGS) $(AREAS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
