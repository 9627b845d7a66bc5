# Thin wrappers: each target is one line of real work; the tools are configured in pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/agentloop
PORT ?= 8000

.PHONY: venv demo lint test bench clean

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

# SQLite always (DATABASE_URL emptied so an exported one can't redirect it); PostgreSQL when it
# answers, and always under CI=true, where an unreachable server must fail the run, not skip it.
test: lint
	DATABASE_URL= $(BIN)/pytest
	if [ "$${CI:-}" = true ] || bash scripts/services.sh check-postgres; then \
		DATABASE_URL=$(PG_URL) $(BIN)/pytest; \
	else echo "SKIPPED: PostgreSQL run (start it with: bash scripts/services.sh start)"; fi

bench: venv
	$(BIN)/python bench/step_overhead.py && $(BIN)/python bench/job_path.py

# Keeps virtualenvs (slow to rebuild) and bench results (they are kept figures).
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .test_db* .pytest_db* db.sqlite3
	find . -path './.venv*' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
