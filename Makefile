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

.PHONY: install lock dev test lint types pytest audit deploy-check reliability-report \
	bad-input-report console-screenshots clean

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

# The Kubernetes release deploy/kubernetes/ is validated against (kubernetes-validate
# ships its schemas: no network). tests/unit/house/test_deploy.py pins the same one.
KUBERNETES_VERSION := 1.32.0

# squawk (the PostgreSQL migration linter) reads every step `safetynet migrate` can run, as
# --print-sql shows it: each migration with its lock_timeout, each CONCURRENTLY index build,
# the trigger's DDL. Findings accepted in already-applied migrations are listed, each with
# why, in supervision/db/migrate.py (LINT_EXCEPTIONS).
lint: $(STAMP) deploy-check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint Dockerfile
	rm -rf build/squawk
	$(PY) -m supervision.db.migrate build/squawk
	$(VENV)/bin/squawk build/squawk/*.sql

# deploy/kubernetes: built-in kinds strictly against the pinned release (the two
# Prometheus Operator CRDs are checked against our schemas of them by
# tests/unit/house/test_deploy.py), and the PrometheusRule regenerated from the alert rules.
deploy-check: $(STAMP)
	$(VENV)/bin/kubernetes-validate --strict --quiet -k $(KUBERNETES_VERSION) deploy/kubernetes/*.yaml
	$(PY) deploy/kubernetes/generate_prometheusrule.py --check

types: $(STAMP)
	$(VENV)/bin/mypy

# pytest-xdist: PYTEST_WORKERS processes (4: six were faster but failed timing-bound tests
# when the machine was slow; docs/testing.md), each
# with servers of its own (PostgreSQL, Tansu, SeaweedFS, started lazily per worker); the
# modules that build something expensive once (a wheel, a TLS broker) keep their tests on
# one worker (tests/conftest.py, SHARE_A_WORKER). PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 4
PYTEST_ARGS ?=
# the chaos soak runs 30 s here at the full rates (rows scale with it); 60 s
# for the published figures (reliability-report, which runs the test's default)
SOAK_SECONDS ?= 30
# The project is installed editable, so its modules are compiled by whoever imports them;
# where PYTHONDONTWRITEBYTECODE is set nothing is cached and each of the suite's ~800
# Python processes would compile ~110 modules again (0.1-0.15 s of CPU each):
# compileall writes the caches first (only what changed since the last run). pytest
# itself runs with bytecode writing on: its assertion rewriting of the ~120 test modules
# is cached beside them then, which halves each worker's collection (5.9 s -> 2.6 s of
# CPU) from the second run of a checkout on.
pytest: $(STAMP)
	$(PY) -m compileall -q -j 0 supervision actors tests bench
	PYTHONDONTWRITEBYTECODE= SAFETYNET_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# lint and types run while pytest does (its workers mostly wait on servers); make waits
# for all three and fails when any of them failed.
test: $(STAMP)
	$(MAKE) --no-print-directory -j3 lint types pytest

# Known vulnerabilities of both locks (pip-audit --strict; not part of `make test`: it
# needs a vulnerability source). Where none answers it says so and fails (exit 2).
# AUDIT_SERVICE=osv asks OSV instead of PyPI.
AUDIT_SERVICE ?= pypi
audit: $(STAMP)
	$(PY) tools/audit_locks.py --service $(AUDIT_SERVICE) $(LOCK) $(RUNTIME_LOCK)

# The chaos suite, then its figures published to docs/reliability.md (on purpose only:
# a test run writes its figures under build/ and leaves the tree clean).
reliability-report: $(STAMP)
	rm -rf build/reliability  # this run's figures only: none of a scenario since renamed
	$(PY) -m pytest -m chaos tests/chaos
	$(PY) -m tests.chaos.report

# The bad-input suite, then its table published to docs/bad-input.md (same rule: a test
# run writes under build/ only).
bad-input-report: $(STAMP)
	$(PY) -m pytest -m badinput tests/badinput
	$(PY) -m tests.badinput.report

# The console's browser tests, then their screenshots published to docs/console/ (on
# purpose only: a test run writes them under build/console/ and leaves the tree clean).
console-screenshots: $(STAMP)
	$(PY) -m pytest tests/integration/app/console/test_console_browser.py \
		tests/integration/app/console/test_incident_browser.py
	mkdir -p docs/console
	cp build/console/*.png docs/console/

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache
