# Two commands do all the setup on a machine with only Python and pip:
#   make dev   - install into .venv if needed, then the demo on the embedded stack
#   make test  - install into .venv if needed, then lint, types and tests
# The install is locked: every package (runtime, dev and the build backend) at the version
# and hashes of requirements/dev.lock, then the project itself without dependencies.
# After changing dependencies in pyproject.toml: `make lock`, and commit both lock files.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LOCK := requirements/dev.lock
RUNTIME_LOCK := requirements/runtime.lock
# universal (every platform's markers), for Python >= 3.11, hashes of every file;
# LOCK_ARGS=--upgrade (or --upgrade-package NAME) moves pinned versions on
LOCK_ARGS ?=
COMPILE := $(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 \
	--generate-hashes $(LOCK_ARGS) pyproject.toml requirements/build.in

.PHONY: install lock dev test lint types pytest reliability-report bad-input-report clean

$(STAMP): $(LOCK) pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

install: $(STAMP)

# Regenerate both locks from pyproject.toml: pinned versions are kept while pyproject
# allows them, new dependencies are resolved. The runtime lock (the Docker image's) is
# constrained to the dev lock's versions, so both install the same runtime.
lock: $(STAMP)
	$(COMPILE) --extra dev -o $(LOCK)
	$(COMPILE) -c $(LOCK) -o $(RUNTIME_LOCK)

dev: $(STAMP)
	$(VENV)/bin/safetynet dev

# squawk (the PostgreSQL migration linter) reads every step `safetynet migrate` can run, as
# --print-sql shows it: each migration with its lock_timeout, each CONCURRENTLY index build,
# the trigger's DDL. Findings accepted in already-applied migrations are listed, each with
# why, in supervision/migrate.py (LINT_EXCEPTIONS).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint Dockerfile
	rm -rf build/squawk
	$(PY) -m supervision.migrate build/squawk
	$(VENV)/bin/squawk build/squawk/*.sql

types: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PY) -m pytest

test: lint types pytest

# The chaos suite, then its figures published to docs/reliability.md (on purpose only:
# a test run writes its figures under build/ and leaves the tree clean).
reliability-report: $(STAMP)
	$(PY) -m pytest -m chaos tests/chaos
	$(PY) -m tests.chaos.report

# The bad-input suite, then its table published to docs/bad-input.md (same rule: a test
# run writes under build/ only).
bad-input-report: $(STAMP)
	$(PY) -m pytest -m badinput tests/badinput
	$(PY) -m tests.badinput.report

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache
