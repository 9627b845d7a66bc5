"""Django settings for the benchmarks: PostgreSQL from $BENCH_DATABASE_URL, DEBUG off.

DEBUG stays False: with it on, Django keeps every query in memory and the RSS figure grows.
"""

import json
import os
from typing import Any
from urllib.parse import unquote, urlsplit

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench"


def database_from_url(url: str) -> dict[str, Any]:
    """Django's DATABASES entry for a postgres:// URL."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"The benchmarks need PostgreSQL; got a {parts.scheme!r} URL")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SECRET_KEY = "agentloop-bench"
DEBUG = False
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "agentloop"]
if os.environ.get("BENCH_ADMIN"):  # bench/usage_charts.py: the admin's chart code imports it
    INSTALLED_APPS += ["django.contrib.admin", "django.contrib.sessions", "django.contrib.messages"]
DATABASES = {
    "default": database_from_url(os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
}
if os.environ.get("BENCH_PREPARE_THRESHOLD"):
    # psycopg prepares a server-bound statement after this many runs: agentloop's per-step
    # statements (docs/background.md, "Running at scale"); Django's own stay client-bound.
    DATABASES["default"]["OPTIONS"] = {
        "prepare_threshold": int(os.environ["BENCH_PREPARE_THRESHOLD"])
    }
if os.environ.get("BENCH_DB_POOL"):
    # Django's connection pool (psycopg_pool options as JSON): bench/in_flight.py, job_path.py.
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = json.loads(os.environ["BENCH_DB_POOL"])
    # The pool checks a connection as it hands it out (one round trip), unless "0".
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = os.environ.get("BENCH_DB_POOL_CHECKS") != "0"
if os.environ.get("BENCH_DB_APPLICATION"):
    # How pg_stat_activity names the connections of a worker started by a benchmark.
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ[
        "BENCH_DB_APPLICATION"
    ]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
AGENTLOOP: dict[str, Any] = {}
if os.environ.get("BENCH_PREPARED_STATEMENTS") == "0":
    AGENTLOOP["PREPARED_STATEMENTS"] = False  # docs/settings.md (on by default)
