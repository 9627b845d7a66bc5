# Thin wrappers: each target is one line of real work; the tools are configured in pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/agentloop
PORT ?= 8000
# pytest processes per database run (pytest-xdist; a test module stays in one process, so its
# workers and fixtures are started once): tests/README.md has the figures behind the number.
TEST_PROCESSES ?= 3
# Which tests each database runs: all, or db (only the tests that use a database; the others
# don't depend on it). CI runs all on one database and db on the other, per Python.
SQLITE_TESTS ?= all
POSTGRES_TESTS ?= all
# LINT= leaves ruff and mypy out (CI lints once, in one of its two Pythons' runs).
LINT ?= lint
# TEST_REPORTS=folder: each run writes its JUnit XML there (python scripts/test_times.py reads them).
TEST_REPORTS ?=
PYTEST = $(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile $(if $(filter db,$(1)),-m database) \
	$(if $(TEST_REPORTS),--junitxml=$(TEST_REPORTS)/$(2).xml)
QUICK = not subprocess and not worker and not browser and not install

# Each run's lines are prefixed with its database; either failing fails the recipe.
SHELL := bash
.SHELLFLAGS := -o pipefail -ec

.PHONY: venv demo lint test test-sqlite test-postgres test-quick bench clean docs docs-build

venv: $(VENV)/.installed

# The stamp makes `make test` skip pip until pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e ".[dev,postgres,celery]"
	touch $@

# demo_site checks the port, migrates, runs the offline agent demo (prints its transcript) as
# the user demo, prints the links and the login, then serves the example site with its
# in-process worker; Ctrl-C stops it. `make demo PORT=8001` serves on another port.
demo: venv
	$(BIN)/python manage.py demo_site --port $(PORT)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy agentloop

# The linters and the whole suite on SQLite and, side by side, on PostgreSQL: always under
# CI=true (where an unreachable server must fail the run, not skip it), otherwise when it answers.
test: venv
	$(MAKE) --no-print-directory -j3 $(LINT) test-sqlite test-postgres

# DATABASE_URL emptied so an exported one can't redirect the SQLite run.
test-sqlite: venv
	DATABASE_URL= $(call PYTEST,$(SQLITE_TESTS),sqlite) 2>&1 | sed -u 's/^/[sqlite] /'

test-postgres: venv
	if [ "$${CI:-}" = true ] || bash scripts/services.sh check-postgres; then \
		DATABASE_URL=$(PG_URL) $(call PYTEST,$(POSTGRES_TESTS),postgres) 2>&1 | sed -u 's/^/[postgres] /'; \
	else echo "SKIPPED: PostgreSQL run (start it with: bash scripts/services.sh start)"; fi

# The edit-test loop: no worker, browser or other process; SQLite; no lint.
test-quick: venv
	DATABASE_URL= $(BIN)/pytest -n $(TEST_PROCESSES) -q -m "$(QUICK)"

# The documentation site (mkdocs.yml) at http://127.0.0.1:8001/ (DOCS_PORT=8002: another port),
# rebuilt when a page or a docstring changes; docs-build writes it to site/ strictly (a broken
# link or a missing reference fails it), as tests/test_docs_site.py does.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --watch agentloop --dev-addr 127.0.0.1:$(or $(DOCS_PORT),8001)

docs-build: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: venv
	$(BIN)/python bench/step_overhead.py && $(BIN)/python bench/job_path.py

# Keeps virtualenvs (slow to rebuild) and bench results (they are kept figures).
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .test_db* .pytest_db* db.sqlite3
	find . -path './.venv*' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
