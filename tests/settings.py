"""Settings for the test suite: SQLite by default, PostgreSQL when DATABASE_URL is set."""

import json
import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "agentloop-tests"
# A server started by a test may run with DEBUG on (the static files of docs/install.md's asgi.py).
DEBUG = os.environ.get("AGENTLOOP_TEST_DEBUG") == "1"
ALLOWED_HOSTS = ["testserver", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "agentloop",
    "example_project",  # the demo agents and tools that tests drive
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Django 6's tasks framework with a database backend (django-tasks-db), for the django.tasks
# runner's tests; a worker subprocess is pointed at it with AGENTLOOP_TEST_TASKS=database.
try:
    import django_tasks_db  # noqa: F401

    INSTALLED_APPS.append("django_tasks_db")
except ImportError:
    pass
if os.environ.get("AGENTLOOP_TEST_TASKS") == "database":
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Test databases are real files or servers, never in-memory: tests start subprocesses (workers,
# a second writer) that must open the very database the test process created.
# One test database per pytest process, so runs side by side don't share (and break) one.
_RUN = os.environ.get("AGENTLOOP_TEST_RUN") or str(os.getpid())

DATABASES: dict[str, dict[str, Any]]
if os.environ.get("DATABASE_URL"):
    import dj_database_url

    DATABASES = {"default": dict(dj_database_url.parse(os.environ["DATABASE_URL"]))}
    DATABASES["default"]["TEST"] = {"NAME": f"test_agentloop_{_RUN}"}
    # A commit doesn't wait for its WAL to reach the disk: the test databases are thrown away,
    # and a killed process (the fault tests kill clients, never the server) loses nothing.
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c synchronous_commit=off"
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(BASE_DIR / ".pytest_db.sqlite3"),
            # Several processes write at once: take the write lock up front and wait for it. A
            # commit leaves its writes to the operating system without waiting for the disk: a
            # killed process loses nothing of them (only the machine's crash would).
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA synchronous=OFF",
            },
            "TEST": {"NAME": str(BASE_DIR / f".test_db_{_RUN}.sqlite3")},
        }
    }

# Subprocesses started by tests set this to the test database's NAME (path or database name)
# so they connect to the database the parent already created instead of the non-test one.
if os.environ.get("AGENTLOOP_TEST_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["AGENTLOOP_TEST_DB_NAME"]

# Django's connection pool (PostgreSQL), as a JSON dict of psycopg_pool options, and a name
# for the connections of a worker started by a test (to find its backends in
# pg_stat_activity): set by the tests of chats in flight for the workers they start.
if "postgresql" in DATABASES["default"]["ENGINE"]:
    if os.environ.get("AGENTLOOP_TEST_DB_POOL"):
        pool = json.loads(os.environ["AGENTLOOP_TEST_DB_POOL"])
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = pool
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool keeps them instead
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # the pool checks at check-out
    if os.environ.get("AGENTLOOP_TEST_DB_APPLICATION"):
        application = os.environ["AGENTLOOP_TEST_DB_APPLICATION"]
        DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = application

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user fixtures

TIME_ZONE = "UTC"
USE_TZ = True
STATIC_URL = "static/"
LOGIN_URL = "/admin/login/"

# Fast polling keeps cancellation tests short. "rules:<anything>" answers deterministically
# in any process (tests/worker_provider.py), e.g. in a Celery worker started by a test.
AGENTLOOP: dict[str, Any] = {
    "CANCEL_POLL_INTERVAL": 0.05,
    "PROVIDERS": {
        "rules": {"class": "tests.worker_provider.RuleProvider"},
        # The same answers, each token (input or output) at $0.001: the budget tests' model.
        "priced": {"class": "tests.worker_provider.RuleProvider", "price_per_token": "0.001"},
        # docs/install.md's "Check it" model, as that page sets it (tests/test_install.py
        # asserts the two are the same), so the page's shell example runs in the docs test.
        "offline": {
            "class": "agentloop.testing.OfflineProvider",
            "reply": "Heard: {message}",
            "rules": [
                {
                    "match": r"(?P<a>\d+) plus (?P<b>\d+)",
                    "tool": "add",
                    "arguments": {"a": "{a}", "b": "{b}"},
                    "answer": "{a} + {b} = {result}.",
                },
            ],
        },
    },
}
# A subprocess started by a test (a Celery worker) takes more AGENTLOOP settings as JSON,
# e.g. a short LEASE_SECONDS or the REDIS_URL of the test run.
if os.environ.get("AGENTLOOP_TEST_SETTINGS"):
    AGENTLOOP.update(json.loads(os.environ["AGENTLOOP_TEST_SETTINGS"]))
