# Switchboard. `make run` starts the console; `make test` runs every check CI runs.
# The Makefile only prepares .venv; `manage.py serve` does the real work.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# mypy's Django plugin imports the settings. A placeholder DATABASE_URL keeps that from starting
# the embedded PostgreSQL, which mypy would never release (it exits without running atexit hooks).
MYPY := DATABASE_URL=postgresql://typecheck@localhost/typecheck $(VENV)/bin/mypy
# deptry: the runtime code's imports against requirements.txt (configured in pyproject.toml), then
# the dev-only code (tests/, bench/) against requirements-dev.txt, where unused pins are tools.
DEPTRY := $(VENV)/bin/deptry
DEPTRY_DEV := $(DEPTRY) tests bench --requirements-files requirements-dev.txt --exclude '.*/\.venv|.*/node_modules' --ignore DEP002
# `make run PORT=8001` wins; else SWITCHBOARD_PORT; else 8000. (A stray PORT in the environment is ignored.)
ifneq ($(origin PORT),command line)
PORT := $(or $(SWITCHBOARD_PORT),8000)
endif

# pytest-xdist workers for `make test` (each with its own test database and Valkey;
# tests/conftest.py says how files are shared out): two, one per core of the CI machine.
# TEST_WORKERS=0 runs the suite in one process (1,180 to 1,400 s of pytest against 750 to 860 s
# on two cores of a fast host, in fresh-clone runs; 1,150 to 1,570 s on a slow one). Three on two
# cores ran no faster (1,158 s against 978 to 1,153 s for two, one host, 2026-12-07): the suite
# keeps both cores busy, Chromium most of all.
TEST_WORKERS ?= 2

.PHONY: help run test bench lint fmt clean-data

help:
	@echo "make run [PORT=8000]  start Switchboard (embedded PostgreSQL and Valkey unless DATABASE_URL / REDIS_URL are set)"
	@echo "make test             make lint, then pytest on two processes, as CI runs them (TEST_WORKERS=0: on one)"
	@echo "make bench            run the benchmarks (threads and processes, medians of repeats); results go to bench/results/"
	@echo "                       BENCH_ARGS='--only admission --points 8,32 --repeats 20' picks benches, points, modes"
	@echo "make lint             ruff check, ruff format --check, mypy, deptry (every import pinned), the import contract"
	@echo "make fmt              fix what ruff can fix and format the code"
	@echo "make clean-data       delete .data/ (the embedded database and broker) after make run has stopped"

# The virtualenv, made with python3 (3.11 or newer).
$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null || { \
		echo "Switchboard needs Python 3.11 or newer, but '$(PYTHON)' is: $$($(PYTHON) --version 2>&1)." >&2; \
		echo "Install Python 3.11+ or run: make $(MAKECMDGOALS) PYTHON=/path/to/python3.11" >&2; \
		exit 1; }
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
		echo "Could not create $(VENV). On Debian or Ubuntu: apt-get install python3-venv" >&2; exit 1; }

# Installs run again only when the requirement files are newer than their stamps.
$(VENV)/.stamp-run: requirements.txt | $(PY)
	$(PIP) install -r requirements.txt
	@touch $@

$(VENV)/.stamp-dev: requirements-dev.txt requirements.txt | $(PY)
	$(PIP) install -r requirements-dev.txt
	@touch $@

run: $(VENV)/.stamp-run
	exec $(PY) manage.py serve --port $(PORT)

test: lint
	bash .ci/install-browser
	$(VENV)/bin/pytest -n $(TEST_WORKERS)

bench: $(VENV)/.stamp-dev
	$(PY) -m bench $(BENCH_ARGS)

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MYPY)
	$(DEPTRY) .
	$(DEPTRY_DEV)
	$(VENV)/bin/lint-imports

fmt: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean-data:
	@if [ -f .data/pg/postmaster.pid ] && kill -0 "$$(head -n 1 .data/pg/postmaster.pid)" 2>/dev/null; then \
		echo "The embedded PostgreSQL in .data/ is running; stop make run (and other manage.py commands) first." >&2; \
		exit 1; fi
	rm -rf .data
