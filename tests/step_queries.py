"""How many SQL statements a step sends (tests/test_query_counts.py's docstring counts them
out): on PostgreSQL a step's write is one statement, on SQLite a transaction of several.
Read by the tests that hold a path to the same cost (tests/test_cancellation.py)."""

from __future__ import annotations

from django.db import connection

#: PostgreSQL writes a step with one data-modifying CTE; SQLite has none.
ONE_STATEMENT_WRITES = connection.vendor == "postgresql"
GENERATE_TEXT_QUERIES = 5 if ONE_STATEMENT_WRITES else 7
GENERATE_TOOL_CALLS_QUERIES = 5 if ONE_STATEMENT_WRITES else 8
RUN_TOOLS_QUERIES = 10 if ONE_STATEMENT_WRITES else 14
