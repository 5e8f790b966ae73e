# Two commands do all the setup on a machine with only Python and pip:
#   make dev   - install into .venv if needed, then the demo on the embedded stack
#   make test  - install into .venv if needed, then lint, types and tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install dev test lint types pytest reliability-report bad-input-report clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

dev: $(STAMP)
	$(VENV)/bin/safetynet dev

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint Dockerfile

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
